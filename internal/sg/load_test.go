package sg

import "testing"

func TestLoadTiers(t *testing.T) {
	for _, tier := range []Tier{TierLoop, TierBounded} {
		o, err := Load(LoadOptions{Tier: tier})
		if err != nil {
			t.Fatalf("%v: %+v", tier, err)
		}
		if err := o.InitTimers(); err != nil {
			t.Fatal(err)
		}
		o.Close()
	}
}
