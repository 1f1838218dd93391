package sg

// BPF_PROG_TEST_RUN fixtures of sg_gather's float reductions: float vectors in their wire
// form (float.go) reduced by the gather's integer paths, the results turned back into
// floats and checked against the exact sums (within SumErrorBound) and against IEEE
// 754-2019 minimum/maximum; the edges (NaN, infinities, signed zeros, subnormals, a
// fixed-point sum that wraps) and replies a float group must refuse (truncated, the
// wrong element width, a worker's unencodable value).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// floatFixture loads the data plane with group 0 reducing f's wire form from 3 workers.
func floatFixture(t *testing.T, f FloatFormat, elems int) *fixture {
	return newFixture(t, 0, coord4, w4, f.Reduce, f.WireType(), uint16(elems), 0)
}

// floatRequest runs request id with the workers' float vectors replies (one per worker,
// all of the group's length) through the gather and returns the result as floats.
func floatRequest(t *testing.T, fx *fixture, f FloatFormat, id uint64, replies [][]float64) ([]float64, ResultRec) {
	t.Helper()
	var steps []bpftest.Case
	for i, xs := range replies {
		p, err := f.Append(nil, xs)
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, bpftest.Case{Name: fmt.Sprintf("reply %d", i),
			In: reply(w4[i], coord4, 0, uint16(i), id, p, nil), WantRet: bpftest.XDPDrop})
	}
	var res ResultRec
	bpftest.Runner{Prog: fx.o.Gather}.RunCase(t, bpftest.Case{Name: "float request", Steps: steps,
		Setup: func(tb testing.TB) { fx.arm(tb, 0, id, uint16(len(replies))) },
		Check: func(tb testing.TB, _ bpftest.Result) { res = fx.result(tb) }})
	if int(res.Count) != len(replies) {
		t.Fatalf("%d replies counted, want %d", res.Count, len(replies))
	}
	out := make([]float64, len(replies[0]))
	for j := range out {
		out[j] = f.Value(res.Agg[j])
	}
	return out, res
}

func TestGatherFloatSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	// Both widths' sums travel as int64 fixed point: one group serves every case, each
	// its own request.
	fx := floatFixture(t, FloatFormat{Bits: Float64, Reduce: RedSum, FracBits: 1}, 6)
	id := uint64(1)<<10 | 9
	for _, bits := range []int{Float64, Float32} {
		for _, frac := range []int{DefaultFracBits, 12} {
			id += SlotMask + 1
			t.Run(fmt.Sprintf("float%d/frac%d", bits, frac), func(t *testing.T) {
				f := FloatFormat{Bits: bits, Reduce: RedSum, FracBits: frac}
				// Element 0 tiny (below the resolution), 1 unit, 2 large (near the range of
				// 3 values), 3 mixed, 4 exactly representable, 5 zero.
				hi := 63 - frac - 3
				replies := make([][]float64, 3)
				for i := range replies {
					draw := func(lo, hi int) float64 {
						x := math.Ldexp(1+rng.Float64(), lo+rng.IntN(hi-lo+1))
						if rng.IntN(2) == 0 {
							x = -x
						}
						if bits == Float32 {
							x = float64(float32(x))
						}
						return x
					}
					replies[i] = []float64{draw(-frac-20, -frac), draw(-2, 2), draw(hi-4, hi), draw(-frac-10, hi),
						float64(i) + 0.25, 0}
				}
				got, res := floatRequest(t, fx, f, id, replies)
				if res.Flags&FlagOverflow != 0 {
					t.Fatal("overflow flagged")
				}
				for j := range got {
					xs := []float64{replies[0][j], replies[1][j], replies[2][j]}
					err, bound := sumError(got[j], exactSum(xs)), SumErrorBound(3, frac, got[j])
					if err > bound {
						t.Errorf("element %d: sum %g of %v off by %g, above the bound %g", j, got[j], xs, err, bound)
					}
				}
				if got[4] != 3.75 || got[5] != 0 {
					t.Errorf("exact elements %g, %g; want 3.75, 0", got[4], got[5])
				}
			})
		}
	}
	t.Run("wrap flagged", func(t *testing.T) {
		f := FloatFormat{Bits: Float64, Reduce: RedSum, FracBits: 32}
		x := []float64{0x1p30 * 1.5, 0, 0, 0, 0, 0}
		_, res := floatRequest(t, fx, f, id+SlotMask+1, [][]float64{x, x, x})
		if res.Flags&FlagOverflow == 0 {
			t.Fatal("a fixed-point sum of 2^31 * 1.5 (above 2^63 units) not flagged")
		}
	})
}

func TestGatherFloatMinMax(t *testing.T) {
	nan, inf, negZero := math.NaN(), math.Inf(1), math.Copysign(0, -1)
	sub := math.SmallestNonzeroFloat64
	cases := []struct {
		name     string
		replies  [][]float64
		min, max []float64 // IEEE 754-2019 minimum/maximum
	}{
		{"signed zeros", [][]float64{{0, negZero, 0}, {negZero, 0, 0}, {0, 0, negZero}}, []float64{negZero, negZero, negZero}, []float64{0, 0, 0}},
		{"infinities", [][]float64{{inf, -inf, 1}, {1, 2, -inf}, {-1e308, inf, inf}}, []float64{-1e308, -inf, -inf}, []float64{inf, inf, inf}},
		{"nan wins", [][]float64{{nan, 1, -inf}, {1, nan, nan}, {2, -3, 4}}, []float64{nan, nan, nan}, []float64{nan, nan, nan}},
		{"subnormals", [][]float64{{sub, -sub, 1}, {2 * sub, -2 * sub, 1}, {0, 0, 1}}, []float64{0, -2 * sub, 1}, []float64{2 * sub, 0, 1}},
	}
	for _, bits := range []int{Float64, Float32} {
		for _, red := range []uint8{RedMin, RedMax} {
			f := FloatFormat{Bits: bits, Reduce: red}
			fx := floatFixture(t, f, 3)
			for k, c := range cases {
				name := fmt.Sprintf("float%d/%s/%s", bits, map[uint8]string{RedMin: "min", RedMax: "max"}[red], c.name)
				t.Run(name, func(t *testing.T) {
					got, _ := floatRequest(t, fx, f, uint64(k+1)<<10|11, c.replies)
					want := c.max
					if red == RedMin {
						want = c.min
					}
					for j := range got {
						w := want[j]
						if bits == Float32 {
							w = float64(float32(w))
						}
						if !sameFloat(got[j], w) {
							t.Errorf("element %d: %g (%#x), want %g (%#x)", j, got[j], math.Float64bits(got[j]), w, math.Float64bits(w))
						}
					}
				})
			}
		}
	}
}

// TestGatherFloatRefused: what a float group does with replies it cannot reduce. A
// float32 sum's elements are 8-byte fixed-point values: a worker sending the 4-byte
// floats is passed as bad_length; a truncated frame or a payload length beyond it is
// malformed; a worker whose value had no fixed-point form answers StatusUnencodable,
// dropped as a worker error and not in the sum.
func TestGatherFloatRefused(t *testing.T) {
	f := FloatFormat{Bits: Float32, Reduce: RedSum, FracBits: 16}
	fx := floatFixture(t, f, 2)
	id := uint64(2)<<10 | 3
	good := func(i int, xs ...float64) []byte {
		p, err := f.Append(nil, xs)
		if err != nil {
			t.Fatal(err)
		}
		return reply(w4[i], coord4, 0, uint16(i), id, p, nil)
	}
	raw32 := (FloatFormat{Bits: Float32, Reduce: RedGather}).Append
	rawPayload, _ := raw32(nil, []float64{1.5, 2.5})
	wcfg := WorkerConfig{Type: f.WireType(), Elems: 2, Float: f, FloatValues: []float64{1, math.Inf(1)}}
	unencodable := BuildReply(Header{Group: 0, Worker: 2, ReqID: id}, wcfg)[0]
	if h, _, err := ParseHeader(unencodable); err != nil || h.Status != StatusUnencodable {
		t.Fatalf("reference worker's reply to +Inf: status %d, %v", h.Status, err)
	}
	r := bpftest.Runner{Prog: fx.o.Gather, Counters: fx.counters}
	fx.arm(t, 0, id, 3)
	r.Run(t, []bpftest.Case{
		{Name: "float32 elements instead of fixed point passed", In: reply(w4[0], coord4, 0, 0, id, rawPayload, nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"0.BadLength": 1}},
		{Name: "frame truncated inside the vector passed", In: pktbuild.Truncate(good(0, 1, 2), 42+32+12),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "payload length beyond the frame passed", In: reply(w4[0], coord4, 0, 0, id, rawPayload, func(h *Header) { h.PayloadLen = 16 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "unencodable value dropped as a worker error", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: w4[2].Addr(), Dst: coord4.Addr()}).
			UDP(pktbuild.UDP{Src: w4[2].Port(), Dst: coord4.Port()}).Payload(unencodable).Build(),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"0.WorkerErrors": 1}},
		{Name: "first reply", In: good(0, 1.25, -0.5), WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"0.Replies": 1}},
		{Name: "second reply", In: good(1, 2.5, 0.125), WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"0.Replies": 1}},
	})
	fx.noResult(t)
	s := fx.slot(t, id)
	if got := []float64{f.Value(s.Res.Agg[0]), f.Value(s.Res.Agg[1])}; got[0] != 3.75 || got[1] != -0.375 || s.Res.Count != 2 {
		t.Fatalf("partial sum %v of %d replies, want [3.75 -0.375] of 2 (the refused replies not in it)", got, s.Res.Count)
	}
}
