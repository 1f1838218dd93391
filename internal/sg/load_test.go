package sg

import (
	"errors"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// TestLoadTiers loads every tier this kernel supports: both where bpf_loop exists (5.17+),
// the bounded tier alone before.
func TestLoadTiers(t *testing.T) {
	tiers := []Tier{TierLoop, TierBounded}
	if DetectTier() == TierBounded {
		tiers = tiers[1:]
	}
	for _, tier := range tiers {
		o, err := Load(LoadOptions{Tier: tier})
		if err != nil {
			var le *bpfx.LoadError
			if errors.As(err, &le) {
				t.Log(le.Full())
			}
			t.Fatalf("%v: %+v", tier, err)
		}
		left, err := o.InitTimers(Slots)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%v: %d slots without a timer", tier, left)
		o.Close()
	}
}
