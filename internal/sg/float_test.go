package sg

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
)

// totalOrder64 lists float64 values in IEEE 754 total order, NaNs of both signs at the ends.
var totalOrder64 = []float64{
	math.Float64frombits(0xffffffffffffffff), // -NaN, every payload bit set
	math.Float64frombits(0xfff8000000000000), // -NaN, quiet
	math.Inf(-1), -math.MaxFloat64, -1e300, -1, -math.SmallestNonzeroFloat64 * 2, -math.SmallestNonzeroFloat64,
	math.Copysign(0, -1), 0,
	math.SmallestNonzeroFloat64, 0x1p-1022, 1, 1 + 0x1p-52, 1e300, math.MaxFloat64, math.Inf(1),
	math.NaN(), math.Float64frombits(0x7fffffffffffffff),
}

func TestFloatKeysOrder(t *testing.T) {
	for i, x := range totalOrder64 {
		k := Key64(x)
		if math.Float64bits(FromKey64(k)) != math.Float64bits(x) {
			t.Errorf("FromKey64(Key64(%#x)) = %#x", math.Float64bits(x), math.Float64bits(FromKey64(k)))
		}
		if i > 0 && Key64(totalOrder64[i-1]) >= k {
			t.Errorf("key of %g (%#x) not above the key of %g (%#x)", x, k, totalOrder64[i-1], Key64(totalOrder64[i-1]))
		}
		x32 := float32(x)
		if !math.IsNaN(x) && math.Float32bits(FromKey32(Key32(x32))) != math.Float32bits(x32) {
			t.Errorf("FromKey32(Key32(%g)) = %g", x32, FromKey32(Key32(x32)))
		}
	}
	if Key64(totalOrder64[0]) != math.MinInt64 || Key64(totalOrder64[len(totalOrder64)-1]) != math.MaxInt64 {
		t.Error("the NaNs with every payload bit set are not the extreme keys")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		a, b := math.Float64frombits(rng.Uint64()), math.Float64frombits(rng.Uint64())
		if !math.IsNaN(a) && !math.IsNaN(b) && a < b && Key64(a) >= Key64(b) {
			t.Fatalf("%g < %g but keys %d >= %d", a, b, Key64(a), Key64(b))
		}
		c, d := math.Float32frombits(rng.Uint32()), math.Float32frombits(rng.Uint32())
		if c == c && d == d && c < d && Key32(c) >= Key32(d) {
			t.Fatalf("float32 %g < %g but keys %d >= %d", c, d, Key32(c), Key32(d))
		}
		if k := int64(rng.Uint64()); Key64(FromKey64(k)) != k {
			t.Fatalf("Key64(FromKey64(%d)) = %d", k, Key64(FromKey64(k)))
		}
	}
}

// reduceKeys is what the kernel does with a min/max group's replies: int64 min or max of
// the keys, element-wise, and back to floats.
func reduceKeys(t *testing.T, f FloatFormat, replies [][]float64) []float64 {
	t.Helper()
	var acc []int64
	for i, xs := range replies {
		b, err := f.Append(nil, xs)
		if err != nil {
			t.Fatal(err)
		}
		v := DecodeVector(b, f.WireType())
		if i == 0 {
			acc = v
			continue
		}
		for j := range acc {
			if f.Reduce == RedMin {
				acc[j] = min(acc[j], v[j])
			} else {
				acc[j] = max(acc[j], v[j])
			}
		}
	}
	out := make([]float64, len(acc))
	for j, a := range acc {
		out[j] = f.Value(a)
	}
	return out
}

// sameFloat: equal bits, or both NaN.
func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || math.IsNaN(a) && math.IsNaN(b)
}

// TestFloatMinMax: the keys' min/max is IEEE 754-2019's minimum/maximum element by element:
// exact, -0 below +0, infinities ordinary values, a NaN wins (even against an infinity,
// where Go's math.Min and math.Max return the infinity); float32 too.
func TestFloatMinMax(t *testing.T) {
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), math.MaxFloat64,
		-math.MaxFloat64, math.SmallestNonzeroFloat64, -math.SmallestNonzeroFloat64, 1, -1}
	rng := rand.New(rand.NewPCG(3, 4))
	draw := func() float64 {
		if rng.IntN(4) == 0 {
			return specials[rng.IntN(len(specials))]
		}
		return math.Ldexp(rng.NormFloat64(), rng.IntN(400)-200)
	}
	for _, bits := range []int{Float64, Float32} {
		for _, red := range []uint8{RedMin, RedMax} {
			f := FloatFormat{Bits: bits, Reduce: red}
			for round := range 300 {
				n, elems := 1+rng.IntN(8), 1+rng.IntN(16)
				replies := make([][]float64, n)
				for i := range replies {
					replies[i] = make([]float64, elems)
					for j := range replies[i] {
						replies[i][j] = draw()
						if bits == Float32 {
							replies[i][j] = float64(float32(replies[i][j]))
						}
					}
				}
				got := reduceKeys(t, f, replies)
				for j := range elems {
					want := replies[0][j]
					for _, r := range replies[1:] {
						switch {
						case math.IsNaN(want) || math.IsNaN(r[j]):
							want = math.NaN() // IEEE 754-2019 minimum/maximum: before Go's -Inf/+Inf rule
						case red == RedMin:
							want = math.Min(want, r[j])
						default:
							want = math.Max(want, r[j])
						}
					}
					if !sameFloat(got[j], want) {
						t.Fatalf("float%d %v round %d element %d: %g (%#x), want %g (%#x)", bits, red, round, j,
							got[j], math.Float64bits(got[j]), want, math.Float64bits(want))
					}
				}
			}
		}
	}
}

// exactSum is x_1 + ... + x_n without rounding (4096 bits hold any sum of 1024 float64).
func exactSum(xs []float64) *big.Float {
	s := new(big.Float).SetPrec(4096)
	for _, x := range xs {
		s.Add(s, new(big.Float).SetFloat64(x))
	}
	return s
}

// sumError is |r - exact| as float64.
func sumError(r float64, exact *big.Float) float64 {
	d := new(big.Float).SetPrec(4096).SetFloat64(r)
	e, _ := d.Sub(d, exact).Abs(d).Float64()
	return e
}

// quantizedSum is what the kernel computes for one element: the int64 sum of the
// workers' fixed-point values; ok is false when it wraps (the kernel flags that).
func quantizedSum(t *testing.T, f FloatFormat, xs []float64) (float64, bool) {
	t.Helper()
	var s int64
	for _, x := range xs {
		b, err := f.Append(nil, []float64{x})
		if err != nil {
			t.Fatal(err)
		}
		q := DecodeVector(b, TypeI64)[0]
		if (q > 0 && s > math.MaxInt64-q) || (q < 0 && s < math.MinInt64-q) {
			return 0, false
		}
		s += q
	}
	return f.Value(s), true
}

// TestFloatSumBound checks the written bound of the fixed-point sum (SumErrorBound)
// against the exact sum of random vectors, with magnitudes from tiny (far below the
// fixed point's resolution) to large (close to its range), mixed signs and up to 1024
// workers, for float64 and float32 inputs; and that the sum does not depend on the
// order the replies arrive in. The error of a plain float64 sum over the same values is
// logged beside it.
func TestFloatSumBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	type mags struct {
		name   string
		lo, hi int // log2 of the magnitudes, uniform between
	}
	for _, frac := range []int{DefaultFracBits, 8, 60} {
		rangeExp := 63 - frac - 11 // 1024 values of up to 2^rangeExp cannot wrap
		for _, m := range []mags{
			{"tiny", -frac - 30, -frac + 2},
			{"unit", -4, 4},
			{"large", rangeExp - 8, rangeExp},
			{"mixed", -frac - 20, rangeExp},
		} {
			if m.hi > rangeExp {
				continue
			}
			for _, bits := range []int{Float64, Float32} {
				f := FloatFormat{Bits: bits, Reduce: RedSum, FracBits: frac}
				var worst, worstPlain float64
				for _, n := range []int{1, 3, 64, 1024} {
					xs := make([]float64, n)
					for i := range xs {
						x := math.Ldexp(1+rng.Float64(), m.lo+rng.IntN(m.hi-m.lo+1))
						if rng.IntN(2) == 0 {
							x = -x
						}
						if bits == Float32 {
							x = float64(float32(x))
						}
						xs[i] = x
					}
					r, ok := quantizedSum(t, f, xs)
					if !ok {
						t.Fatalf("frac %d %s n %d: the sum wrapped", frac, m.name, n)
					}
					exact := exactSum(xs)
					err, bound := sumError(r, exact), SumErrorBound(n, frac, r)
					if err > bound {
						t.Errorf("float%d frac %d %s n %d: |sum - exact| = %g above the bound %g", bits, frac, m.name, n, err, bound)
					}
					var plain float64
					for _, x := range xs {
						plain += x
					}
					worst, worstPlain = max(worst, err/max(bound, math.SmallestNonzeroFloat64)), max(worstPlain, sumError(plain, exact))
					rng.Shuffle(len(xs), func(i, j int) { xs[i], xs[j] = xs[j], xs[i] })
					if r2, _ := quantizedSum(t, f, xs); math.Float64bits(r2) != math.Float64bits(r) {
						t.Errorf("float%d frac %d %s n %d: %g in another order, %g before", bits, frac, m.name, n, r2, r)
					}
				}
				t.Logf("float%d frac %2d %-5s: error at most %.3f of the bound; plain float64 sum's error up to %g", bits, frac, m.name, worst, worstPlain)
			}
		}
	}
}

func TestFloatEncodeRefusals(t *testing.T) {
	f := FloatFormat{Bits: Float64, Reduce: RedSum, FracBits: 32}
	for _, c := range []struct {
		x    float64
		want error
	}{
		{math.NaN(), ErrNotFinite}, {math.Inf(1), ErrNotFinite}, {math.Inf(-1), ErrNotFinite},
		{0x1p31, ErrRange}, {-0x1p31 - 1, ErrRange}, {1e300, ErrRange},
	} {
		b, err := f.Append([]byte{1, 2}, []float64{1, c.x})
		if !errors.Is(err, c.want) || !slices.Equal(b, []byte{1, 2}) {
			t.Errorf("Append(%g) = %x, %v; want the buffer unchanged and %v", c.x, b, err, c.want)
		}
	}
	// The edges of the range: -2^31 is the most negative value with 32 fraction bits.
	if q, err := Quantize(-0x1p31, 32); err != nil || q != math.MinInt64 {
		t.Errorf("Quantize(-2^31, 32) = %d, %v", q, err)
	}
	if q, err := Quantize(0x1p31-0x1p-22, 32); err != nil || q != math.MaxInt64-1023 {
		t.Errorf("Quantize(2^31 - 2^-22, 32) = %d, %v (the largest float64 below 2^31)", q, err)
	}
	// Ties round to even; values below half a unit are 0.
	for _, c := range []struct {
		x    float64
		want int64
	}{{0x1p-33, 0}, {3 * 0x1p-33, 2}, {-3 * 0x1p-33, -2}, {0x1p-40, 0}, {-0x1p-40, 0}, {1.5, 3 << 31}} {
		if q, _ := Quantize(c.x, 32); q != c.want {
			t.Errorf("Quantize(%g, 32) = %d, want %d", c.x, q, c.want)
		}
	}
	for _, bad := range []FloatFormat{{Bits: 16}, {Bits: 64, Reduce: RedSum, FracBits: 0}, {Bits: 32, Reduce: RedSum, FracBits: 1023}, {Bits: 64, Reduce: 9}} {
		if bad.Check() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	// Gather keeps the IEEE bits; a float32 min/max key travels in 4 bytes.
	if b, _ := (FloatFormat{Bits: Float32, Reduce: RedGather}).Append(nil, []float64{1.5}); !slices.Equal(b, []byte{0x3f, 0xc0, 0, 0}) {
		t.Errorf("gather float32 1.5 = %x", b)
	}
	if w := (FloatFormat{Bits: Float32, Reduce: RedMax}).WireType(); w != TypeI32 {
		t.Errorf("float32 max travels as type %d", w)
	}
	if w := (FloatFormat{Bits: Float32, Reduce: RedSum, FracBits: 8}).WireType(); w != TypeI64 {
		t.Errorf("float32 sum travels as type %d", w)
	}
}
