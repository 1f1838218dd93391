package sg

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

// Fixed point of float sums (Config.FracBits). The data plane's values; TestFloatConstants
// keeps them equal.
const (
	DefaultFracBits = 32
	MinFracBits     = 1
	MaxFracBits     = 1022
)

// Errors of FloatEncoding.Append: a Sum or Mean cannot carry the value.
var (
	ErrNotFinite = errors.New("NaN or infinity cannot be summed in fixed point")
	ErrRange     = errors.New("value too large for the fixed-point sum (fewer fraction bits take larger values)")
)

// encodeError is an encoder's error that is also one of this package's sentinels: its text
// is the encoder's, errors.Is finds both.
type encodeError struct{ sentinel, err error }

func (e encodeError) Error() string   { return e.err.Error() }
func (e encodeError) Unwrap() []error { return []error{e.sentinel, e.err} }

// FloatEncoding is how the workers of a float group encode their vectors for its
// reduction (docs/sg.md, "Float reductions"): Min/Max as order keys of the IEEE bits (a
// NaN as the key that wins), Sum/Mean in fixed point, Gather/Count as the IEEE bits.
// kedge sg worker --type float32|float64 --reduction R is the reference.
type FloatEncoding struct{ f isg.FloatFormat }

// NewFloatEncoding is the encoding of a group with reduction r over elements of float
// type t, its sums with fracBits fraction bits (0: DefaultFracBits).
func NewFloatEncoding(r Reduction, t ElemType, fracBits int) (FloatEncoding, error) {
	if !t.IsFloat() {
		return FloatEncoding{}, fmt.Errorf("sg float encoding: element type %v is not a float type", t)
	}
	if r < Sum || r > Mean {
		return FloatEncoding{}, fmt.Errorf("sg float encoding: unknown reduction %d", r)
	}
	f := isg.FloatFormat{Bits: isg.Float64, Reduce: r.kernel(), FracBits: fracBits}
	if t == Float32 {
		f.Bits = isg.Float32
	}
	if f.FracBits == 0 {
		f.FracBits = DefaultFracBits
	}
	if err := f.Check(); err != nil {
		return FloatEncoding{}, fmt.Errorf("sg float encoding: %w", err)
	}
	return FloatEncoding{f: f}, nil
}

// Append appends xs (float32 groups: each rounded to float32 first), big-endian, as the
// payload of a reply. It returns b unchanged and ErrNotFinite or ErrRange when a Sum or
// Mean value has no fixed-point form; such a worker should reply with a non-zero status.
func (e FloatEncoding) Append(b []byte, xs []float64) ([]byte, error) {
	out, err := e.f.Append(b, xs)
	switch {
	case errors.Is(err, isg.ErrNotFinite):
		err = encodeError{ErrNotFinite, err}
	case errors.Is(err, isg.ErrRange):
		err = encodeError{ErrRange, err}
	}
	return out, err
}

// ElemSize is the wire size of one element: 8 for sums (fixed point in int64) and for
// float64, 4 for float32 Min, Max, Count and Gather.
func (e FloatEncoding) ElemSize() int { return isg.ElemSize(e.f.WireType()) }

// SumErrorBound bounds |r - (x_1 + ... + x_n)| for r, a float Sum of n values (the
// replies counted, plus partial multi-packet replies) with fracBits fraction bits that
// did not overflow: n * 2^-(fracBits+1) + |r| * 2^-53. A Mean's error is this over n,
// plus |mean| * 2^-53.
func SumErrorBound(n, fracBits int, r float64) float64 { return isg.SumErrorBound(n, fracBits, r) }

// floatFormat is c's float encoding (c is valid and of a float type).
func (c *Config) floatFormat() isg.FloatFormat {
	e, _ := NewFloatEncoding(c.Reduction, c.Type, c.FracBits)
	return e.f
}

// kernelType is the element type the data plane reduces (enum sg_dtype).
func (c *Config) kernelType() uint8 {
	switch c.Type {
	case Int64:
		return isg.TypeI64
	case Float32, Float64:
		return c.floatFormat().WireType()
	}
	return isg.TypeI32
}

// floats decodes a float group's accumulators; a mean divides by count (nil when 0).
func (c *Config) floats(acc []int64, count int) []float64 {
	out := make([]float64, len(acc))
	var f isg.FloatFormat
	if c.Type.IsFloat() {
		f = c.floatFormat()
	}
	for i, a := range acc {
		switch {
		case c.Type.IsFloat():
			out[i] = f.Value(a)
		default:
			out[i] = float64(a)
		}
		if c.Reduction == Mean {
			out[i] /= float64(count)
		}
	}
	return out
}

// Floats is a vector of float results; in JSON a NaN or an infinity is the string "NaN",
// "+Inf" or "-Inf" (JSON numbers have none).
type Floats []float64

// MarshalJSON writes finite values as numbers and the others as strings.
func (fs Floats) MarshalJSON() ([]byte, error) {
	if fs == nil {
		return []byte("null"), nil
	}
	b := []byte{'['}
	for i, x := range fs {
		if i > 0 {
			b = append(b, ',')
		}
		switch {
		case math.IsNaN(x):
			b = append(b, `"NaN"`...)
		case math.IsInf(x, 1):
			b = append(b, `"+Inf"`...)
		case math.IsInf(x, -1):
			b = append(b, `"-Inf"`...)
		default:
			b = strconv.AppendFloat(b, x, 'g', -1, 64)
		}
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (fs *Floats) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		*fs = nil
		return nil
	}
	out := make(Floats, len(raw))
	for i, r := range raw {
		var s string
		if json.Unmarshal(r, &s) == nil {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil || !math.IsNaN(x) && !math.IsInf(x, 0) {
				return fmt.Errorf("sg floats: element %d is %q, want a number, \"NaN\", \"+Inf\" or \"-Inf\"", i, s)
			}
			out[i] = x
			continue
		}
		if err := json.Unmarshal(r, &out[i]); err != nil {
			return fmt.Errorf("sg floats: element %d: %w", i, err)
		}
	}
	*fs = out
	return nil
}
