package bpfx

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode"

	"github.com/cilium/ebpf"
)

// Per-CPU named counters: BPF programs count into a per-CPU array (or hash) whose value is
// a struct of integer fields (struct pp_counters, struct hedge_stats, ...); bpf2go generates
// the Go struct. This is the one reader: it sums a key's values over the CPUs into that
// struct (SumPerCPU, SumPerCPUAll) and lists its fields by name (Fields).

// Counter is one named counter value.
type Counter struct {
	Name  string
	Value uint64
}

// Naming says how Fields names a struct's counters.
type Naming struct {
	// C names counters as the C source does: bpf2go's CamelCase field names back in
	// snake_case (SkipNoTcpTs -> skip_no_tcp_ts), nested fields outer_inner, array
	// elements name_<index>. Otherwise the Go names: "Outer.Inner", "Field[3]".
	C bool
	// Elems names the elements of arrays, by the array's name (in the chosen naming):
	// element i of parse_err becomes parse_err_<Elems["parse_err"][i]> (C) or
	// ParseErr[<name>] (Go). Elements beyond the list keep their index.
	Elems map[string][]string
	// NoArrays leaves array fields out (histograms a caller reports in its own way).
	NoArrays bool
}

// Reduction says how a counter's per-CPU values combine into one.
type Reduction int

const (
	// Add sums the CPUs' values (in the field's width: it wraps as the kernel's does).
	Add Reduction = iota
	// Max takes the largest value.
	Max
	// MinNonZero takes the smallest value other than 0 (0: no CPU saw one).
	MinNonZero
)

// Reduce chooses a counter's Reduction by its bpf2go (Go) field name; for an array element,
// the array's name. nil: every counter adds up.
type Reduce func(field string) Reduction

// Extrema reduces counters named *_max / *_max_ns (Go: ...Max, ...MaxNs) with Max and
// *_min / *_min_ns with MinNonZero, the C convention for per-CPU extremes that a BPF
// program keeps with a compare-and-set; every other counter adds up.
func Extrema(field string) Reduction {
	f := strings.TrimSuffix(field, "Ns")
	switch {
	case strings.HasSuffix(f, "Max"):
		return Max
	case strings.HasSuffix(f, "Min"):
		return MinNonZero
	}
	return Add
}

// SumPerCPU reads key from the per-CPU map m and returns the values of all CPUs added field
// by field (each in its own width: a counter wraps as the kernel's does), or combined as
// reduce says (at most one; e.g. Extrema). V is the map's value type as bpf2go generates
// it: an integer, or a struct of integers, arrays of integers and such structs (padding
// fields named _ are skipped).
func SumPerCPU[V any](m *ebpf.Map, key any, reduce ...Reduce) (V, error) {
	var sum V
	if err := checkCounterMap[V](m); err != nil {
		return sum, err
	}
	var perCPU []V
	if err := m.Lookup(key, &perCPU); err != nil {
		return sum, fmt.Errorf("read counters %v of map %s: %w", key, m, err)
	}
	r := oneReduce(reduce)
	for i := range perCPU {
		ReduceCounters(&sum, &perCPU[i], r)
	}
	return sum, nil
}

func oneReduce(rs []Reduce) Reduce {
	if len(rs) > 0 {
		return rs[0]
	}
	return nil
}

// SumPerCPUAll reads every entry of the per-CPU map m (32-bit keys) and returns each key's
// values summed over the CPUs, as SumPerCPU does.
func SumPerCPUAll[V any](m *ebpf.Map, reduce ...Reduce) (map[uint32]V, error) {
	if err := checkCounterMap[V](m); err != nil {
		return nil, err
	}
	if m.KeySize() != 4 {
		return nil, fmt.Errorf("sum per-CPU counters: map %s has %d-byte keys, want 4", m, m.KeySize())
	}
	out := map[uint32]V{}
	var key uint32
	var perCPU []V
	r := oneReduce(reduce)
	it := m.Iterate()
	for it.Next(&key, &perCPU) {
		var sum V
		for i := range perCPU {
			ReduceCounters(&sum, &perCPU[i], r)
		}
		out[key] = sum
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate map %s: %w", m, err)
	}
	return out, nil
}

func checkCounterMap[V any](m *ebpf.Map) error {
	switch m.Type() {
	case ebpf.PerCPUArray, ebpf.PerCPUHash, ebpf.LRUCPUHash:
	default:
		return fmt.Errorf("sum per-CPU counters: map %s is a %s, not a per-CPU map", m, m.Type())
	}
	var zero V
	if size := binary.Size(zero); size != int(m.ValueSize()) {
		return fmt.Errorf("sum per-CPU counters: value type %T has %d bytes, map %s has %d", zero, size, m, m.ValueSize())
	}
	return checkCounterType(reflect.TypeOf(zero), reflect.TypeOf(zero).String())
}

// checkCounterType accepts integers and structs and arrays made of them.
func checkCounterType(t reflect.Type, name string) error {
	switch t.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return nil
	case reflect.Array:
		return checkCounterType(t.Elem(), name+"[]")
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Name == "_" {
				continue
			}
			if err := checkCounterType(f.Type, name+"."+f.Name); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("counter %s has type %s, want an integer", name, t)
}

// AddCounters adds every integer of src (fields, array elements, nested fields) to dst;
// padding fields (_) and anything that is not an integer are left alone.
func AddCounters[V any](dst, src *V) { ReduceCounters(dst, src, nil) }

// ReduceCounters combines every integer of src into dst as reduce says for its field (nil:
// all add up), as AddCounters does.
func ReduceCounters[V any](dst, src *V, reduce Reduce) {
	if reduce == nil {
		reduce = func(string) Reduction { return Add }
	}
	reduceValue(reduce(""), reduce, reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem())
}

func combine[T int64 | uint64](op Reduction, a, b T) T {
	switch {
	case op == Add:
		return a + b
	case op == Max && b > a, op == MinNonZero && b != 0 && (a == 0 || b < a):
		return b
	}
	return a
}

func reduceValue(op Reduction, reduce Reduce, d, s reflect.Value) {
	switch d.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.SetInt(combine(op, d.Int(), s.Int()))
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		d.SetUint(combine(op, d.Uint(), s.Uint()))
	case reflect.Array:
		for i := range d.Len() {
			reduceValue(op, reduce, d.Index(i), s.Index(i))
		}
	case reflect.Struct:
		for i := range d.NumField() {
			if f := d.Type().Field(i); f.Name != "_" {
				reduceValue(reduce(f.Name), reduce, d.Field(i), s.Field(i))
			}
		}
	}
}

// Fields lists the counters of v (an integer, or a struct or array of them, as SumPerCPU
// accepts) by name, in struct order, zeros included. A bare integer is one counter named
// prefix; prefix also starts every other name (with the naming's separator).
func Fields(v any, prefix string, n Naming) ([]Counter, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		rv = rv.Elem()
	}
	if err := checkCounterType(rv.Type(), rv.Type().String()); err != nil {
		return nil, err
	}
	var out []Counter
	n.fields(&out, prefix, rv)
	return out, nil
}

func (n Naming) fields(out *[]Counter, name string, v reflect.Value) {
	switch v.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		*out = append(*out, Counter{name, uint64(v.Int())})
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		*out = append(*out, Counter{name, v.Uint()})
	case reflect.Array:
		if n.NoArrays {
			return
		}
		elems := n.Elems[name]
		for i := range v.Len() {
			sub := strconv.Itoa(i)
			if i < len(elems) {
				sub = elems[i]
			}
			if n.C {
				n.fields(out, name+"_"+sub, v.Index(i))
			} else {
				n.fields(out, name+"["+sub+"]", v.Index(i))
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.Name == "_" {
				continue
			}
			fname, sep := f.Name, "."
			if n.C {
				fname, sep = SnakeCase(f.Name), "_"
			}
			if name != "" && !strings.HasSuffix(name, sep) {
				fname = name + sep + fname
			} else {
				fname = name + fname
			}
			n.fields(out, fname, v.Field(i))
		}
	}
}

// SnakeCase turns a bpf2go field name (SkipNoTcpTs) back into the C name (skip_no_tcp_ts).
func SnakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
