package bpftest

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// Counters maps counter names to values (or to changes of values, see Delta).
type Counters map[string]int64

// SumPerCPU reads every entry of the per-CPU map m (array or hash, 32-bit keys) and sums each
// counter over all CPUs (bpfx.SumPerCPUAll), named for fixtures. V is the map's value type as bpf2go generates it: an integer, or a
// struct whose fields are integers, arrays of integers or such structs (padding fields named
// _ are skipped).
//
// Names: a struct field is named by its Go field name (bpf2go's CamelCase of the C name),
// nested fields as "Outer.Inner", array elements as "Field[3]". Unless m is an array with a
// single entry (the usual "one struct of named counters" map), the key comes first: "3.Field",
// or just "3" for an integer value type (a counter array indexed by reason).
func SumPerCPU[V any](m *ebpf.Map) (Counters, error) {
	sums, err := bpfx.SumPerCPUAll[V](m)
	if err != nil {
		return nil, err
	}
	single := m.Type() == ebpf.PerCPUArray && m.MaxEntries() == 1
	var zero V
	scalar := reflect.TypeOf(zero).Kind() != reflect.Struct && reflect.TypeOf(zero).Kind() != reflect.Array
	out := Counters{}
	for key, v := range sums {
		prefix := ""
		switch {
		case scalar:
			prefix = strconv.FormatUint(uint64(key), 10)
		case !single:
			prefix = strconv.FormatUint(uint64(key), 10) + "."
		}
		fields, err := bpfx.Fields(v, prefix, bpfx.Naming{})
		if err != nil {
			return nil, fmt.Errorf("sum per-CPU counters of map %s: %w", m, err)
		}
		for _, f := range fields {
			out[f.Name] += int64(f.Value)
		}
	}
	return out, nil
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

// With returns a copy of c with more's counters set (added or replaced): a table's shared
// expectation plus what one case adds.
func (c Counters) With(more Counters) Counters {
	out := make(Counters, len(c)+len(more))
	for k, v := range c {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
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
