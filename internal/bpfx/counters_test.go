package bpfx_test

import (
	"slices"
	"strings"
	"structs"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
)

// inner and counters mirror C structs the way bpf2go generates them:
// struct inner { __u32 hits; __u32 misses; };
// struct counters { __u64 seen_total; __u16 drops[2]; __u32 _pad; struct inner in; };
type inner struct {
	_      structs.HostLayout
	Hits   uint32
	Misses uint32
}

type counters struct {
	_         structs.HostLayout
	SeenTotal uint64
	Drops     [2]uint16
	_         [4]byte
	In        inner
}

func TestFieldsNaming(t *testing.T) {
	c := counters{SeenTotal: 7, Drops: [2]uint16{1, 2}, In: inner{Hits: 3}}
	for _, tc := range []struct {
		naming bpfx.Naming
		prefix string
		want   []bpfx.Counter
	}{
		{bpfx.Naming{C: true, Elems: map[string][]string{"drops": {"short"}}}, "", []bpfx.Counter{
			{"seen_total", 7}, {"drops_short", 1}, {"drops_1", 2}, {"in_hits", 3}, {"in_misses", 0}}},
		{bpfx.Naming{}, "", []bpfx.Counter{
			{"SeenTotal", 7}, {"Drops[0]", 1}, {"Drops[1]", 2}, {"In.Hits", 3}, {"In.Misses", 0}}},
		{bpfx.Naming{}, "3.", []bpfx.Counter{
			{"3.SeenTotal", 7}, {"3.Drops[0]", 1}, {"3.Drops[1]", 2}, {"3.In.Hits", 3}, {"3.In.Misses", 0}}},
	} {
		got, err := bpfx.Fields(&c, tc.prefix, tc.naming)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Fields(%+v, %q) = %v, %v; want %v", tc.naming, tc.prefix, got, err, tc.want)
		}
	}
	if got, err := bpfx.Fields(uint64(5), "n", bpfx.Naming{}); err != nil || !slices.Equal(got, []bpfx.Counter{{"n", 5}}) {
		t.Errorf("Fields(scalar) = %v, %v", got, err)
	}
	if _, err := bpfx.Fields(struct{ F float64 }{}, "", bpfx.Naming{}); err == nil || !strings.Contains(err.Error(), "want an integer") {
		t.Errorf("Fields(float) error %v", err)
	}
	for in, want := range map[string]string{"SkipNoTcpTs": "skip_no_tcp_ts", "Cloned": "cloned", "x": "x"} {
		if got := bpfx.SnakeCase(in); got != want {
			t.Errorf("SnakeCase(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAddCounters(t *testing.T) {
	a := counters{SeenTotal: 1, Drops: [2]uint16{1, 0xffff}, In: inner{Misses: 2}}
	b := counters{SeenTotal: 2, Drops: [2]uint16{1, 1}, In: inner{Hits: 4, Misses: 1}}
	bpfx.AddCounters(&a, &b)
	if want := (counters{SeenTotal: 3, Drops: [2]uint16{2, 0}, In: inner{Hits: 4, Misses: 3}}); a != want {
		t.Errorf("AddCounters = %+v, want %+v (fields wrap in their width)", a, want)
	}
}

// TestSumPerCPU writes a different value on every CPU and reads the sums back.
func TestSumPerCPU(t *testing.T) {
	bpftest.RequireRoot(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 24, MaxEntries: 2})
	if err != nil {
		t.Fatalf("create map: %v", err)
	}
	defer m.Close()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	per := make([]counters, ncpu)
	var want counters
	for i := range per {
		per[i] = counters{SeenTotal: uint64(i + 1), Drops: [2]uint16{uint16(i), 1}, In: inner{Hits: 10}}
		bpfx.AddCounters(&want, &per[i])
	}
	if err := m.Put(uint32(1), per); err != nil {
		t.Fatalf("write per-CPU values: %v", err)
	}
	got, err := bpfx.SumPerCPU[counters](m, uint32(1))
	if err != nil || got != want {
		t.Errorf("SumPerCPU = %+v, %v; want %+v", got, err, want)
	}
	all, err := bpfx.SumPerCPUAll[counters](m)
	if err != nil || len(all) != 2 || all[1] != want || all[0] != (counters{}) {
		t.Errorf("SumPerCPUAll = %+v, %v", all, err)
	}
	if want.SeenTotal != uint64(ncpu*(ncpu+1)/2) {
		t.Fatalf("test setup: %d CPUs, sum %d", ncpu, want.SeenTotal)
	}

	for _, tc := range []struct {
		name string
		spec ebpf.MapSpec
		read func(*ebpf.Map) error
		want string
	}{
		{"not per-CPU", ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1},
			func(m *ebpf.Map) error { _, err := bpfx.SumPerCPU[uint64](m, uint32(0)); return err }, "not a per-CPU map"},
		{"value size", ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 1},
			func(m *ebpf.Map) error { _, err := bpfx.SumPerCPU[uint64](m, uint32(0)); return err }, "value type uint64 has 8 bytes"},
		{"key size", ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 8, ValueSize: 8, MaxEntries: 1},
			func(m *ebpf.Map) error { _, err := bpfx.SumPerCPUAll[uint64](m); return err }, "8-byte keys"},
		{"missing key", ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 4, ValueSize: 8, MaxEntries: 1},
			func(m *ebpf.Map) error { _, err := bpfx.SumPerCPU[uint64](m, uint32(0)); return err }, "read counters 0"},
	} {
		m, err := ebpf.NewMap(&tc.spec)
		if err != nil {
			t.Fatalf("%s: create map: %v", tc.name, err)
		}
		if err := tc.read(m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to mention %q", tc.name, err, tc.want)
		}
		m.Close()
	}
}

// extremes mirrors a C struct with per-CPU extremes:
// struct extremes { __u64 count; __u64 late_max_ns; __u64 period_min_ns; __s32 min; __u32 hist[2]; };
type extremes struct {
	_           structs.HostLayout
	Count       uint64
	LateMaxNs   uint64
	PeriodMinNs uint64
	Min         int32
	Hist        [2]uint32
}

func TestReduceCountersExtrema(t *testing.T) {
	for in, want := range map[string]bpfx.Reduction{"LateMaxNs": bpfx.Max, "Max": bpfx.Max, "PeriodMinNs": bpfx.MinNonZero,
		"MinRtt": bpfx.Add, "MaxNsCount": bpfx.Add, "Count": bpfx.Add, "": bpfx.Add} {
		if got := bpfx.Extrema(in); got != want {
			t.Errorf("Extrema(%q) = %v, want %v", in, got, want)
		}
	}
	// Three CPUs; the second never saw a period (min 0: not a minimum).
	per := []extremes{
		{Count: 2, LateMaxNs: 30, PeriodMinNs: 9, Min: 5, Hist: [2]uint32{1, 0}},
		{Count: 5, LateMaxNs: 10, PeriodMinNs: 0, Min: 0, Hist: [2]uint32{0, 3}},
		{Count: 1, LateMaxNs: 20, PeriodMinNs: 7, Min: 8, Hist: [2]uint32{1, 1}},
	}
	var got, sum extremes
	for i := range per {
		bpfx.ReduceCounters(&got, &per[i], bpfx.Extrema)
		bpfx.AddCounters(&sum, &per[i])
	}
	if want := (extremes{Count: 8, LateMaxNs: 30, PeriodMinNs: 7, Min: 5, Hist: [2]uint32{2, 4}}); got != want {
		t.Errorf("ReduceCounters(Extrema) = %+v, want %+v", got, want)
	}
	if want := (extremes{Count: 8, LateMaxNs: 60, PeriodMinNs: 16, Min: 13, Hist: [2]uint32{2, 4}}); sum != want {
		t.Errorf("AddCounters = %+v, want %+v", sum, want)
	}
	names, err := bpfx.Fields(got, "", bpfx.Naming{C: true, NoArrays: true})
	if want := []bpfx.Counter{{"count", 8}, {"late_max_ns", 30}, {"period_min_ns", 7}, {"min", 5}}; err != nil || !slices.Equal(names, want) {
		t.Errorf("Fields(NoArrays) = %v, %v; want %v", names, err, want)
	}
}
