package bpftest

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// Counters maps counter names to values (or to changes of values, see Delta).
type Counters map[string]int64

// SumPerCPU reads every entry of the per-CPU map m (array or hash, 32-bit keys) and sums each
// counter over all CPUs. V is the map's value type as bpf2go generates it: an integer, or a
// struct whose fields are integers, arrays of integers or such structs (padding fields named
// _ are skipped).
//
// Names: a struct field is named by its Go field name (bpf2go's CamelCase of the C name),
// nested fields as "Outer.Inner", array elements as "Field[3]". Unless m is an array with a
// single entry (the usual "one struct of named counters" map), the key comes first: "3.Field",
// or just "3" for an integer value type (a counter array indexed by reason).
func SumPerCPU[V any](m *ebpf.Map) (Counters, error) {
	switch m.Type() {
	case ebpf.PerCPUArray, ebpf.PerCPUHash, ebpf.LRUCPUHash:
	default:
		return nil, fmt.Errorf("sum per-CPU counters: map %s is a %s, not a per-CPU map", m, m.Type())
	}
	if m.KeySize() != 4 {
		return nil, fmt.Errorf("sum per-CPU counters: map %s has %d-byte keys, want 4", m, m.KeySize())
	}
	var zero V
	if size := binary.Size(zero); size != int(m.ValueSize()) {
		return nil, fmt.Errorf("sum per-CPU counters: value type %T has %d bytes, map %s has %d", zero, size, m, m.ValueSize())
	}
	single := m.Type() == ebpf.PerCPUArray && m.MaxEntries() == 1
	_, scalar := intValue(reflect.ValueOf(zero))

	out := Counters{}
	var key uint32
	var perCPU []V
	it := m.Iterate()
	for it.Next(&key, &perCPU) {
		prefix := ""
		switch {
		case scalar:
			prefix = strconv.FormatUint(uint64(key), 10)
		case !single:
			prefix = strconv.FormatUint(uint64(key), 10) + "."
		}
		for _, v := range perCPU {
			if err := addCounters(out, prefix, reflect.ValueOf(v)); err != nil {
				return nil, fmt.Errorf("sum per-CPU counters of map %s: %w", m, err)
			}
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate map %s: %w", m, err)
	}
	return out, nil
}

func addCounters(out Counters, name string, v reflect.Value) error {
	if n, ok := intValue(v); ok {
		out[name] += n
		return nil
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.Name == "_" {
				continue
			}
			sep := "."
			if name == "" || strings.HasSuffix(name, ".") {
				sep = ""
			}
			if err := addCounters(out, name+sep+f.Name, v.Field(i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Array:
		for i := range v.Len() {
			if err := addCounters(out, fmt.Sprintf("%s[%d]", name, i), v.Index(i)); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("counter %q has type %s, want an integer", name, v.Type())
}

func intValue(v reflect.Value) (int64, bool) {
	switch v.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int(), true
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(v.Uint()), true
	}
	return 0, false
}

// Sub returns c - before for every counter in either.
func (c Counters) Sub(before Counters) Counters {
	out := make(Counters, len(c))
	for k, v := range c {
		out[k] = v - before[k]
	}
	for k, v := range before {
		if _, ok := c[k]; !ok {
			out[k] = -v
		}
	}
	return out
}

// Diff compares c with want, a missing counter counting as 0, and returns one line per
// counter that differs ("" when none does).
func (c Counters) Diff(want Counters) string {
	var lines []string
	for k, v := range c {
		if want[k] != v {
			lines = append(lines, fmt.Sprintf("  %s: %d, want %d", k, v, want[k]))
		}
	}
	for k, v := range want {
		if _, ok := c[k]; !ok && v != 0 {
			lines = append(lines, fmt.Sprintf("  %s: 0 (absent), want %d", k, v))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// Delta reads the counters, calls run, reads them again and returns the change.
func Delta(read func() (Counters, error), run func() error) (Counters, error) {
	before, err := read()
	if err != nil {
		return nil, fmt.Errorf("read counters before the run: %w", err)
	}
	if err := run(); err != nil {
		return nil, err
	}
	after, err := read()
	if err != nil {
		return nil, fmt.Errorf("read counters after the run: %w", err)
	}
	return after.Sub(before), nil
}
