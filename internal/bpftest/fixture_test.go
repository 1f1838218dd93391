package bpftest

import (
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest/selftest"
)

// loadFixture loads bpf/bpftest/fixture.bpf.c, with its clock fixed or not.
func loadFixture(tb testing.TB, fixed bool) *selftest.FixtureObjects {
	tb.Helper()
	RequireRoot(tb)
	spec, err := selftest.LoadFixture()
	if err != nil {
		tb.Fatalf("load fixture spec: %v", err)
	}
	if fixed {
		if err := FixClock(spec); err != nil {
			tb.Fatal(err)
		}
	}
	objs := new(selftest.FixtureObjects)
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		tb.Fatalf("load fixture objects: %v", err)
	}
	tb.Cleanup(func() { objs.Close() })
	return objs
}

func fixtureRunner(objs *selftest.FixtureObjects) Runner {
	return Runner{
		Prog:     objs.Stamp,
		Counters: func() (Counters, error) { return SumPerCPU[selftest.FixtureFixtureCounters](objs.Counters) },
		Reset: func(tb testing.TB) {
			tb.Helper()
			seen, err := Entries[uint32, uint64](objs.Seen)
			if err != nil {
				tb.Fatal(err)
			}
			for k := range seen {
				if err := objs.Seen.Delete(k); err != nil {
					tb.Fatalf("clear seen: %v", err)
				}
			}
		},
		Clock: objs.KedgeClockNs,
	}
}

// frame is an Ethernet header and 8 bytes of 0xee: the program writes its time over them.
var frame = append(make([]byte, 14), 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee)

// stamped is frame as the program leaves it at time now.
func stamped(now uint64) []byte {
	out := append([]byte(nil), frame...)
	binary.NativeEndian.PutUint64(out[14:], now)
	return out
}

// TestRunnerFixture runs the self-test program through every kind of expectation, at
// injected times.
func TestRunnerFixture(t *testing.T) {
	objs := loadFixture(t, true)
	r := fixtureRunner(objs)
	const ms = uint64(time.Millisecond)
	t0 := ClockStart + 7*ms
	r.Run(t, []Case{
		{
			Name: "stamps the injected time, records it under the mark, bumps the mark", In: frame, Now: t0,
			Skb: &SkBuff{Mark: 3}, WantRet: TCActOK, WantOut: stamped(t0), WantMark: Mark(4),
			WantCounters: Counters{"Stamped": 1},
			WantMaps:     []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{3: t0}}},
			Check: func(tb testing.TB, r Result) {
				if r.Now != t0 || r.Skb.Mark != 4 {
					tb.Errorf("result now %d mark %d, want %d and 4", r.Now, r.Skb.Mark, t0)
				}
			},
		},
		{
			Name: "a case without Now runs at ClockStart; Reset cleared the previous case's entry", In: frame,
			WantRet: TCActOK, WantOut: stamped(ClockStart), WantCounters: Counters{"Stamped": 1},
			WantMaps: []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{0: ClockStart}}},
		},
		{
			Name: "short frame dropped, unchanged, counted", In: frame[:20], WantRet: TCActShot, WantSame: true,
			WantCounters: Counters{"ShortFrame": 1}, WantMaps: []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{}}},
		},
		{
			Name: "setup state is there for the run",
			Setup: func(tb testing.TB) {
				if err := objs.Seen.Put(uint32(9), uint64(1)); err != nil {
					tb.Fatal(err)
				}
			},
			In: frame, Skb: &SkBuff{Mark: 5}, Now: t0, WantRet: TCActOK, WantOut: stamped(t0), WantMark: Mark(6),
			WantMaps: []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{9: 1, 5: t0}}},
		},
		{
			Name: "steps share state, each at its own time; a step without Now keeps the previous time",
			Steps: []Case{
				{Name: "request", In: frame, Skb: &SkBuff{Mark: 1}, Now: t0, WantRet: TCActOK, WantOut: stamped(t0)},
				{Name: "reply", In: frame, Skb: &SkBuff{Mark: 2}, Now: t0 + 5*ms, WantRet: TCActOK, WantOut: stamped(t0 + 5*ms)},
				{Name: "again", In: frame, Skb: &SkBuff{Mark: 3}, WantRet: TCActOK, WantOut: stamped(t0 + 5*ms)},
				{Name: "runt", In: frame[:14], WantRet: TCActShot, WantCounters: Counters{"ShortFrame": 1}},
			},
			WantCounters: Counters{"Stamped": 3, "ShortFrame": 1},
			WantMaps:     []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{1: t0, 2: t0 + 5*ms, 3: t0 + 5*ms}}},
			Check: func(tb testing.TB, r Result) {
				seen, err := Entries[uint32, uint64](objs.Seen)
				if err != nil {
					tb.Fatal(err)
				}
				if rtt := seen[2] - seen[1]; rtt != 5*ms {
					tb.Errorf("time between request and reply %d ns, want exactly %d", rtt, 5*ms)
				}
				if r.Ret != TCActShot {
					tb.Errorf("Check got the result of verdict %d, want the last step's", int32(r.Ret))
				}
			},
		},
	})
}

// TestRunnerFixtureReports checks that map and step expectations are enforced.
func TestRunnerFixtureReports(t *testing.T) {
	objs := loadFixture(t, true)
	r := fixtureRunner(objs)
	for _, tc := range []struct {
		name string
		c    Case
		want string
	}{
		{"map value", Case{In: frame, Now: 10, WantRet: TCActOK, WantMaps: []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{0: 11}}}},
			"0: 10, want 11"},
		{"map entry absent", Case{In: frame, WantRet: TCActOK, WantMaps: []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{0: ClockStart, 1: 2}}}},
			"1: absent, want 2"},
		{"map entry unexpected", Case{In: frame, WantRet: TCActOK, WantMaps: []MapWant{{Map: objs.Seen, Want: map[uint32]uint64{}}}},
			"0: 1000000000000, want absent"},
		{"map of the wrong type", Case{In: frame, WantRet: TCActOK, WantMaps: []MapWant{{Map: objs.Seen, Want: map[uint64]uint64{}}}},
			"read map"},
		{"want not a map", Case{In: frame, WantRet: TCActOK, WantMaps: []MapWant{{Map: objs.Seen, Want: 3}}}, "a Go map of its entries"},
		{"mark", Case{In: frame, WantRet: TCActOK, WantMark: Mark(0)}, "skb mark 0x1 after the run, want 0x0"},
		{"output and same", Case{In: frame, WantRet: TCActOK, WantOut: frame, WantSame: true}, "both WantOut and WantSame"},
		{"no packet", Case{WantRet: TCActOK, Steps: []Case{{Name: "empty"}}}, "has no packet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			if _, err := r.exec(rec, tc.c, ""); err != nil {
				rec.Errorf("%v", err)
			}
			if !strings.Contains(rec.String(), tc.want) {
				t.Errorf("reported %q, want it to mention %q", rec.String(), tc.want)
			}
		})
	}
}

// TestRealClock: without FixClock, kedge_now() is the kernel's CLOCK_MONOTONIC.
func TestRealClock(t *testing.T) {
	objs := loadFixture(t, false)
	var before, after unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &before); err != nil {
		t.Fatal(err)
	}
	res, err := Run(objs.Stamp, frame)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &after); err != nil {
		t.Fatal(err)
	}
	got := binary.NativeEndian.Uint64(res.Out[14:])
	if got < uint64(before.Nano()) || got > uint64(after.Nano()) {
		t.Errorf("program read %d, want CLOCK_MONOTONIC between %d and %d", got, before.Nano(), after.Nano())
	}
}

func TestFixClockNeedsClockHeader(t *testing.T) {
	err := FixClock(&ebpf.CollectionSpec{Variables: map[string]*ebpf.VariableSpec{}})
	if err == nil || !strings.Contains(err.Error(), "include clock.h") {
		t.Errorf("FixClock on an object without clock.h: %v, want an error naming clock.h", err)
	}
}

// TestSkBuffLayout: SkBuff's fields sit where the running kernel's struct __sk_buff has them,
// and the kernel's struct is no longer (a shorter ctx_out fails a run with ENOSPC).
func TestSkBuffLayout(t *testing.T) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Skipf("no kernel BTF: %v", err)
	}
	var s *btf.Struct
	if err := spec.TypeByName("__sk_buff", &s); err != nil {
		t.Fatalf("find struct __sk_buff in kernel BTF: %v", err)
	}
	if size := reflect.TypeFor[SkBuff]().Size(); uint32(size) < s.Size {
		t.Errorf("SkBuff has %d bytes, the kernel's __sk_buff %d", size, s.Size)
	}
	goName := map[string]string{"mark": "Mark", "priority": "Priority", "ingress_ifindex": "IngressIfindex",
		"ifindex": "Ifindex", "cb": "CB", "tstamp": "Tstamp", "wire_len": "WireLen", "gso_segs": "GSOSegs",
		"gso_size": "GSOSize", "tstamp_type": "TstampType", "hwtstamp": "HWTstamp", "len": "Len", "protocol": "Protocol"}
	checked := 0
	for _, m := range s.Members {
		name, ok := goName[m.Name]
		if !ok {
			continue
		}
		f, _ := reflect.TypeFor[SkBuff]().FieldByName(name)
		if uint32(f.Offset) != m.Offset.Bytes() {
			t.Errorf("SkBuff.%s at offset %d, the kernel's %s at %d", name, f.Offset, m.Name, m.Offset.Bytes())
		}
		checked++
	}
	if checked < 11 { // every field before tstamp_type (5.18) and hwtstamp (5.16)
		t.Errorf("checked %d fields of the kernel's __sk_buff, want at least 11", checked)
	}
}

// BenchmarkRunner runs a fixture table as benchmarks (katran's reuse of the fixtures).
func BenchmarkRunner(b *testing.B) {
	objs := loadFixture(b, true)
	r := fixtureRunner(objs)
	r.Bench(b, []Case{
		{Name: "stamp", In: frame, Now: ClockStart + 1, WantRet: TCActOK},
		{Name: "short", In: frame[:14], WantRet: TCActShot},
	})
}

// TestClockCostsNothingInProduction: the verifier resolves kedge_now()'s test at load time
// (kedge_clock_fixed is a frozen constant) and removes the branch not taken: the production
// program makes one more helper call (bpf_ktime_get_ns) and reads one map value fewer
// (kedge_clock_ns) than the fixed-clock one, and neither keeps both.
func TestClockCostsNothingInProduction(t *testing.T) {
	count := func(fixed bool) (calls, valueLoads int) {
		info, err := loadFixture(t, fixed).Stamp.Info()
		if err != nil {
			t.Fatal(err)
		}
		insns, err := info.Instructions()
		if err != nil {
			t.Skipf("translated instructions unavailable: %v", err)
		}
		for _, ins := range insns {
			switch {
			case ins.IsBuiltinCall():
				calls++
			case ins.IsLoadFromMap() && ins.Src == asm.PseudoMapValue:
				valueLoads++
			}
		}
		return calls, valueLoads
	}
	pc, pv := count(false)
	fc, fv := count(true)
	if pc != fc+1 || pv+1 != fv {
		t.Errorf("production program: %d helper calls, %d map-value loads; fixed clock: %d and %d; want one call more and one load fewer in production",
			pc, pv, fc, fv)
	}
}
