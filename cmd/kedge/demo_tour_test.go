package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// TestDemoTourShort runs make demo's new parts as the test suite's short form: 'kedge demo
// tour --short' (pping on a TCP flow, a scatter at fan-out 64, a 3-node raft failover) with
// the committed hedging result, and checks every row's result, the charts, summary.json
// and that nothing is left behind.
func TestDemoTourShort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a lab and loads BPF programs")
	}
	out := t.TempDir()
	before, _ := netnsx.List()
	cmd := exec.Command(bpftest.KedgeBinary(t), "demo", "tour", "--short", "--out", out,
		"--hedge-result", "../../docs/results/hedge/thesis/result.json")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kedge demo tour --short: %v\n%s", err, b)
	}
	text := string(b)
	for _, want := range []string{"== hedge:", "== pping:", "== sg:", "== raft:", "== summary", "nothing left behind",
		"requests answered by all 64 workers", "RTT samples", "leader kills recovered", "kernel-hedged"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "FAILED") {
		t.Errorf("a capability failed:\n%s", text)
	}
	var rows []tourRow
	if data, err := os.ReadFile(filepath.Join(out, "summary.json")); err != nil || json.Unmarshal(data, &rows) != nil || len(rows) != 4 {
		t.Fatalf("summary.json: %v, %d rows", err, len(rows))
	}
	for _, r := range rows {
		if !r.OK || r.Chart == "" {
			t.Errorf("row %+v: want ok with a chart", r)
			continue
		}
		if _, err := os.Stat(r.Chart); err != nil {
			t.Errorf("%s chart: %v", r.Capability, err)
		}
	}
	for _, f := range []string{"pping-rtt.svg", "sg-roundtrip.svg", "raft/failover.svg", "raft/result.json", "sg-scatter.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%v", err)
		}
	}
	after, _ := netnsx.List()
	for _, n := range after {
		if !slices.Contains(before, n) && strings.Contains(n, "-tour-") {
			t.Errorf("namespace %s left behind", n)
		}
	}
}
