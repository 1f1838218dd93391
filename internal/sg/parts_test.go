package sg

// BPF_PROG_TEST_RUN fixtures for multi-packet replies (bpf/sg/parts.h): parts in and out
// of order mixed with single-packet replies, every reduction, IPv4 and IPv6; duplicate,
// mismatched, out-of-range and over-limit parts; a missing part (timeout with the right
// bitmap and the partial count); late parts; a part for a recycled slot.

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
)

var w6p = append(append([]netip.AddrPort(nil), w6...), netip.MustParseAddrPort("[2001:db8::12]:9002"))

// newPartsFixture is newFixture with the parts map sized for group gid (64 slots x its
// workers) and GroupFlagParts set.
func newPartsFixture(t testing.TB, gid uint32, coord netip.AddrPort, workers []netip.AddrPort, red, typ uint8, elems uint16) *fixture {
	t.Helper()
	bpftest.RequireRoot(t)
	f := newFixtureWith(t, LoadOptions{Tier: DetectTier(), PartEntries: uint32(64 * len(workers))}, gid, coord, workers, red, typ, elems, 0)
	var g GroupCfg
	if err := f.o.Groups.Lookup(gid, &g); err != nil {
		t.Fatal(err)
	}
	g.Flags |= GroupFlagParts
	if err := f.o.Groups.Put(gid, &g); err != nil {
		t.Fatal(err)
	}
	return f
}

// part builds part p of nparts of worker w's reply carrying its slice of v.
func part(from, to netip.AddrPort, gid, w uint16, id uint64, typ uint8, v []int64, p, nparts int) []byte {
	off, n, ok := PartSlice(len(v), nparts, p)
	if !ok {
		panic("bad part")
	}
	return reply(from, to, gid, w, id, AppendVector(nil, typ, v[off:off+n]), func(h *Header) {
		h.Part, h.NParts = uint16(p), uint16(nparts)
	})
}

func runDrop(t *testing.T, f *fixture, what string, frame []byte) {
	t.Helper()
	res, err := bpftest.Run(f.o.Gather, frame)
	if err != nil || res.Ret != bpftest.XDPDrop {
		t.Fatalf("%s: verdict %d err %v", what, res.Ret, err)
	}
}

func TestGatherParts(t *testing.T) {
	vecs := [][]int64{{5, -7, 9, 1, 100}, {3, 8, 10, -4, 2}, {4, 0, -1, 7, -50}}
	cases := []struct {
		name     string
		red, typ uint8
		want     []int64
	}{
		{"sum int64", RedSum, TypeI64, []int64{12, 1, 18, 4, 52}},
		{"sum int32", RedSum, TypeI32, []int64{12, 1, 18, 4, 52}},
		{"min int32", RedMin, TypeI32, []int64{3, -7, -1, -4, -50}},
		{"min int64", RedMin, TypeI64, []int64{3, -7, -1, -4, -50}},
		{"max int32", RedMax, TypeI32, []int64{5, 8, 10, 7, 100}},
		{"max int64", RedMax, TypeI64, []int64{5, 8, 10, 7, 100}},
		{"count", RedCount, TypeI32, nil},
	}
	for _, fam := range []struct {
		name    string
		coord   netip.AddrPort
		workers []netip.AddrPort
	}{{"IPv4", coord4, w4}, {"IPv6", coord6, w6p}} {
		// One load per family: each case reconfigures the group and uses its own slots.
		f := newPartsFixture(t, 1, fam.coord, fam.workers, RedSum, TypeI64, 5)
		for ci, c := range cases {
			t.Run(fam.name+"/"+c.name, func(t *testing.T) {
				ws := fam.workers
				var g GroupCfg
				must(t, f.o.Groups.Lookup(uint32(1), &g))
				g.Reduce, g.Dtype = c.red, c.typ
				must(t, f.o.Groups.Put(uint32(1), &g))
				before, err := f.o.SumStats(1)
				must(t, err)
				// Two orders: parts before the single-packet reply (min/max start at
				// the identity) and after it (a whole reply set every element first).
				for k, singleFirst := range []bool{false, true} {
					id := uint64(11+k)<<10 | 64 + uint64(2*ci+k)
					f.arm(t, 1, id, 3)
					p := func(w, i, n int) []byte {
						return part(ws[w], fam.coord, 1, uint16(w), id, c.typ, vecs[w], i, n)
					}
					single := reply(ws[2], fam.coord, 1, 2, id, AppendVector(nil, c.typ, vecs[2]), nil)
					seq := [][]byte{p(1, 2, 3), p(0, 0, 2), p(1, 0, 3), p(0, 1, 2), single}
					if singleFirst {
						seq = [][]byte{single, p(1, 2, 3), p(0, 1, 2), p(1, 0, 3), p(0, 0, 2)}
					}
					for i, fr := range seq {
						runDrop(t, f, "reply "+string(rune('a'+i)), fr)
					}
					f.noResult(t)
					s := f.slot(t, id)
					if s.Res.Count != 2 || s.Res.Bitmap[0] != 0b101 || s.Res.Partial != 1 {
						t.Fatalf("before the last part: count %d bitmap %b partial %d", s.Res.Count, s.Res.Bitmap[0], s.Res.Partial)
					}
					r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
					r.Run(t, []bpftest.Case{{Name: "worker 1's last part completes", In: p(1, 1, 3), WantRet: bpftest.XDPDrop,
						WantCounters: bpftest.Counters{"1.Parts": 1, "1.Replies": 1, "1.Completed": 1}}})
					res := f.result(t)
					if res.Status != StatusOK || res.Count != 3 || res.Bitmap[0] != 0b111 || res.Partial != 0 || res.Flags != FlagParts {
						t.Fatalf("result: status %d count %d bitmap %b partial %d flags %#x", res.Status, res.Count, res.Bitmap[0], res.Partial, res.Flags)
					}
					if c.want != nil && !equal(res.Agg[:5], c.want) {
						t.Fatalf("aggregate %v, want %v", res.Agg[:5], c.want)
					}
					st, err := f.o.SumStats(1)
					st.Parts, st.Replies, st.Completed = st.Parts-before.Parts, st.Replies-before.Replies, st.Completed-before.Completed
					if n := uint64(k + 1); err != nil || st.Parts != 5*n || st.Replies != 3*n || st.Completed != n {
						t.Fatalf("counters parts %d replies %d completed %d (%v)", st.Parts, st.Replies, st.Completed, err)
					}
				}
			})
		}
	}
}

func TestGatherPartsRejected(t *testing.T) {
	f := newPartsFixture(t, 1, coord4, w4, RedSum, TypeI64, 5)
	id := uint64(12)<<10 | 67
	f.arm(t, 1, id, 3)
	v := []int64{1, 2, 3, 4, 5}
	p := func(w, i, n int) []byte { return part(w4[w], coord4, 1, uint16(w), id, TypeI64, v, i, n) }
	withHdr := func(w int, payload []byte, mod func(*Header)) []byte {
		return reply(w4[w], coord4, 1, uint16(w), id, payload, mod)
	}
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	r.Run(t, []bpftest.Case{
		{Name: "first part", In: p(0, 0, 2), WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Parts": 1}},
		{Name: "duplicate part dropped", In: p(0, 0, 2), WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.PartDups": 1}},
		{Name: "nparts differing from the worker's first part dropped", In: p(0, 1, 3),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.PartMismatch": 1}},
		{Name: "part >= nparts passed", In: withHdr(1, vec64(1, 2), func(h *Header) { h.Part, h.NParts = 2, 2 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.BadParts": 1}},
		{Name: "nparts over the limit passed", In: withHdr(1, vec64(1), func(h *Header) { h.Part, h.NParts = 0, PartsMax+1 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.BadParts": 1}},
		{Name: "empty part (slice beyond the vector) passed", In: withHdr(1, nil, func(h *Header) { h.Part, h.NParts = 3, 4 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.BadParts": 1}},
		{Name: "payload longer than its slice passed", In: withHdr(1, vec64(1, 2, 3, 4), func(h *Header) { h.Part, h.NParts = 0, 2 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.BadParts": 1}},
		{Name: "frame truncated inside the part passed", In: truncated(withHdr(1, vec64(1, 2, 3), func(h *Header) { h.Part, h.NParts = 0, 2 }), 42+32+12),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "worker error in a part dropped", In: withHdr(1, vec64(1, 2, 3), func(h *Header) { h.Part, h.NParts, h.Status = 0, 2, 5 }),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.WorkerErrors": 1}},
		{Name: "part of another request in the slot dropped", In: part(w4[1], coord4, 1, 1, id+1<<10, TypeI64, v, 0, 2),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Stale": 1}},
		{Name: "part from an unregistered port passed", In: part(netip.AddrPortFrom(w4[1].Addr(), 1), coord4, 1, 1, id, TypeI64, v, 0, 2),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "single packet of a worker with parts in the aggregate dropped", In: withHdr(0, vec64(v...), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.PartMismatch": 1}},
		{Name: "single packet of a worker without parts", In: withHdr(2, vec64(v...), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
		{Name: "part of a worker that answered in full dropped", In: p(2, 0, 2),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.PartDups": 1}},
	})
	s := f.slot(t, id)
	if s.Res.Count != 1 || s.Res.Bitmap[0] != 0b100 || s.Res.Partial != 1 || !equal(s.Res.Agg[:5], []int64{2, 4, 6, 4, 5}) {
		t.Fatalf("slot: count %d bitmap %b partial %d agg %v", s.Res.Count, s.Res.Bitmap[0], s.Res.Partial, s.Res.Agg[:5])
	}

	// Groups that take single packets only: without the flag, and gather.
	for _, c := range []struct {
		name string
		mod  func(*GroupCfg)
	}{
		{"group without the parts flag", func(g *GroupCfg) { g.Flags &^= GroupFlagParts }},
		{"gather group", func(g *GroupCfg) { g.Flags |= GroupFlagParts; g.Reduce = RedGather }},
	} {
		var g GroupCfg
		must(t, f.o.Groups.Lookup(uint32(1), &g))
		c.mod(&g)
		must(t, f.o.Groups.Put(uint32(1), &g))
		r.Run(t, []bpftest.Case{{Name: c.name, In: p(1, 0, 2), WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Multipart": 1}}})
	}
}

func truncated(frame []byte, n int) []byte { return append([]byte(nil), frame[:n]...) }

// TestGatherPartsTimeout: a worker that sent some but not all of its parts is not in the
// bitmap when the request expires; its parts are in the aggregate and the result says how
// many such workers there were (Partial). Then late parts, and a recycled slot whose
// parts-map entries still hold the old request.
func TestGatherPartsTimeout(t *testing.T) {
	for _, red := range []uint8{RedSum, RedMin} {
		f := newPartsFixture(t, 1, coord4, w4, red, TypeI32, 4)
		id := uint64(13)<<10 | 68
		f.arm(t, 1, id, 3)
		v0, v1 := []int64{1, 2, 3, 4}, []int64{10, 20, 30, 40}
		runDrop(t, f, "w0 part 0", part(w4[0], coord4, 1, 0, id, TypeI32, v0, 0, 2))
		runDrop(t, f, "w0 part 1", part(w4[0], coord4, 1, 0, id, TypeI32, v0, 1, 2))
		runDrop(t, f, "w1 part 1 of 2", part(w4[1], coord4, 1, 1, id, TypeI32, v1, 1, 2))
		s := f.slot(t, id)
		s.DeadlineNs = 1
		if err := f.o.Slots.Update(uint32(id&SlotMask), &s, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
		if n, err := f.o.RunSweep(); err != nil || n != 1 {
			t.Fatalf("sweep expired %d (%v)", n, err)
		}
		r := f.result(t)
		want := []int64{1, 2, 33, 44} // worker 1's second half is in
		if red == RedMin {
			want = []int64{1, 2, 3, 4}
		}
		if r.Status != StatusTimeout || r.Count != 1 || r.Bitmap[0] != 0b001 || r.Partial != 1 || !equal(r.Agg[:4], want) {
			t.Fatalf("reduction %d: status %d count %d bitmap %b partial %d agg %v, want %v", red, r.Status, r.Count, r.Bitmap[0], r.Partial, r.Agg[:4], want)
		}
		var e PartsRec
		if err := f.o.Parts.Lookup(uint32((id&SlotMask-64)*3+1), &e); err != nil || e.ReqId != id || e.Bits != 0b10 || e.Nparts != 2 {
			t.Fatalf("worker 1's parts entry %+v (%v)", e, err)
		}
		rn := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
		rn.Run(t, []bpftest.Case{{Name: "late part dropped", In: part(w4[1], coord4, 1, 1, id, TypeI32, v1, 0, 2),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Late": 1}}})

		// The slot recycled: the old request's parts are stale; the new request takes
		// worker 1's entry over (a different nparts is no mismatch: another request).
		id2 := id + 1<<10
		f.arm(t, 1, id2, 1)
		rn.Run(t, []bpftest.Case{
			{Name: "old request's part in the recycled slot", In: part(w4[1], coord4, 1, 1, id, TypeI32, v1, 0, 2),
				WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Stale": 1}},
			{Name: "new request's part 0 of 4", In: part(w4[1], coord4, 1, 1, id2, TypeI32, v1, 0, 4),
				WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Parts": 1}},
		})
		for p := 1; p < 4; p++ {
			runDrop(t, f, "new request's part", part(w4[1], coord4, 1, 1, id2, TypeI32, v1, p, 4))
		}
		r = f.result(t)
		if r.ReqId != id2 || r.Status != StatusOK || r.Count != 1 || r.Bitmap[0] != 0b010 || r.Partial != 0 || !equal(r.Agg[:4], v1) {
			t.Fatalf("recycled slot: id %#x status %d count %d bitmap %b partial %d agg %v", r.ReqId, r.Status, r.Count, r.Bitmap[0], r.Partial, r.Agg[:4])
		}
	}
}
