// Package hist is the Go mirror of bpf/include/hist.h: log-linear histogram buckets (the
// layout of HdrHistogram) that BPF programs fill and user space reads. A Layout maps values
// to buckets exactly as hist_bucket() does, gives every bucket's bounds, and estimates
// quantiles from bucket counts. The fixtures in internal/hist/histtest compare the two
// implementations value by value through BPF_PROG_TEST_RUN.
package hist

import (
	"fmt"
	"math"
	"math/bits"
)

// Layout is one histogram layout (the arguments of hist_bucket()).
//
// Values below 2^MinShift fall into 2^SubBits linear buckets of width 2^(MinShift-SubBits);
// above, every power of two [2^e, 2^(e+1)) is split into 2^SubBits buckets of width
// 2^(e-SubBits). The last of the Buckets buckets also holds every larger value.
type Layout struct {
	SubBits  uint // buckets per power of two: 2^SubBits
	MinShift uint // end of the linear range: 2^MinShift (>= SubBits)
	Buckets  int  // bucket count; the last bucket is open-ended
}

// Validate checks that the layout is one hist.h computes without overflow.
func (l Layout) Validate() error {
	switch {
	case l.SubBits > 16:
		return fmt.Errorf("histogram layout %+v: more than 2^16 sub-buckets", l)
	case l.MinShift < l.SubBits:
		return fmt.Errorf("histogram layout %+v: min shift below sub-bucket bits", l)
	case l.MinShift > 63:
		return fmt.Errorf("histogram layout %+v: min shift above 63", l)
	case l.Buckets < 1:
		return fmt.Errorf("histogram layout %+v: no buckets", l)
	}
	// The last bucket's lower edge must fit in 64 bits: its octave is MinShift + g - 1.
	if g := (l.Buckets - 1) >> l.SubBits; g > 0 && int(l.MinShift)+g-1 > 63 {
		return fmt.Errorf("histogram layout %+v: buckets beyond 2^64", l)
	}
	return nil
}

// Bucket returns the bucket of v (hist_bucket()).
func (l Layout) Bucket(v uint64) int {
	var b uint64
	if v < 1<<l.MinShift {
		b = v >> (l.MinShift - l.SubBits)
	} else {
		e := uint(bits.Len64(v) - 1)
		b = uint64(e-l.MinShift+1)<<l.SubBits + (v>>(e-l.SubBits))&(1<<l.SubBits-1)
	}
	return int(min(b, uint64(l.Buckets-1)))
}

// Lower returns the smallest value of bucket b (hist_lower()).
func (l Layout) Lower(b int) uint64 {
	g := uint(b) >> l.SubBits
	s := uint64(b) & (1<<l.SubBits - 1)
	if g == 0 {
		return s << (l.MinShift - l.SubBits)
	}
	return (1<<l.SubBits + s) << (l.MinShift + g - 1 - l.SubBits)
}

// Upper returns the end of bucket b (exclusive); math.MaxUint64 for the last bucket, which
// is open-ended.
func (l Layout) Upper(b int) uint64 {
	if b >= l.Buckets-1 {
		return math.MaxUint64
	}
	return l.Lower(b + 1)
}

// Count is a bucket counter type.
type Count interface {
	~uint32 | ~uint64
}

// Total returns the sum of counts.
func Total[C Count](counts []C) uint64 {
	var n uint64
	for _, c := range counts {
		n += uint64(c)
	}
	return n
}

// QuantileBucket returns the bucket that holds the q-quantile (0 < q <= 1) by nearest rank:
// the first bucket at which the cumulative count reaches ceil(q * total). It returns -1
// when counts are all zero.
func QuantileBucket[C Count](counts []C, q float64) int {
	n := Total(counts)
	if n == 0 {
		return -1
	}
	target := max(uint64(math.Ceil(q*float64(n))), 1)
	var seen uint64
	for b, c := range counts {
		seen += uint64(c)
		if seen >= target {
			return b
		}
	}
	return len(counts) - 1
}

// Quantile estimates the q-quantile (0..1) by linear interpolation inside its bucket. lo
// and hi are the exact minimum and maximum when known (0 and math.MaxUint64 when not): the
// bucket's range is clamped to them, so the estimate is never outside the observed values,
// and the open last bucket ends at hi. The error is below one bucket width. It returns 0
// when counts are all zero.
func Quantile[C Count](l Layout, counts []C, q float64, lo, hi uint64) float64 {
	n := Total(counts)
	if n == 0 {
		return 0
	}
	rank := q * float64(n)
	var seen float64
	for b, c := range counts {
		if c == 0 {
			continue
		}
		if seen+float64(c) >= rank {
			blo, bhi := max(l.Lower(b), lo), min(l.Upper(b), hi)
			if bhi < blo {
				bhi = blo
			}
			v := float64(blo) + (rank-seen)/float64(c)*float64(bhi-blo)
			return min(max(v, float64(lo)), float64(hi))
		}
		seen += float64(c)
	}
	return float64(hi)
}
