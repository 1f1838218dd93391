package hist

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Layouts every test runs: pping's (ns), hedge's (us), the extremes of the parameters.
var layouts = []Layout{
	{SubBits: 3, MinShift: 8, Buckets: 233},  // pping
	{SubBits: 4, MinShift: 4, Buckets: 400},  // hedge
	{SubBits: 0, MinShift: 0, Buckets: 65},   // powers of two only, up to 2^63
	{SubBits: 2, MinShift: 10, Buckets: 50},  // coarse linear range
	{SubBits: 5, MinShift: 7, Buckets: 1000}, // fine, ends below 2^64
	{SubBits: 3, MinShift: 8, Buckets: 5},    // fewer buckets than the linear range
}

// edges builds the layout's bucket edges from its definition (linear range, then 2^SubBits
// equal parts of every power of two), independently of the bit arithmetic under test.
func edges(l Layout) []uint64 {
	var e []uint64
	w := uint64(1) << (l.MinShift - l.SubBits)
	for i := range uint64(1) << l.SubBits {
		e = append(e, i*w)
	}
	for oct := l.MinShift; len(e) < l.Buckets && oct < 64; oct++ {
		for s := range uint64(1) << l.SubBits {
			e = append(e, 1<<oct+s*(1<<oct>>l.SubBits))
		}
	}
	return e[:l.Buckets]
}

func refBucket(e []uint64, v uint64) int {
	i, found := slices.BinarySearch(e, v)
	if found {
		return i
	}
	return i - 1
}

// probes returns the values around every edge, every power of two and some random ones.
func probes(l Layout, rng *rand.Rand) []uint64 {
	vs := []uint64{0, 1, 2, 3, math.MaxUint64, math.MaxUint64 - 1}
	for b := range l.Buckets {
		lo := l.Lower(b)
		vs = append(vs, lo, lo+1, lo-1)
		if b+1 < l.Buckets {
			vs = append(vs, l.Lower(b+1)-1)
		}
	}
	for k := range 64 {
		vs = append(vs, 1<<k-1, 1<<k, 1<<k+1)
	}
	for range 2000 {
		vs = append(vs, rng.Uint64()>>rng.IntN(64))
	}
	return vs
}

func TestLayoutMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, l := range layouts {
		if err := l.Validate(); err != nil {
			t.Fatal(err)
		}
		e := edges(l)
		for b := range l.Buckets {
			if got := l.Lower(b); got != e[b] {
				t.Fatalf("%+v: Lower(%d) = %d, want %d", l, b, got, e[b])
			}
		}
		for _, v := range probes(l, rng) {
			if got, want := l.Bucket(v), refBucket(e, v); got != want {
				t.Fatalf("%+v: Bucket(%d) = %d, want %d", l, v, got, want)
			}
		}
		if got := l.Upper(l.Buckets - 1); got != math.MaxUint64 {
			t.Errorf("%+v: last bucket ends at %d, want open", l, got)
		}
	}
}

// TestWidth: above the linear range a bucket is at most 2^-SubBits of its lower edge wide.
func TestWidth(t *testing.T) {
	for _, l := range layouts {
		for b := 1 << l.SubBits; b < l.Buckets-1; b++ {
			lo, hi := l.Lower(b), l.Upper(b)
			if hi <= lo || (hi-lo) > lo>>l.SubBits {
				t.Fatalf("%+v: bucket %d is [%d, %d)", l, b, lo, hi)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	for _, l := range []Layout{
		{SubBits: 4, MinShift: 3, Buckets: 10},
		{SubBits: 3, MinShift: 8, Buckets: 0},
		{SubBits: 0, MinShift: 0, Buckets: 66},
		{SubBits: 3, MinShift: 64, Buckets: 10},
		{SubBits: 17, MinShift: 20, Buckets: 10},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v: no error", l)
		}
	}
}

func TestQuantileBucket(t *testing.T) {
	counts := []uint32{0, 2, 0, 5, 3}
	for _, c := range []struct {
		q    float64
		want int
	}{{0, 1}, {0.2, 1}, {0.21, 3}, {0.7, 3}, {0.71, 4}, {1, 4}} {
		if got := QuantileBucket(counts, c.q); got != c.want {
			t.Errorf("QuantileBucket(%v) = %d, want %d", c.q, got, c.want)
		}
	}
	if got := QuantileBucket([]uint64{0, 0}, 0.5); got != -1 {
		t.Errorf("empty: %d, want -1", got)
	}
}

func TestQuantile(t *testing.T) {
	l := Layout{SubBits: 3, MinShift: 8, Buckets: 233}
	counts := make([]uint64, l.Buckets)
	// 100 samples spread evenly over bucket [1024, 1152): quantiles interpolate linearly.
	b := l.Bucket(1024)
	counts[b] = 100
	for _, c := range []struct {
		q        float64
		lo, hi   uint64
		want     float64
		describe string
	}{
		{0.5, 0, math.MaxUint64, 1088, "middle of the bucket"},
		{1, 0, math.MaxUint64, 1152, "its end"},
		{0.5, 1100, 1120, 1110, "clamped to the observed min and max"},
		{0, 1100, 1120, 1100, "q=0 is the minimum"},
	} {
		if got := Quantile(l, counts, c.q, c.lo, c.hi); got != c.want {
			t.Errorf("%s: Quantile(%v) = %v, want %v", c.describe, c.q, got, c.want)
		}
	}
	// The open last bucket ends at the maximum.
	last := make([]uint32, l.Buckets)
	last[l.Buckets-1] = 1
	if got := Quantile(l, last, 0.5, 1<<40, 1<<40); got != 1<<40 {
		t.Errorf("last bucket: %v, want %v", got, float64(uint64(1)<<40))
	}
	if got := Quantile(l, make([]uint64, 3), 0.5, 0, math.MaxUint64); got != 0 {
		t.Errorf("empty: %v", got)
	}
}
