package ppingbench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

// TestRunShort runs one short round (off, on, on with statistics, XDP ingress with
// statistics): the figures exist and are plausible, and the result file round-trips.
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
	if len(res.Runs) != 4 || res.Runs[0].Monitor || !res.Runs[1].Monitor || res.Runs[1].Stats || !res.Runs[2].Stats ||
		res.Runs[2].IngressHook != "" || !res.Runs[3].Stats || res.Runs[3].IngressHook != "xdp" {
		t.Fatalf("runs %+v, want off, on, on with statistics, XDP with statistics", res.Runs)
	}
	if x := res.Runs[3]; x.Ingress == nil || x.Ingress.Runs == 0 || x.Ingress.NsPerPacket <= 0 || !strings.HasPrefix(res.XDPMode, "xdp-") {
		t.Errorf("XDP run without XDP ingress statistics: %+v, attached %q", x.Ingress, res.XDPMode)
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
	var back Result
	b, err := os.ReadFile(filepath.Join(o.OutDir, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil || back.Schema != Schema || len(back.Runs) != 4 {
		t.Errorf("result.json: %v, %+v", err, back)
	}
	var tab bytes.Buffer
	res.WriteTable(&tab)
	if !strings.Contains(tab.String(), "BPF run time per packet: ingress") || !strings.Contains(tab.String(), "XDP ingress (xdp-") {
		t.Errorf("table:\n%s", tab.String())
	}
	t.Logf("\n%s", tab.String())
}
