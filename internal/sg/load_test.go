package sg

import (
	"errors"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

func TestLoadTiers(t *testing.T) {
	for _, tier := range []Tier{TierLoop, TierBounded} {
		o, err := Load(LoadOptions{Tier: tier})
		if err != nil {
			var le *bpfx.LoadError
			if errors.As(err, &le) {
				t.Log(le.Full())
			}
			t.Fatalf("%v: %+v", tier, err)
		}
		left, err := o.InitTimers()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%v: %d slots without a timer", tier, left)
		o.Close()
	}
}
