package sg

import "testing"

func TestLoadTiers(t *testing.T) {
	for _, tier := range []Tier{TierLoop, TierBounded} {
		o, err := Load(LoadOptions{Tier: tier})
		if err != nil {
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
