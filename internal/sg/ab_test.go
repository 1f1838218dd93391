package sg

// TestMeasureGatherAB measures what multi-packet replies cost the single-packet path: the
// average BPF_PROG_TEST_RUN run time of sg_gather for single-packet replies, with another
// build of the object (KEDGE_SG_AB_OLD, e.g. main's internal/sg/sg_bpfel.o before the
// parts path) against this one, alternating in one run. It prints figures and asserts
// nothing about time; without KEDGE_SG_AB_OLD it is skipped.
//
//	git show 18b069a:internal/sg/sg_bpfel.o > /tmp/sg-old.o
//	KEDGE_SG_AB_OLD=/tmp/sg-old.o go test -count=1 -run TestMeasureGatherAB -v ./internal/sg

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpftest"
)

// abSide is sg_gather and the maps it needs, loaded from one object.
type abSide struct {
	name                                   string
	Gather                                 *ebpf.Program
	Groups, Workers, Slots, Results, Stats *ebpf.Map
	ring                                   *Ring
}

func loadABSide(t *testing.T, name string, spec *ebpf.CollectionSpec) *abSide {
	t.Helper()
	if m, ok := spec.Maps["parts"]; ok {
		m.MaxEntries = 64 * uint32(len(w4)) // the "MultiPacket group" case looks a real entry up
	}
	var o struct {
		Gather  *ebpf.Program `ebpf:"sg_gather"`
		Groups  *ebpf.Map     `ebpf:"groups"`
		Workers *ebpf.Map     `ebpf:"workers"`
		Slots   *ebpf.Map     `ebpf:"slots"`
		Results *ebpf.Map     `ebpf:"results"`
		Stats   *ebpf.Map     `ebpf:"stats"`
	}
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	s := &abSide{name: name, Gather: o.Gather, Groups: o.Groups, Workers: o.Workers, Slots: o.Slots, Results: o.Results, Stats: o.Stats}
	rd, err := OpenRing(s.Results)
	if err != nil {
		t.Fatal(err)
	}
	s.ring = rd
	t.Cleanup(func() {
		rd.Close()
		for _, c := range []interface{ Close() error }{s.Gather, s.Groups, s.Workers, s.Slots, s.Results, s.Stats} {
			c.Close()
		}
	})
	return s
}

func TestMeasureGatherAB(t *testing.T) {
	oldPath := os.Getenv("KEDGE_SG_AB_OLD")
	if oldPath == "" {
		t.Skip("KEDGE_SG_AB_OLD (the other sg object) not set: a measurement, run by hand")
	}
	bpftest.RequireRoot(t)
	oldSpec, err := ebpf.LoadCollectionSpec(oldPath)
	if err != nil {
		t.Fatal(err)
	}
	newSpec, err := loadSg()
	if err != nil {
		t.Fatal(err)
	}
	rounds, runs := envInt("KEDGE_SG_AB_ROUNDS", 10), envInt("KEDGE_SG_AB_RUNS", 2000)
	sides := []*abSide{loadABSide(t, "old", oldSpec), loadABSide(t, "new", newSpec)}
	type kase struct {
		name  string
		elems uint16
		need  uint16
		dup   bool // the worker answered already: the duplicate path, no reset
		flags uint16
	}
	// The last case is a single-packet reply in a MultiPacket group (GroupFlagParts: one
	// parts-map lookup); an object without the flag ignores it.
	cases := []kase{{"reduce 4 x int64", 4, 3, false, 0}, {"complete 4 x int64", 4, 1, false, 0},
		{"reduce 128 x int64", 128, 3, false, 0}, {"duplicate 4 x int64", 4, 3, true, 0},
		{"reduce 4, MultiPacket", 4, 3, false, GroupFlagParts}}
	id := uint64(5)<<10 | 9
	// per[case][side]: per-run nanoseconds, every round's.
	per := make([][][]float64, len(cases))
	for ci := range per {
		per[ci] = make([][]float64, len(sides))
	}
	for round := range rounds {
		for k := range sides {
			s := sides[(k+round)%len(sides)] // alternate which side goes first
			si := slices.Index(sides, s)
			for ci, c := range cases {
				g := GroupCfg{Enabled: 1, Family: 4, Reduce: RedSum, Dtype: TypeI64, Nworkers: uint16(len(w4)), Elems: c.elems,
					Nslots: 64, Ifindex: 1, TimeoutNs: 1e9, CoordPort: swap16(coord4.Port()), Flags: c.flags}
				g.CoordAddr.In6U.U6Addr8 = mapped(coord4.Addr())
				for i, w := range w4 {
					wc := WorkerCfg{Port: swap16(w.Port())}
					wc.Addr.In6U.U6Addr8 = mapped(w.Addr())
					must(t, s.Workers.Put(uint32(i), &wc))
				}
				must(t, s.Groups.Put(uint32(0), &g))
				v := make([]int64, c.elems)
				for j := range v {
					v[j] = int64(j)
				}
				frame := reply(w4[0], coord4, 0, 0, id, vec64(v...), nil)
				var slot SlotRec
				slot.State, slot.DeadlineNs = SlotPending, 1<<62
				slot.Res.ReqId, slot.Res.Slot, slot.Res.Need = id, uint16(id&SlotMask), c.need
				must(t, s.Slots.Put(uint32(id&SlotMask), &slot))
				if c.dup {
					if _, err := bpftest.Run(s.Gather, frame); err != nil {
						t.Fatal(err)
					}
					ret, d, err := s.Gather.Benchmark(frame, runs, nil)
					if err != nil || ret != bpftest.XDPDrop {
						t.Fatalf("%s %s: verdict %d err %v", s.name, c.name, ret, err)
					}
					per[ci][si] = append(per[ci][si], float64(d.Nanoseconds()))
					continue
				}
				for range runs {
					must(t, s.Slots.Put(uint32(id&SlotMask), &slot))
					ret, d, err := s.Gather.Benchmark(frame, 1, nil)
					if err != nil || ret != bpftest.XDPDrop {
						t.Fatalf("%s %s: verdict %d err %v", s.name, c.name, ret, err)
					}
					per[ci][si] = append(per[ci][si], float64(d.Nanoseconds()))
					for _, ok := s.ring.Read(nil); ok; _, ok = s.ring.Read(nil) {
					}
				}
			}
		}
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "sg_gather single-packet reply, BPF_PROG_TEST_RUN ns per run (%d rounds alternating; duplicate: %d repeats per round, others: %d runs of 1 per round)\n", rounds, runs, runs)
	fmt.Fprintf(&out, "%-22s %10s %10s %10s %10s %8s\n", "case", "old mean", "new mean", "old p50", "new p50", "new/old")
	for ci, c := range cases {
		o, n := per[ci][0], per[ci][1]
		fmt.Fprintf(&out, "%-22s %10.1f %10.1f %10.0f %10.0f %8.3f\n", c.name, mean(o), mean(n), bench.Median(o), bench.Median(n), mean(n)/mean(o))
	}
	t.Log("\n" + out.String())
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
