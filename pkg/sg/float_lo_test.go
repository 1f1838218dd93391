package sg

import (
	"context"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

// TestFloatReductions: real workers answering float32 and float64 vectors on loopback,
// one of eight dead (Need 7): sum, mean, min and max of what the seven sent, from the
// kernel's fixed-point sums and order keys.
func TestFloatReductions(t *testing.T) {
	const n, elems = 8, 3
	// Each reduction once, each type twice (a group per case: opening one is the cost).
	for _, c := range []struct {
		typ ElemType
		red Reduction
	}{{Float32, Sum}, {Float64, Mean}, {Float64, Min}, {Float32, Max}} {
		typ, red := c.typ, c.red
		t.Run(typ.String()+"/"+red.String(), func(t *testing.T) {
			g := loopbackGroup(t, n, 1, Config{Reduction: red, Type: typ, Elems: elems, Need: n - 1, Timeout: time.Second},
				isg.WorkerConfig{Type: uint8(typ), Elems: elems})
			for k := range 5 {
				res, err := g.Scatter(context.Background(), []byte{byte(k)})
				if err != nil {
					t.Fatal(err)
				}
				if res.Status != OK || res.Count != n-1 || res.Values != nil || len(res.Floats) != elems || res.Overflow {
					t.Fatalf("request %#x: %+v", res.ID, res)
				}
				for j := range elems {
					var sum float64
					lo, hi := math.Inf(1), math.Inf(-1)
					for _, w := range res.Answered {
						v := float64(isg.ValueFor(uint16(w), res.ID, j))
						sum, lo, hi = sum+v, min(lo, v), max(hi, v)
					}
					want := map[Reduction]float64{Sum: sum, Mean: sum / float64(n-1), Min: lo, Max: hi}[red]
					if res.Floats[j] != want {
						t.Errorf("request %#x element %d: %s %g, want %g", res.ID, j, red, res.Floats[j], want)
					}
				}
			}
		})
	}
}

// TestFloatConfig: mean needs a float type, float replies are single-packet, the
// fixed-point bits are bounded; the default is filled in.
func TestFloatConfig(t *testing.T) {
	base := Config{Interface: "lo", Workers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9000")}, Elems: 2}
	for _, c := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Reduction, c.Type = Mean, Int64 }, "mean needs a float type"},
		{func(c *Config) { c.Type, c.MultiPacket = Float64, true }, "single-packet"},
		{func(c *Config) { c.Type, c.FixedPointBits = Float32, 63 }, "fixed-point bits"},
		{func(c *Config) { c.Type = ElemType(9) }, "unknown element type"},
	} {
		cfg := base
		c.mod(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", cfg, err, c.want)
		}
	}
	cfg := base
	cfg.Type, cfg.Reduction = Float64, Mean
	if err := cfg.Validate(); err != nil || cfg.FixedPointBits != DefaultFixedPointBits {
		t.Errorf("float64 mean: %v, fixed-point bits %d", err, cfg.FixedPointBits)
	}
	for _, s := range []string{"float32", "float64", "f32", "f64"} {
		if typ, err := ParseElemType(s); err != nil || !typ.IsFloat() {
			t.Errorf("ParseElemType(%q) = %v, %v", s, typ, err)
		}
	}
	if r, err := ParseReduction("mean"); err != nil || r != Mean {
		t.Errorf("ParseReduction(mean) = %v, %v", r, err)
	}
}
