package sg

// Float vectors (docs/sg.md, "Float reductions"). BPF has no floating point, so the
// workers of a float group send integers that the gather's integer paths reduce exactly,
// and the coordinator turns the aggregate back into floats:
//
//   - Min, Max: each value's order key, its IEEE 754 bits with every bit but the sign
//     flipped when the sign is set (Key64, Key32). Signed integer order of the keys is the
//     floats' total order (-NaN < -Inf < ... < -0 < +0 < ... < +Inf < +NaN), so the
//     kernel's int64 min/max is exact. A NaN is sent as the key that wins (the most
//     negative for Min, the most positive for Max): NaN propagates, as in IEEE 754-2019's
//     minimum/maximum (also against an infinity, where Go's math.Min and math.Max return
//     the infinity). float64 keys travel as int64, float32 keys as int32.
//   - Sum (and Mean): fixed point with FracBits fraction bits, round(x * 2^FracBits) to
//     nearest even, as int64 for both widths (Quantize). The kernel's int64 sum is exact
//     and independent of arrival order; it flags a wrap (SG_F_OVERFLOW). NaN, infinities
//     and values whose fixed-point form does not fit int64 cannot be sent: the encoder
//     refuses them (ErrNotFinite, ErrRange).
//   - Gather, Count: the IEEE 754 bits, big-endian, untouched.
//
// Doing the conversion at the worker keeps the kernel's gather unchanged: a float path in
// the program would add its own loops to a program that already uses half of 6.1's
// verifier budget, and it would have to do what user space does in one instruction.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Float widths (FloatFormat.Bits).
const (
	Float32 = 32
	Float64 = 64
)

// Fixed-point limits (FloatFormat.FracBits). Dequantize stays exact up to its final
// rounding for any FracBits in range: S * 2^-FracBits is a normal float64 for S != 0.
const (
	DefaultFracBits = 32
	MinFracBits     = 1
	MaxFracBits     = 1022
)

// Errors of FloatFormat.Append and Quantize.
var (
	ErrNotFinite = errors.New("NaN or infinity cannot be summed in fixed point")
	ErrRange     = errors.New("value too large for the fixed-point sum (fewer fraction bits take larger values)")
)

// Key64 is x's order key: int64 order of keys is x's total order.
func Key64(x float64) int64 {
	b := int64(math.Float64bits(x))
	return b ^ int64(uint64(b>>63)>>1)
}

// FromKey64 is the float whose key is k (Key64's inverse).
func FromKey64(k int64) float64 {
	return math.Float64frombits(uint64(k ^ int64(uint64(k>>63)>>1)))
}

// Key32 is x's order key as int32.
func Key32(x float32) int32 {
	b := int32(math.Float32bits(x))
	return b ^ int32(uint32(b>>31)>>1)
}

// FromKey32 is the float32 whose key is k (Key32's inverse).
func FromKey32(k int32) float32 {
	return math.Float32frombits(uint32(k ^ int32(uint32(k>>31)>>1)))
}

// Quantize is x in fixed point with frac fraction bits: round(x * 2^frac), ties to even.
// |Quantize(x) * 2^-frac - x| <= 2^-(frac+1).
func Quantize(x float64, frac int) (int64, error) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, ErrNotFinite
	}
	y := math.RoundToEven(math.Ldexp(x, frac))
	if y >= 0x1p63 || y < -0x1p63 {
		return 0, fmt.Errorf("%w: %g with %d fraction bits (|x| < 2^%d)", ErrRange, x, frac, 63-frac)
	}
	return int64(y), nil
}

// Dequantize is the fixed-point value s (frac fraction bits) as float64: s * 2^-frac,
// rounded once (to nearest even) to float64's 53 bits.
func Dequantize(s int64, frac int) float64 { return math.Ldexp(float64(s), -frac) }

// SumErrorBound bounds |r - (x_1 + ... + x_n)| for r, the dequantized sum of n values
// with frac fraction bits (without overflow): each value rounds by at most half a unit
// of 2^-frac and the conversion of the exact integer sum to float64 by half an ulp of r.
func SumErrorBound(n int, frac int, r float64) float64 {
	return float64(n)*math.Ldexp(1, -frac-1) + math.Abs(r)*0x1p-53
}

// FloatFormat says how a worker's float vector travels for a group's reduction.
type FloatFormat struct {
	Bits     int   // Float32 or Float64
	Reduce   uint8 // RedSum (a mean too), RedMin, RedMax, RedCount or RedGather
	FracBits int   // RedSum: fraction bits of the fixed point (MinFracBits..MaxFracBits)
}

// Check reports whether f is a format a group can use.
func (f FloatFormat) Check() error {
	if f.Bits != Float32 && f.Bits != Float64 {
		return fmt.Errorf("float width %d, want %d or %d", f.Bits, Float32, Float64)
	}
	if f.Reduce > RedGather {
		return fmt.Errorf("unknown reduction %d", f.Reduce)
	}
	if f.Reduce == RedSum && (f.FracBits < MinFracBits || f.FracBits > MaxFracBits) {
		return fmt.Errorf("%d fraction bits, want %d..%d", f.FracBits, MinFracBits, MaxFracBits)
	}
	return nil
}

// WireType is the integer type (TypeI32, TypeI64) the vector travels and is reduced as.
func (f FloatFormat) WireType() uint8 {
	if f.Bits == Float64 || f.Reduce == RedSum {
		return TypeI64
	}
	return TypeI32
}

// Append appends xs in f's wire form (float32: each value rounded to float32 first, as
// the worker's vector holds it). On an error (a sum's NaN, infinity or out-of-range
// value) it returns b unchanged.
func (f FloatFormat) Append(b []byte, xs []float64) ([]byte, error) {
	start := len(b)
	for i, x := range xs {
		if f.Bits == Float32 {
			x = float64(float32(x))
		}
		switch f.Reduce {
		case RedSum:
			q, err := Quantize(x, f.FracBits)
			if err != nil {
				return b[:start], fmt.Errorf("element %d: %w", i, err)
			}
			b = binary.BigEndian.AppendUint64(b, uint64(q))
		case RedMin, RedMax:
			b = f.appendKey(b, x)
		default:
			if f.Bits == Float32 {
				b = binary.BigEndian.AppendUint32(b, math.Float32bits(float32(x)))
			} else {
				b = binary.BigEndian.AppendUint64(b, math.Float64bits(x))
			}
		}
	}
	return b, nil
}

// appendKey appends x's order key; a NaN as the key that wins f's reduction.
func (f FloatFormat) appendKey(b []byte, x float64) []byte {
	nan := math.IsNaN(x)
	if f.Bits == Float32 {
		k := Key32(float32(x))
		if nan {
			k = math.MaxInt32
			if f.Reduce == RedMin {
				k = math.MinInt32
			}
		}
		return binary.BigEndian.AppendUint32(b, uint32(k))
	}
	k := Key64(x)
	if nan {
		k = math.MaxInt64
		if f.Reduce == RedMin {
			k = math.MinInt64
		}
	}
	return binary.BigEndian.AppendUint64(b, uint64(k))
}

// Value is the float an accumulator of f's reduction holds: a dequantized sum or the
// value of a min/max key. A float32 accumulator outside int32 (a min/max identity: no
// reply covered the element) is NaN.
func (f FloatFormat) Value(acc int64) float64 {
	switch {
	case f.Reduce == RedSum:
		return Dequantize(acc, f.FracBits)
	case f.Bits == Float64:
		return FromKey64(acc)
	case acc < math.MinInt32 || acc > math.MaxInt32:
		return math.NaN()
	}
	return float64(FromKey32(int32(acc)))
}
