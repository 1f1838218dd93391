package sg

// BPF_PROG_TEST_RUN fixtures for float reductions: sums against exact sums of random
// vectors (large and tiny magnitudes) within the stated bound, the fixed-point range's
// edge, exact min and max (signed zeros, subnormals), NaN and infinities rejected, and
// multi-packet float replies refused.

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// floatFixture is group 1 over w4 with the given reduction, float type and fraction bits.
func floatFixture(t *testing.T, red, typ uint8, elems uint16, fx uint8) (*fixture, bpftest.Runner) {
	t.Helper()
	f := newFixture(t, 1, coord4, w4, red, typ, elems, 0)
	var g GroupCfg
	if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	g.FxBits = fx
	if err := f.o.Groups.Put(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	return f, bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
}

// randFloat is a value of random sign whose magnitude is 10^U(lo, hi), rounded to t.
func randFloat(rng *rand.Rand, t uint8, lo, hi float64) float64 {
	v := math.Pow(10, lo+rng.Float64()*(hi-lo))
	if rng.IntN(2) == 0 {
		v = -v
	}
	if t == TypeF32 {
		v = float64(float32(v))
	}
	return v
}

// floatReply runs worker w's reply v to request id (of 3 replies needed): reduced, and
// the third completes the request.
func floatReply(t *testing.T, r bpftest.Runner, id uint64, typ uint8, w int, v []float64) {
	t.Helper()
	want := bpftest.Counters{"1.Replies": 1}
	if w == 2 {
		want["1.Completed"] = 1
	}
	r.Run(t, []bpftest.Case{{Name: "reply", In: reply(w4[w], coord4, 1, uint16(w), id, AppendFloats(nil, typ, v), nil),
		WantRet: bpftest.XDPDrop, WantCounters: want}})
}

// sumBound is the documented error bound of a float sum of n replies with fx fraction
// bits (docs/sg.md, "Float reductions"): each element rounds to the nearest multiple of
// 2^-fx (at most half of it off), and the int64 sum becomes the nearest float64 (half an
// ulp of the result off, at most 2^-53 of it).
func sumBound(n, fx int, sum float64) float64 {
	return float64(n)*math.Ldexp(1, -fx-1) + math.Abs(sum)*math.Ldexp(1, -53)
}

// TestGatherFloatSum: 3 workers' random vectors (magnitudes 1e-15 .. 1e8, both signs),
// float32 and float64, 12 and 32 fraction bits: every element of the kernel's sum within
// sumBound of the exact sum of what was sent; no overflow flagged.
func TestGatherFloatSum(t *testing.T) {
	const elems = 64
	for _, tc := range []struct {
		name string
		typ  uint8
		fx   uint8
	}{{"float64/fx32", TypeF64, 32}, {"float32/fx32", TypeF32, 32}, {"float64/fx12", TypeF64, 12}} {
		t.Run(tc.name, func(t *testing.T) {
			f, r := floatFixture(t, RedSum, tc.typ, elems, tc.fx)
			rng := rand.New(rand.NewPCG(1, uint64(tc.fx)))
			worst := 0.0
			for k := range 16 {
				id := uint64(k+1)<<10 | 65
				f.arm(t, 1, id, 3)
				exact := make([]*big.Float, elems)
				for j := range exact {
					exact[j] = new(big.Float).SetPrec(2048)
				}
				for w := range 3 {
					v := make([]float64, elems)
					for j := range v {
						v[j] = randFloat(rng, tc.typ, -15, 8)
						exact[j].Add(exact[j], big.NewFloat(v[j]))
					}
					floatReply(t, r, id, tc.typ, w, v)
				}
				res := f.result(t)
				if res.Count != 3 || res.Flags&FlagOverflow != 0 {
					t.Fatalf("request %d: count %d flags %#x", k, res.Count, res.Flags)
				}
				for j := range elems {
					got := FloatFromFixed(res.Agg[j], int(tc.fx))
					// The error is taken exactly: got minus the exact sum, in big.Float.
					err, _ := new(big.Float).SetPrec(2048).Sub(big.NewFloat(got), exact[j]).Float64()
					err, bound := math.Abs(err), sumBound(3, int(tc.fx), got)
					if err > bound {
						t.Fatalf("request %d element %d: sum %g, exact %v: error %g beyond the bound %g", k, j, got, exact[j], err, bound)
					}
					worst = max(worst, err/bound)
				}
			}
			t.Logf("largest error: %.3f of the bound", worst)
		})
	}
}

// TestGatherFloatEdges: the fixed-point range's edge (an element beyond it, and a sum of
// elements within it that wraps, flag the result); NaN and infinities reject the reply
// before anything is reduced; min and max are exact (signed zeros, subnormals, the
// largest floats); multi-packet float replies are refused.
func TestGatherFloatEdges(t *testing.T) {
	t.Run("sum range", func(t *testing.T) {
		f, r := floatFixture(t, RedSum, TypeF64, 2, 32)
		id := uint64(1)<<10 | 65
		f.arm(t, 1, id, 1)
		// 2^31 * 2^32 = 2^63: beyond the 62 integer bits.
		r.Run(t, []bpftest.Case{{Name: "element beyond the range", In: reply(w4[0], coord4, 1, 0, id, AppendFloats(nil, TypeF64, []float64{1, math.Ldexp(1, 31)}), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1, "1.Overflow": 1}}})
		if res := f.result(t); res.Flags&FlagOverflow == 0 || FloatFromFixed(res.Agg[0], 32) != 1 {
			t.Fatalf("flags %#x agg %v", res.Flags, res.Agg[:2])
		}
		id += 1 << 10
		f.arm(t, 1, id, 3)
		big := math.Ldexp(3, 28) // 3 x 2^60 in fixed point each (the range is 2^62): two fit, three wrap
		var cs []bpftest.Case
		for w := range 3 {
			want := bpftest.Counters{"1.Replies": 1}
			if w == 2 {
				want = bpftest.Counters{"1.Replies": 1, "1.Completed": 1, "1.Overflow": 1}
			}
			cs = append(cs, bpftest.Case{Name: "near the edge", In: reply(w4[w], coord4, 1, uint16(w), id, AppendFloats(nil, TypeF64, []float64{big, -big}), nil),
				WantRet: bpftest.XDPDrop, WantCounters: want})
		}
		r.Run(t, cs)
		if res := f.result(t); res.Flags&FlagOverflow == 0 {
			t.Fatalf("a wrapped sum not flagged: flags %#x", res.Flags)
		}
	})
	for _, typ := range []uint8{TypeF32, TypeF64} {
		t.Run("non-finite", func(t *testing.T) {
			f, r := floatFixture(t, RedSum, typ, 3, 32)
			id := uint64(1)<<10 | 65
			f.arm(t, 1, id, 2)
			var cs []bpftest.Case
			for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
				cs = append(cs, bpftest.Case{Name: "rejected", In: reply(w4[0], coord4, 1, 0, id, AppendFloats(nil, typ, []float64{1, bad, 2}), nil),
					WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.BadValue": 1}})
			}
			cs = append(cs,
				bpftest.Case{Name: "the same worker's finite reply counts", In: reply(w4[0], coord4, 1, 0, id, AppendFloats(nil, typ, []float64{1.5, -2.25, 0}), nil),
					WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
				bpftest.Case{Name: "second", In: reply(w4[1], coord4, 1, 1, id, AppendFloats(nil, typ, []float64{0.25, 0.25, -0.5}), nil),
					WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}})
			r.Run(t, cs)
			res := f.result(t)
			for j, want := range []float64{1.75, -2, -0.5} {
				if got := FloatFromFixed(res.Agg[j], 32); got != want {
					t.Errorf("element %d: %g, want %g (a rejected reply left a trace?)", j, got, want)
				}
			}
		})
	}
	sub64 := math.SmallestNonzeroFloat64
	cases := []struct {
		name string
		typ  uint8
		red  uint8
		in   [3][]float64
		want []float64
	}{
		{"min float64", TypeF64, RedMin, [3][]float64{{0, 1, -sub64, 5}, {math.Copysign(0, -1), -1e300, sub64, 5}, {1e-300, math.MaxFloat64, 0, -math.MaxFloat64}},
			[]float64{math.Copysign(0, -1), -1e300, -sub64, -math.MaxFloat64}},
		{"max float64", TypeF64, RedMax, [3][]float64{{0, 1, -sub64, 5}, {math.Copysign(0, -1), -1e300, sub64, 5}, {-1e-300, math.MaxFloat64, 0, -math.MaxFloat64}},
			[]float64{0, math.MaxFloat64, sub64, 5}},
		{"min float32", TypeF32, RedMin, [3][]float64{{0, 1, -1e-45, 3.5}, {math.Copysign(0, -1), -3e38, 1e-45, 3.25}, {2, 3e38, 0, 3.5}},
			[]float64{math.Copysign(0, -1), float64(float32(-3e38)), float64(float32(-1e-45)), 3.25}},
		{"max float32", TypeF32, RedMax, [3][]float64{{0, 1, -1e-45, 3.5}, {math.Copysign(0, -1), -3e38, 1e-45, 3.25}, {-2, 3e38, 0, 3.5}},
			[]float64{0, float64(float32(3e38)), float64(float32(1e-45)), 3.5}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, r := floatFixture(t, c.red, c.typ, 4, 32)
			id := uint64(1)<<10 | 65
			f.arm(t, 1, id, 3)
			for w, v := range c.in {
				floatReply(t, r, id, c.typ, w, v)
			}
			res := f.result(t)
			for j, want := range c.want {
				got := FloatFromKey(c.typ, res.Agg[j])
				if got != want || math.Signbit(got) != math.Signbit(want) {
					t.Errorf("element %d: %g, want %g", j, got, want)
				}
			}
		})
	}
	t.Run("multi-packet refused", func(t *testing.T) {
		f, r := floatFixture(t, RedSum, TypeF64, 4, 32)
		var g GroupCfg
		if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
			t.Fatal(err)
		}
		g.Flags |= GroupFlagParts
		if err := f.o.Groups.Put(uint32(1), &g); err != nil {
			t.Fatal(err)
		}
		id := uint64(1)<<10 | 65
		f.arm(t, 1, id, 1)
		r.Run(t, []bpftest.Case{{Name: "a part of a float reply passed", In: reply(w4[0], coord4, 1, 0, id, AppendFloats(nil, TypeF64, []float64{1, 2}),
			func(h *Header) { h.NParts = 2 }), WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Multipart": 1}}})
	})
}
