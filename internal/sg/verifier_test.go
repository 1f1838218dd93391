package sg

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestVerifierCost logs the instructions the verifier processed for each program of both
// tiers and the example user reduction (the figures commit messages and docs/sg.md quote when the data path changes; 5.10
// must still load them: tools/vmtest). It checks only that the kernel reports them.
func TestVerifierCost(t *testing.T) {
	bpftest.RequireRoot(t)
	for _, tier := range []Tier{TierLoop, TierBounded} {
		if tier == TierLoop && DetectTier() != TierLoop {
			continue
		}
		o, err := Load(LoadOptions{Tier: tier, Resend: tier == TierLoop})
		if err != nil {
			t.Fatalf("%v: load sg: %v", tier, err)
		}
		if err := o.LoadUserReduction(1, UserReduction{Object: topkObject}); err != nil {
			o.Close()
			t.Fatalf("%v: load the example user reduction: %v", tier, err)
		}
		progs := []struct {
			name string
			prog *ebpf.Program
		}{{"scatter", o.Scatter}, {"cont", o.Cont}, {"gather", o.Gather}, {"sweep", o.Sweep}, {"chunk", o.chunk}, {"resend", o.Resend}, {"user-topk", o.user[0]}}
		for _, p := range progs {
			if p.prog == nil {
				continue
			}
			info, err := p.prog.Info()
			if err != nil {
				o.Close()
				t.Fatalf("%v %s: program info: %v", tier, p.name, err)
			}
			n, ok := info.VerifiedInstructions()
			if !ok {
				o.Close()
				t.Skip("kernel does not report verified instructions")
			}
			t.Logf("%-20s %-8s %7d instructions verified", tier, p.name, n)
		}
		o.Close()
	}
}
