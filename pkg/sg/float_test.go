package sg

import (
	"encoding/json"
	"errors"
	"math"
	"net/netip"
	"strings"
	"testing"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

// TestFloatConfig: the float settings a group accepts and the errors it gives for the rest.
func TestFloatConfig(t *testing.T) {
	base := func() Config {
		return Config{Interface: "lo", Workers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9000")}, Elems: 4}
	}
	for _, c := range []struct {
		name     string
		mod      func(*Config)
		wantErr  string
		wantFrac int
		wantType uint8
		wantRed  uint8
	}{
		{"float64 sum default fraction bits", func(c *Config) { c.Type = Float64 }, "", DefaultFracBits, isg.TypeI64, isg.RedSum},
		{"float32 mean in int64 fixed point", func(c *Config) { c.Type, c.Reduction, c.FracBits = Float32, Mean, 10 }, "", 10, isg.TypeI64, isg.RedSum},
		{"float32 max as int32 keys", func(c *Config) { c.Type, c.Reduction = Float32, Max }, "", 0, isg.TypeI32, isg.RedMax},
		{"float64 min as int64 keys", func(c *Config) { c.Type, c.Reduction = Float64, Min }, "", 0, isg.TypeI64, isg.RedMin},
		{"float32 gather as the IEEE bits", func(c *Config) { c.Type, c.Reduction = Float32, Gather }, "", 0, isg.TypeI32, isg.RedGather},
		{"int32 mean", func(c *Config) { c.Type, c.Reduction = Int32, Mean }, "", 0, isg.TypeI32, isg.RedSum},
		{"fraction bits of an integer group", func(c *Config) { c.FracBits = 8 }, "fraction bits are for float32/float64 sum and mean only", 0, 0, 0},
		{"fraction bits of a float max", func(c *Config) { c.Type, c.Reduction, c.FracBits = Float64, Max, 8 }, "fraction bits are for", 0, 0, 0},
		{"too many fraction bits", func(c *Config) { c.Type, c.FracBits = Float64, 1023 }, "FracBits 1023, want 1..1022", 0, 0, 0},
		{"negative fraction bits", func(c *Config) { c.Type, c.FracBits = Float64, -3 }, "FracBits -3", 0, 0, 0},
		{"mean of multi-packet replies", func(c *Config) { c.Type, c.Reduction, c.MultiPacket = Float64, Mean, true }, "mean takes single-packet replies only", 0, 0, 0},
		{"unknown type", func(c *Config) { c.Type = Float64 + 1 }, "unknown element type", 0, 0, 0},
		{"unknown reduction", func(c *Config) { c.Reduction = User + 1 }, "unknown reduction", 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base()
			c.mod(&cfg)
			err := cfg.Validate()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.FracBits != c.wantFrac || cfg.kernelType() != c.wantType || cfg.Reduction.kernel() != c.wantRed {
				t.Fatalf("fraction bits %d, kernel type %d, reduction %d; want %d, %d, %d", cfg.FracBits, cfg.kernelType(), cfg.Reduction.kernel(), c.wantFrac, c.wantType, c.wantRed)
			}
		})
	}
	for _, s := range []string{"float32", "f32", "float64", "f64"} {
		if typ, err := ParseElemType(s); err != nil || !typ.IsFloat() {
			t.Errorf("ParseElemType(%q) = %v, %v", s, typ, err)
		}
	}
	if r, err := ParseReduction("mean"); err != nil || r != Mean {
		t.Errorf("ParseReduction(mean) = %v, %v", r, err)
	}
}

// TestFloatEncodingDecode: what a worker encodes with FloatEncoding, summed as the kernel
// sums it, is what a result's Floats report (a mean divided by the count).
func TestFloatEncodingDecode(t *testing.T) {
	cfg := Config{Type: Float64, Reduction: Mean, FracBits: 16}
	e, err := NewFloatEncoding(Mean, Float64, 16)
	if err != nil {
		t.Fatal(err)
	}
	acc := make([]int64, 2)
	for _, xs := range [][]float64{{1.5, -0.25}, {2.25, 1}, {-0.5, 3}} {
		b, err := e.Append(nil, xs)
		if err != nil {
			t.Fatal(err)
		}
		for j, v := range isg.DecodeVector(b, isg.TypeI64) {
			acc[j] += v
		}
	}
	if got := cfg.floats(acc, 3); got[0] != 3.25/3 || got[1] != 3.75/3 {
		t.Fatalf("means %v", got)
	}
	if _, err := e.Append(nil, []float64{math.Inf(1)}); !errors.Is(err, ErrNotFinite) {
		t.Errorf("+Inf in a mean: %v", err)
	}
	if _, err := e.Append(nil, []float64{1 << 50}); !errors.Is(err, ErrRange) {
		t.Errorf("2^50 with 16 fraction bits: %v", err)
	}
	if e.ElemSize() != 8 {
		t.Errorf("a mean's element travels in %d bytes", e.ElemSize())
	}
	if e32, _ := NewFloatEncoding(Max, Float32, 0); e32.ElemSize() != 4 {
		t.Errorf("a float32 max's element travels in %d bytes", e32.ElemSize())
	}
	if _, err := NewFloatEncoding(Sum, Int64, 0); err == nil {
		t.Error("a float encoding for int64 accepted")
	}
}

func TestFloatsJSON(t *testing.T) {
	in := Floats{1.5, math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 1e-300}
	b, err := json.Marshal(Result{Floats: in})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"floats":[1.5,"NaN","+Inf","-Inf",-0,1e-300]`) {
		t.Fatalf("JSON %s", b)
	}
	var out Result
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if math.Float64bits(out.Floats[i]) != math.Float64bits(in[i]) && !(math.IsNaN(in[i]) && math.IsNaN(out.Floats[i])) {
			t.Errorf("element %d: %g, want %g", i, out.Floats[i], in[i])
		}
	}
	if err := json.Unmarshal([]byte(`{"floats":["many"]}`), &out); err == nil {
		t.Error(`"many" accepted as a float`)
	}
}

// TestFloatConstants: the public fixed-point limits and errors are the data plane's.
func TestFloatConstants(t *testing.T) {
	if DefaultFracBits != isg.DefaultFracBits || MinFracBits != isg.MinFracBits || MaxFracBits != isg.MaxFracBits {
		t.Errorf("fraction bits default/min/max %d/%d/%d, the data plane's %d/%d/%d", DefaultFracBits, MinFracBits, MaxFracBits,
			isg.DefaultFracBits, isg.MinFracBits, isg.MaxFracBits)
	}
	if ErrNotFinite.Error() != isg.ErrNotFinite.Error() || ErrRange.Error() != isg.ErrRange.Error() {
		t.Errorf("errors %q, %q; the encoder's %q, %q", ErrNotFinite, ErrRange, isg.ErrNotFinite, isg.ErrRange)
	}
	e, _ := NewFloatEncoding(Sum, Float64, 8)
	if _, err := e.Append(nil, []float64{math.NaN()}); !errors.Is(err, ErrNotFinite) || !errors.Is(err, isg.ErrNotFinite) || err.Error() != "element 0: "+isg.ErrNotFinite.Error() {
		t.Errorf("NaN in a sum: %v", err)
	}
}
