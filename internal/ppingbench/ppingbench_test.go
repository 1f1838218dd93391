package ppingbench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

// TestRunShort runs one short round (off, on, on with statistics, the empty programs, XDP
// ingress with statistics, the empty XDP program, the stacked run): the figures exist and
// are plausible, and the result file round-trips.
func TestRunShort(t *testing.T) {
	bpftest.RequireRoot(t)
	for _, tool := range []string{"iperf3", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	o := DefaultOptions()
	o.Duration, o.Rounds, o.RateLimit, o.OutDir = time.Second, 1, 0, t.TempDir()
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 7 || res.Runs[0].Monitor || !res.Runs[1].Monitor || res.Runs[1].Stats || !res.Runs[2].Stats ||
		res.Runs[2].IngressHook != "" || res.Runs[2].Program != "" || res.Runs[3].Program != ProgramEmpty ||
		res.Runs[3].Monitor || res.Runs[3].IngressHook != "" || !res.Runs[4].Stats || res.Runs[4].IngressHook != "xdp" ||
		res.Runs[4].Program != "" || res.Runs[5].Program != ProgramEmpty || res.Runs[5].IngressHook != "xdp" ||
		res.Runs[6].Program != ProgramStack {
		t.Fatalf("runs %+v, want off, on, on with statistics, empty programs, XDP with statistics, empty XDP program, stacked", res.Runs)
	}
	// The stacked run: the four programs in order, each ran on every packet of both hooks
	// (they are on one hook's list), and the empty program back to back costs something.
	st := res.Runs[6]
	var names []string
	for _, c := range st.Stack {
		names = append(names, c.Program)
		if c.Ingress.Runs != st.Stack[0].Ingress.Runs || c.Egress.Runs != st.Stack[0].Egress.Runs || c.Ingress.Runs == 0 || c.Egress.Runs == 0 || c.Ingress.NsPerPacket <= 0 {
			t.Errorf("stacked program %s: %+v %+v, want the same packets as %s (%+v %+v)", c.Program, c.Ingress, c.Egress, st.Stack[0].Program, st.Stack[0].Ingress, st.Stack[0].Egress)
		}
	}
	if want := []string{StackEmptyFirst, StackMinimal, StackKedge, StackEmptyLast}; !slices.Equal(names, want) {
		t.Errorf("stacked programs %v, want %v", names, want)
	}
	if w := st.WarmEmpty; w == nil || w.StatsNs <= 0 || w.TestRunNsOp <= 0 {
		t.Errorf("empty program back to back: %+v", w)
	}
	for _, i := range []int{4, 5} {
		if x := res.Runs[i]; x.Ingress == nil || x.Ingress.Runs == 0 || x.Ingress.NsPerPacket <= 0 || !strings.HasPrefix(res.XDPMode, "xdp-") {
			t.Errorf("XDP run %d without XDP ingress statistics: %+v, attached %q", i, x.Ingress, res.XDPMode)
		}
	}
	// The floor: the empty programs ran on every packet of their run, at both hooks, and
	// cost something (the statistics time every run).
	if f := res.Summarize().Floor; f.IngressPackets == 0 || f.EgressPackets == 0 || f.XDPIngressPackets == 0 ||
		f.IngressNs <= 0 || f.EgressNs <= 0 || f.XDPIngressNs <= 0 {
		t.Errorf("floor %+v: empty programs without statistics", f)
	}
	// The second round puts the empty programs first.
	if got := roundRuns(o, 1); len(got) != 7 || !got[2].empty || got[3].empty || !got[4].empty || got[5].empty {
		t.Errorf("second round %+v: want the empty programs' runs before kedge's", got)
	}
	on := res.Runs[2]
	for _, r := range res.Runs {
		if r.PPS <= 0 || r.Gbps <= 0 {
			t.Errorf("run %+v forwarded nothing", r)
		}
	}
	if on.Ingress == nil || on.Ingress.Runs == 0 || on.Ingress.NsPerPacket <= 0 || on.Egress == nil || on.Egress.Runs == 0 {
		t.Errorf("monitored run without BPF statistics: %+v %+v", on.Ingress, on.Egress)
	}
	// Every identifier sampled (-r 0): TCP timestamps tick every millisecond.
	if on.Samples == 0 {
		t.Errorf("monitored run produced no RTT samples")
	}
	if on.Counters["egress"]["pkts"] == 0 || on.Counters["ingress"]["pkts"] == 0 {
		t.Errorf("monitored run without the monitor's counters: %v", on.Counters)
	}
	var back Result
	b, err := os.ReadFile(filepath.Join(o.OutDir, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(o.OutDir, "cost.svg")); err != nil {
		t.Errorf("floor chart: %v", err)
	}
	if err := json.Unmarshal(b, &back); err != nil || back.Schema != Schema || len(back.Runs) != 7 {
		t.Errorf("result.json: %v, %+v", err, back)
	}
	var tab bytes.Buffer
	res.WriteTable(&tab)
	if !strings.Contains(tab.String(), "BPF run time per packet: ingress") || !strings.Contains(tab.String(), "XDP ingress (xdp-") ||
		!strings.Contains(tab.String(), "empty reference programs (the floor)") || !strings.Contains(tab.String(), "stacked on the same packets") {
		t.Errorf("table:\n%s", tab.String())
	}
	t.Logf("\n%s", tab.String())
}

// TestPairs: each kedge run with statistics is paired with the empty programs' run of the
// same round and hook, whichever went first, and the rounds are counted from the runs
// without the monitor.
func TestPairs(t *testing.T) {
	cost := func(ns float64) *HookCost {
		return &HookCost{Runs: 1000, RunTimeNs: uint64(ns * 1000), NsPerPacket: ns}
	}
	stats := func(program, hook string, in, eg float64) RunResult {
		return RunResult{Monitor: program == "", Stats: true, Program: program, IngressHook: hook, Ingress: cost(in), Egress: cost(eg)}
	}
	off, on := RunResult{}, RunResult{Monitor: true}
	withCounters := func(r RunResult) RunResult {
		r.Counters = map[string]map[string]uint64{"egress": {"pkts": 1000, "match_none": 750, "match_miss": 250, "ts_retired": 7}}
		return r
	}
	r := &Result{Runs: []RunResult{
		off, on, stats("", "", 120, 220), stats(ProgramEmpty, "", 90, 150), stats("", "xdp", 110, 0), stats(ProgramEmpty, "xdp", 80, 0),
		off, on, stats(ProgramEmpty, "", 100, 160), withCounters(stats("", "", 130, 240)), stats(ProgramEmpty, "xdp", 85, 0), stats("", "xdp", 115, 0),
	}}
	want := []Pair{
		{1, HookTCIngress, false, 120, 90, -1, -1, 0, 0}, {1, HookTCEgress, false, 220, 150, -1, -1, 1, 1}, {1, HookXDPIngress, false, 110, 80, -1, -1, 0, 0},
		{2, HookTCIngress, true, 130, 100, -1, -1, 0, 0}, {2, HookTCEgress, true, 240, 160, 25, 7, 1, 1}, {2, HookXDPIngress, true, 115, 85, -1, -1, 0, 0},
	}
	got := r.Pairs()
	if len(got) != len(want) {
		t.Fatalf("pairs %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("pair %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	f := r.Summarize().Floor
	if f.IngressNs != 95 || f.EgressNs != 155 || f.XDPIngressNs != 82.5 {
		t.Errorf("floor %+v, want ingress 95, egress 155, XDP 82.5", f)
	}
	if s := r.Summarize(); s.IngressNs != 125 || s.EgressNs != 230 || s.XDPIngressNs != 112.5 {
		t.Errorf("kedge's figures %+v include the empty programs' runs", s)
	}
	if err := r.WriteFloorChart(filepath.Join(t.TempDir(), "cost")); err != nil {
		t.Error(err)
	}
	if (&Result{Runs: []RunResult{off, on, stats("", "", 1, 1)}}).Pairs() != nil {
		t.Error("a result without empty runs gave pairs")
	}
}
