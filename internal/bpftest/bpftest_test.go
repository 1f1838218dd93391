package bpftest

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"structs"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

func TestMain(m *testing.M) { os.Exit(CheckFDLeaks(m)) }

// counters mirrors a C struct { __u64 seen; __u64 grown; __u16 drops[2]; __u32 _pad; } the
// way bpf2go generates it.
type counters struct {
	_     structs.HostLayout
	Seen  uint64
	Grown uint64
	Drops [2]uint16
	_     [4]byte
}

const (
	offGrown = 8
	offDrop1 = 18
)

func newMap(t *testing.T, typ ebpf.MapType, valueSize, entries uint32) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: 4, ValueSize: valueSize, MaxEntries: entries})
	if err != nil {
		t.Fatalf("create map: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// bumpInsns looks up key (a constant) in m and adds 1 to the size-byte counter at off.
// Clobbers R0-R5; leaves R6 (the context) alone.
func bumpInsns(m *ebpf.Map, key int32, off int16, size asm.Size, label string) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.R10, -4, int64(key), asm.Word),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, label),
		asm.LoadMem(asm.R1, asm.R0, off, size),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, off, asm.R1, size),
		asm.Mov.Imm(asm.R0, 0).WithSymbol(label),
	}
}

// growXDP prepends 4 bytes to the packet (bpf_xdp_adjust_head), counts Grown and Drops[1]
// in the struct counter map and returns XDP_TX.
func growXDP(t *testing.T, m *ebpf.Map) *ebpf.Program {
	t.Helper()
	insns := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	insns = append(insns, bumpInsns(m, 0, offGrown, asm.DWord, "no_grown")...)
	insns = append(insns, bumpInsns(m, 0, offDrop1, asm.Half, "no_drop")...)
	insns = append(insns,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, -4),
		asm.FnXdpAdjustHead.Call(),
		asm.Mov.Imm(asm.R0, XDPTx),
		asm.Return(),
	)
	return newProg(t, ebpf.XDP, insns)
}

// countTC adds 1 to entry 2 of a per-CPU u64 array and returns TC_ACT_UNSPEC.
func countTC(t *testing.T, m *ebpf.Map) *ebpf.Program {
	t.Helper()
	insns := bumpInsns(m, 2, 0, asm.DWord, "out")
	insns = append(insns, asm.Mov.Imm(asm.R0, -1), asm.Return())
	return newProg(t, ebpf.SchedCLS, insns)
}

func newProg(t *testing.T, typ ebpf.ProgramType, insns asm.Instructions) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: typ, Instructions: insns, License: "Dual BSD/GPL"})
	if err != nil {
		t.Fatalf("load program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestRunnerXDP(t *testing.T) {
	RequireRoot(t)
	m := newMap(t, ebpf.PerCPUArray, 24, 1)
	r := Runner{
		Prog:     growXDP(t, m),
		Counters: func() (Counters, error) { return SumPerCPU[counters](m) },
	}
	in := bytes.Repeat([]byte{0xAB}, 60)
	r.Run(t, []Case{
		{
			Name:         "grows by four bytes",
			In:           in,
			WantRet:      XDPTx,
			WantOut:      append(make([]byte, 4), in...), // test-run headroom is zeroed
			WantCounters: Counters{"Grown": 1, "Drops[1]": 1},
		},
		{
			Name:    "check func sees the output",
			In:      in[:14],
			WantRet: XDPTx,
			Check: func(tb testing.TB, r Result) {
				if len(r.Out) != 18 || !bytes.Equal(r.Out[4:], in[:14]) {
					tb.Errorf("output %x, want 4 bytes then the input", r.Out)
				}
			},
		},
	})
}

func TestRunnerTCScalarCounters(t *testing.T) {
	RequireRoot(t)
	m := newMap(t, ebpf.PerCPUArray, 8, 3)
	r := Runner{
		Prog:     countTC(t, m),
		Counters: func() (Counters, error) { return SumPerCPU[uint64](m) },
	}
	r.Run(t, []Case{{Name: "counts entry 2", In: make([]byte, 14), WantRet: TCActUnspec, WantCounters: Counters{"2": 1}}})

	got, err := SumPerCPU[uint64](m)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Counters{"0": 0, "1": 0, "2": 1}); got.Diff(want) != "" || len(got) != 3 {
		t.Errorf("SumPerCPU = %v, want %v", got, want)
	}
}

// TestRunnerReportsFailures runs failing cases against a fake testing.T and checks that each
// expectation is enforced.
func TestRunnerReportsFailures(t *testing.T) {
	RequireRoot(t)
	m := newMap(t, ebpf.PerCPUArray, 8, 3)
	r := Runner{Prog: countTC(t, m), Counters: func() (Counters, error) { return SumPerCPU[uint64](m) }}
	grow := growXDP(t, newMap(t, ebpf.PerCPUArray, 24, 1))
	in := make([]byte, 14)
	for _, tc := range []struct {
		name string
		c    Case
		want string
	}{
		{"verdict", Case{In: in, WantRet: TCActOK}, "verdict TC_ACT_UNSPEC, want TC_ACT_OK"},
		{"output", Case{In: in, WantRet: TCActUnspec, WantOut: []byte{1}}, "output packet differs"},
		{"counter value", Case{In: in, WantRet: TCActUnspec, WantCounters: Counters{"2": 2}}, "2: 1, want 2"},
		{"unexpected counter", Case{In: in, WantRet: TCActUnspec, WantCounters: Counters{"1": 1}}, "2: 1, want 0"},
		{"counters without reader", Case{In: in, WantRet: TCActUnspec, WantCounters: Counters{}}, "no Counters reader"},
		{"same packet", Case{In: in, WantRet: TCActUnspec, WantSame: true}, ""},
		{"changed packet", Case{Prog: grow, In: in, WantRet: XDPTx, WantSame: true}, "the program changed the packet"},
		{"xdp verdict", Case{Prog: grow, In: in, WantRet: XDPPass}, "verdict XDP_TX, want XDP_PASS"},
		{"mark on xdp", Case{Prog: grow, In: in, WantRet: XDPTx, WantMark: Mark(1)}, "skb context"},
		{"now without clock", Case{In: in, WantRet: TCActUnspec, Now: 5}, "no Clock"},
		{"in and steps", Case{In: in, Steps: []Case{{In: in}}}, "both In and Steps"},
		{"nested steps", Case{Steps: []Case{{Steps: []Case{{In: in}}}}}, "steps of its own"},
		{"step verdict", Case{Steps: []Case{{In: in, WantRet: TCActUnspec}, {Name: "second", In: in, WantRet: TCActShot}}}, "step 1 (second): verdict TC_ACT_UNSPEC, want TC_ACT_SHOT"},
		{"sequence counters", Case{Steps: []Case{{In: in, WantRet: TCActUnspec}, {In: in, WantRet: TCActUnspec}},
			WantCounters: Counters{"2": 1}}, "after the last step: counter changes differ (got, want):\n  2: 2, want 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			rr := r
			if tc.name == "counters without reader" {
				rr.Counters = nil
			}
			if _, err := rr.exec(rec, tc.c, ""); err != nil {
				rec.Errorf("%v", err)
			}
			if !strings.Contains(rec.String(), tc.want) || (tc.want == "") != (rec.Len() == 0) {
				t.Errorf("reported %q, want it to mention %q", rec.String(), tc.want)
			}
		})
	}
}

func TestSumPerCPUErrors(t *testing.T) {
	RequireRoot(t)
	for _, tc := range []struct {
		name string
		m    *ebpf.Map
		read func(*ebpf.Map) (Counters, error)
		want string
	}{
		{"not per-CPU", newMap(t, ebpf.Array, 8, 1), SumPerCPU[uint64], "not a per-CPU map"},
		{"wrong value size", newMap(t, ebpf.PerCPUArray, 16, 1), SumPerCPU[uint64], "value type uint64 has 8 bytes"},
		{"non-integer field", newMap(t, ebpf.PerCPUArray, 8, 1), SumPerCPU[struct{ F float64 }], "want an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.read(tc.m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestCountersArithmetic(t *testing.T) {
	before := Counters{"a": 1, "b": 5, "gone": 2}
	after := Counters{"a": 4, "b": 5, "new": 7}
	d := after.Sub(before)
	if want := (Counters{"a": 3, "b": 0, "gone": -2, "new": 7}); !mapsEqual(d, want) {
		t.Errorf("Sub = %v, want %v", d, want)
	}
	if diff := d.Diff(Counters{"a": 3, "gone": -2, "new": 7}); diff != "" {
		t.Errorf("Diff of equal sets (b: 0 implied) = %q", diff)
	}
	if diff := d.Diff(Counters{"a": 3, "gone": -2, "new": 7, "x": 1}); diff != "  x: 0 (absent), want 1" {
		t.Errorf("Diff = %q", diff)
	}
	got, err := Delta(func() (Counters, error) { return Counters{"n": 1}, nil }, func() error { return nil })
	if err != nil || got["n"] != 0 {
		t.Errorf("Delta = %v, %v", got, err)
	}
	base := Counters{"a": 1, "b": 2}
	if w := base.With(Counters{"b": 3, "c": 4}); !mapsEqual(w, Counters{"a": 1, "b": 3, "c": 4}) || !mapsEqual(base, Counters{"a": 1, "b": 2}) {
		t.Errorf("With = %v (base now %v), want a new map with b replaced and c added", w, base)
	}
}

func TestSeq(t *testing.T) {
	var order []int
	Seq(func(testing.TB) { order = append(order, 1) }, func(testing.TB) { order = append(order, 2) })(t)
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Errorf("Seq ran %v, want [1 2]", order)
	}
}

func TestLeaked(t *testing.T) {
	before, err := openFDs()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	after, err := openFDs()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	leaks := leaked(before, after)
	if len(leaks) != 1 || !strings.HasSuffix(leaks[0], "/status") {
		t.Errorf("leaked = %q, want the one file opened", leaks)
	}
	if l := leaked(after, after); l != nil {
		t.Errorf("leaked(x, x) = %q", l)
	}
}

func TestDiffBytes(t *testing.T) {
	got := DiffBytes([]byte{1, 2, 3}, []byte{1, 9})
	if !strings.Contains(got, "3 bytes, want 2; first difference at offset 1") {
		t.Errorf("DiffBytes = %q", got)
	}
}

// recorder collects what a Runner reports instead of failing the test.
type recorder struct {
	testing.TB
	strings.Builder
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	fmt.Fprintf(&r.Builder, format+"\n", args...)
}

func mapsEqual(a, b Counters) bool {
	ka, kb := keys(a), keys(b)
	if !slices.Equal(ka, kb) {
		return false
	}
	for k := range a {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

func keys(c Counters) []string {
	var out []string
	for k := range c {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
