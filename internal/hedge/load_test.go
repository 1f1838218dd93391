package hedge

import (
	"errors"
	"regexp"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
)

// TestLoadVerifies loads the hedger's programs and logs, for each, the instructions the
// verifier processed and the stack depth of each of its functions, as the kernel reports
// them (the figures to quote when the data path changes). hedge_rescue's call chains
// (hedge_rescue -> rescue_clone -> pick_for; hedge_rescue -> tick_one -> store_hedge ->
// pick_for) are the ones near the verifier's 512-byte limit on Linux 6.1 (each frame rounded
// up to 32), and its instruction count near the 1,000,000 limit there: run it in the guests
// (tools/vmtest) after a change to bpf/hedge. It checks that the programs load and that the
// kernel reports both figures.
func TestLoadVerifies(t *testing.T) {
	requireRoot(t)
	spec, err := loadHedge()
	if err != nil {
		t.Fatal(err)
	}
	var objs hedgeObjects
	opts := &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}}
	if err := bpfx.LoadAndAssign("hedge", spec, &objs, opts); err != nil {
		var le *bpfx.LoadError
		if errors.As(err, &le) {
			t.Log(le.Full())
		}
		t.Fatal(err)
	}
	defer objs.Close()
	processed := regexp.MustCompile(`processed (\d+) insns`)
	stack := regexp.MustCompile(`stack depth ([0-9+]+)`)
	for _, p := range []struct {
		name string
		prog *ebpf.Program
	}{{"hedge_split", objs.HedgeSplit}, {"hedge_rescue", objs.HedgeRescue}, {"hedge_resp", objs.HedgeResp}, {"hedge_arm", objs.HedgeArm}} {
		n := processed.FindStringSubmatch(p.prog.VerifierLog)
		s := stack.FindStringSubmatch(p.prog.VerifierLog)
		if n == nil || s == nil {
			t.Fatalf("%s: no instruction count or stack depth in the verifier log:\n%s", p.name, p.prog.VerifierLog)
		}
		t.Logf("%-13s %8s instructions verified, stack depth %s", p.name, n[1], s[1])
	}
}
