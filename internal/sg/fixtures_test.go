package sg

// BPF_PROG_TEST_RUN fixtures for sg_gather (every reduction and policy, duplicates, late
// and stale replies, unknown groups, unregistered sources, malformed/truncated/oversized
// datagrams, IPv4 and IPv6) and sg_scatter (copies captured on a veth).

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

var (
	coord4 = netip.MustParseAddrPort("192.0.2.1:40000")
	coord6 = netip.MustParseAddrPort("[2001:db8::1]:40000")
	w4     = []netip.AddrPort{netip.MustParseAddrPort("198.51.100.10:9000"), netip.MustParseAddrPort("198.51.100.11:9001"), netip.MustParseAddrPort("198.51.100.12:9002")}
	w6     = []netip.AddrPort{netip.MustParseAddrPort("[2001:db8::10]:9000"), netip.MustParseAddrPort("[2001:db8::11]:9001")}
)

func mapped(a netip.Addr) [16]byte {
	if a.Is4() {
		var b [16]byte
		b[10], b[11] = 0xff, 0xff
		v := a.As4()
		copy(b[12:], v[:])
		return b
	}
	return a.As16()
}

func swap16(v uint16) uint16 { return v>>8 | v<<8 }

type fixture struct {
	o  *Objects
	rd *Ring
}

// newFixture loads the data plane and configures group gid with the given workers.
func newFixture(t *testing.T, gid uint32, coord netip.AddrPort, workers []netip.AddrPort, red, typ uint8, elems uint16, gatherK uint32) *fixture {
	t.Helper()
	bpftest.RequireRoot(t)
	return newFixtureWith(t, LoadOptions{Tier: DetectTier()}, gid, coord, workers, red, typ, elems, gatherK)
}

func newFixtureWith(t testing.TB, opts LoadOptions, gid uint32, coord netip.AddrPort, workers []netip.AddrPort, red, typ uint8, elems uint16, gatherK uint32) *fixture {
	t.Helper()
	o, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := OpenRing(o.Results)
	if err != nil {
		o.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close(); o.Close() })
	f := &fixture{o: o, rd: rd}
	f.addGroup(t, gid, coord, workers, red, typ, elems, gatherK)
	return f
}

func (f *fixture) addGroup(t testing.TB, gid uint32, coord netip.AddrPort, workers []netip.AddrPort, red, typ uint8, elems uint16, gatherK uint32) {
	g := GroupCfg{Enabled: 1, Family: 4, Reduce: red, Dtype: typ, Nworkers: uint16(len(workers)), Elems: elems,
		SlotBase: uint16(gid * 64), Nslots: 64, WorkerBase: uint16(gid * WorkersMax), Ifindex: 1, GatherK: gatherK,
		TimeoutNs: 1e9, CoordPort: swap16(coord.Port())}
	if coord.Addr().Is6() {
		g.Family = 6
	}
	g.CoordAddr.In6U.U6Addr8 = mapped(coord.Addr())
	for i, w := range workers {
		wc := WorkerCfg{Port: swap16(w.Port())}
		wc.Addr.In6U.U6Addr8 = mapped(w.Addr())
		if err := f.o.Workers.Put(gid*WorkersMax+uint32(i), &wc); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.o.Groups.Put(gid, &g); err != nil {
		t.Fatal(err)
	}
}

// arm puts request id of group gid in flight, as the scatter would.
func (f *fixture) arm(t testing.TB, gid uint32, id uint64, need uint16) {
	t.Helper()
	var s SlotRec
	s.State = SlotPending
	s.DeadlineNs = 1 << 62
	s.Res.ReqId = id
	s.Res.Group = uint16(gid)
	s.Res.Slot = uint16(id & SlotMask)
	s.Res.Need = need
	if err := f.o.Slots.Put(uint32(id&SlotMask), &s); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) slot(t testing.TB, id uint64) SlotRec {
	t.Helper()
	var s SlotRec
	if err := f.o.Slots.Lookup(uint32(id&SlotMask), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *fixture) counters() (bpftest.Counters, error) { return bpftest.SumPerCPU[Stats](f.o.Stats) }

// reply builds worker w's reply datagram (from its registered address unless from is set).
func reply(from, to netip.AddrPort, gid, worker uint16, id uint64, payload []byte, mod func(*Header)) []byte {
	h := Header{Version: Version, Op: OpReply, Group: gid, Worker: worker, ReqID: id, NParts: 1, PayloadLen: uint32(len(payload))}
	if mod != nil {
		mod(&h)
	}
	d := append(h.Append(nil), payload...)
	b := pktbuild.New()
	if from.Addr().Is4() {
		b = b.IPv4(pktbuild.IPv4{Src: from.Addr(), Dst: to.Addr()})
	} else {
		b = b.IPv6(pktbuild.IPv6{Src: from.Addr(), Dst: to.Addr()})
	}
	return b.UDP(pktbuild.UDP{Src: from.Port(), Dst: to.Port()}).Payload(d).Build()
}

func vec64(v ...int64) []byte { return AppendVector(nil, TypeI64, v) }
func vec32(v ...int64) []byte { return AppendVector(nil, TypeI32, v) }

func (f *fixture) result(t testing.TB) ResultRec {
	t.Helper()
	var r ResultRec
	buf := make([]byte, binary.Size(r))
	n, ok := f.rd.Read(buf)
	if !ok {
		t.Fatal("no result in the ring buffer")
	}
	if n != len(buf) {
		t.Fatalf("result record of %d bytes, want %d", n, len(buf))
	}
	if _, err := binary.Decode(buf, binary.NativeEndian, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *fixture) noResult(t testing.TB) {
	t.Helper()
	if n := f.rd.Available(); n != 0 {
		t.Fatalf("unexpected result in the ring buffer (%d bytes)", n)
	}
}

func TestGatherSumInt64IPv4(t *testing.T) {
	f := newFixture(t, 1, coord4, w4, RedSum, TypeI64, 3, 0)
	id := uint64(7)<<10 | 65 // slot 65: group 1's range [64, 128)
	f.arm(t, 1, id, 3)
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	r.Run(t, []bpftest.Case{
		{Name: "first reply reduced and consumed", In: reply(w4[0], coord4, 1, 0, id, vec64(1, 2, 3), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
		{Name: "duplicate dropped", In: reply(w4[0], coord4, 1, 0, id, vec64(100, 100, 100), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Duplicates": 1}},
		{Name: "stale id in the same slot dropped", In: reply(w4[1], coord4, 1, 1, id+1<<10, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Stale": 1}},
		{Name: "wrong source port passed", In: reply(netip.AddrPortFrom(w4[1].Addr(), 1), coord4, 1, 1, id, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "worker index of another address passed", In: reply(w4[1], coord4, 1, 2, id, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "worker index out of range passed", In: reply(w4[1], coord4, 1, 3, id, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "to another port passed", In: reply(w4[1], netip.AddrPortFrom(coord4.Addr(), 1), 1, 1, id, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "short vector passed", In: reply(w4[1], coord4, 1, 1, id, vec64(5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.BadLength": 1}},
		{Name: "multi-packet passed", In: reply(w4[1], coord4, 1, 1, id, vec64(5, 5, 5), func(h *Header) { h.NParts = 2 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Multipart": 1}},
		{Name: "worker error dropped, not aggregated", In: reply(w4[1], coord4, 1, 1, id, vec64(5, 5, 5), func(h *Header) { h.Status = 3 }),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.WorkerErrors": 1}},
		{Name: "unknown group passed", In: reply(w4[1], coord4, 9, 1, id, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.UnknownGroup": 1}},
		{Name: "group id beyond the map passed", In: reply(w4[1], coord4, 999, 1, id, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.UnknownGroup": 1}},
		{Name: "unknown version passed", In: reply(w4[1], coord4, 1, 1, id, vec64(5, 5, 5), func(h *Header) { h.Version = 2 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.BadVersion": 1}},
		{Name: "oversized payload length passed", In: reply(w4[1], coord4, 1, 1, id, vec64(5, 5, 5), func(h *Header) { h.PayloadLen = 4000 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "header cut short passed", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: w4[1].Addr(), Dst: coord4.Addr()}).
			UDP(pktbuild.UDP{Src: w4[1].Port(), Dst: coord4.Port()}).Payload(reply(w4[1], coord4, 1, 1, id, nil, nil)[42 : 42+20]).Build(),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "frame truncated inside the vector passed", In: pktbuild.Truncate(reply(w4[1], coord4, 1, 1, id, vec64(5, 5, 5), nil), 42+32+10),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "not sg passed untouched", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: w4[1].Addr(), Dst: coord4.Addr()}).
			UDP(pktbuild.UDP{Src: w4[1].Port(), Dst: coord4.Port()}).Payload([]byte("hello world")).Build(),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{}},
		{Name: "second reply", In: reply(w4[1], coord4, 1, 1, id, vec64(10, -20, 30), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
	})
	f.noResult(t)
	r.Run(t, []bpftest.Case{{Name: "third reply completes", In: reply(w4[2], coord4, 1, 2, id, vec64(100, 200, 300), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}}})
	res := f.result(t)
	if res.ReqId != id || res.Status != StatusOK || res.Count != 3 || res.Bitmap[0] != 0b111 ||
		res.Agg[0] != 111 || res.Agg[1] != 182 || res.Agg[2] != 333 {
		t.Fatalf("result %+v", res.Agg[:3])
	}
	r.Run(t, []bpftest.Case{{Name: "late reply dropped", In: reply(w4[2], coord4, 1, 2, id, vec64(1, 1, 1), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Late": 1}}})
	f.noResult(t)

	// A recycled slot: the next request in the same slot starts from zero and refuses the
	// old request's replies.
	id2 := id + 1<<10
	f.arm(t, 1, id2, 1)
	r.Run(t, []bpftest.Case{
		{Name: "old id in recycled slot", In: reply(w4[0], coord4, 1, 0, id, vec64(1, 1, 1), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Stale": 1}},
		{Name: "any: first reply completes", In: reply(w4[1], coord4, 1, 1, id2, vec64(4, 5, 6), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}},
	})
	res = f.result(t)
	if res.ReqId != id2 || res.Count != 1 || res.Bitmap[0] != 0b010 || res.Agg[0] != 4 || res.Agg[2] != 6 {
		t.Fatalf("recycled slot result: count %d bitmap %b agg %v", res.Count, res.Bitmap[0], res.Agg[:3])
	}
}

// TestGatherWakeSocket: with SG_GF_WAKE_SOCKET the reply that completes a request is passed,
// untouched, to the coordinator socket (the reader's wake-up) and its result is already in
// the ring; every other reply is consumed as without the flag, exactly one completion per
// request, and foreign or malformed datagrams are passed untouched as before.
func TestGatherWakeSocket(t *testing.T) {
	f := newFixture(t, 1, coord4, w4, RedSum, TypeI64, 3, 0)
	var g GroupCfg
	if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	g.Flags |= GroupFlagWakeSocket
	if err := f.o.Groups.Put(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	id := uint64(9)<<10 | 70
	f.arm(t, 1, id, 2)
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	completing := reply(w4[1], coord4, 1, 1, id, vec64(10, 20, 30), nil)
	foreign := pktbuild.New().IPv4(pktbuild.IPv4{Src: w4[1].Addr(), Dst: coord4.Addr()}).
		UDP(pktbuild.UDP{Src: w4[1].Port(), Dst: coord4.Port()}).Payload([]byte("hello world")).Build()
	r.Run(t, []bpftest.Case{
		{Name: "first reply consumed", In: reply(w4[0], coord4, 1, 0, id, vec64(1, 2, 3), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
		{Name: "duplicate consumed", In: reply(w4[0], coord4, 1, 0, id, vec64(1, 2, 3), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Duplicates": 1}},
		{Name: "unregistered source passed untouched", In: reply(netip.AddrPortFrom(w4[1].Addr(), 1), coord4, 1, 1, id, vec64(5, 5, 5), nil),
			WantOut: reply(netip.AddrPortFrom(w4[1].Addr(), 1), coord4, 1, 1, id, vec64(5, 5, 5), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "not sg passed untouched", In: foreign, WantOut: foreign, WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{}},
	})
	f.noResult(t)
	r.Run(t, []bpftest.Case{{Name: "completing reply passed untouched", In: completing, WantOut: completing,
		WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}}})
	res := f.result(t) // committed before the program returned
	if res.ReqId != id || res.Count != 2 || res.Bitmap[0] != 0b011 || res.Agg[0] != 11 || res.Agg[2] != 33 {
		t.Fatalf("result id %#x count %d bitmap %b agg %v", res.ReqId, res.Count, res.Bitmap[0], res.Agg[:3])
	}
	r.Run(t, []bpftest.Case{
		{Name: "the completing reply again is late, consumed", In: completing,
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Late": 1}},
		{Name: "a later reply is late, consumed", In: reply(w4[2], coord4, 1, 2, id, vec64(1, 1, 1), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Late": 1}},
	})
	f.noResult(t)
}

func TestGatherReductions(t *testing.T) {
	cases := []struct {
		name      string
		red, typ  uint8
		elems     uint16
		need      uint16
		replies   [][]int64
		want      []int64
		wantFlags uint16
	}{
		{"sum int32 in int64", RedSum, TypeI32, 2, 3, [][]int64{{2147483647, -1}, {2147483647, -2}, {1, -2147483648}}, []int64{4294967295, -2147483651}, 0},
		{"min int32", RedMin, TypeI32, 3, 3, [][]int64{{5, -7, 9}, {3, 8, 10}, {4, 0, -1}}, []int64{3, -7, -1}, 0},
		{"max int32", RedMax, TypeI32, 3, 3, [][]int64{{5, -7, 9}, {3, 8, 10}, {4, 0, -1}}, []int64{5, 8, 10}, 0},
		{"min int64", RedMin, TypeI64, 2, 3, [][]int64{{1 << 40, 5}, {-(1 << 40), 6}, {0, 4}}, []int64{-(1 << 40), 4}, 0},
		{"max int64 2 of 3", RedMax, TypeI64, 2, 2, [][]int64{{1 << 40, 5}, {-(1 << 40), 6}}, []int64{1 << 40, 6}, 0},
		{"sum int64 overflow flagged", RedSum, TypeI64, 1, 2, [][]int64{{1<<63 - 1}, {1}}, []int64{-1 << 63}, FlagOverflow},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 0, coord4, w4, c.red, c.typ, c.elems, 0)
			id := uint64(3)<<10 | 5
			var steps []bpftest.Case
			for i, v := range c.replies {
				p := vec32(v...)
				if c.typ == TypeI64 {
					p = vec64(v...)
				}
				steps = append(steps, bpftest.Case{Name: fmt.Sprintf("reply %d", i),
					In: reply(w4[i], coord4, 0, uint16(i), id, p, nil), WantRet: bpftest.XDPDrop})
			}
			bpftest.Runner{Prog: f.o.Gather}.RunCase(t, bpftest.Case{Name: c.name, Steps: steps,
				Setup: func(tb testing.TB) { f.arm(tb, 0, id, c.need) },
				Check: func(tb testing.TB, _ bpftest.Result) {
					res := f.result(tb)
					if got := res.Agg[:c.elems]; !equal(got, c.want) || res.Flags != c.wantFlags || int(res.Count) != len(c.replies) {
						tb.Errorf("aggregate %v flags %d count %d, want %v flags %d", got, res.Flags, res.Count, c.want, c.wantFlags)
					}
				}})
		})
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestGatherCountAndGatherIPv6(t *testing.T) {
	// replies is a case whose steps are the replies of the workers in order, all consumed.
	replies := func(f *fixture, gid uint32, id uint64, need uint16, order []int, payload func(i int) []byte,
		check func(tb testing.TB, r ResultRec)) bpftest.Case {
		var steps []bpftest.Case
		for _, i := range order {
			steps = append(steps, bpftest.Case{Name: fmt.Sprintf("reply of worker %d", i),
				In: reply(w6[i], coord6, uint16(gid), uint16(i), id, payload(i), nil), WantRet: bpftest.XDPDrop})
		}
		return bpftest.Case{Steps: steps, Setup: func(tb testing.TB) { f.arm(tb, gid, id, need) },
			Check: func(tb testing.TB, _ bpftest.Result) { check(tb, f.result(tb)) }}
	}
	t.Run("count any payload", func(t *testing.T) {
		f := newFixture(t, 2, coord6, w6, RedCount, TypeI32, 0, 0)
		c := replies(f, 2, uint64(1)<<10|130, 2, []int{0, 1}, func(int) []byte { return []byte("anything") },
			func(tb testing.TB, r ResultRec) {
				if r.Count != 2 || r.Bitmap[0] != 0b11 {
					tb.Errorf("count %d bitmap %b", r.Count, r.Bitmap[0])
				}
			})
		c.Name = "count"
		bpftest.Runner{Prog: f.o.Gather}.RunCase(t, c)
	})
	t.Run("gather first K payloads in arrival order", func(t *testing.T) {
		f := newFixture(t, 2, coord6, w6, RedGather, TypeI32, 2, 1)
		c := replies(f, 2, uint64(1)<<10|131, 2, []int{1, 0}, func(i int) []byte { return vec32(int64(i+1)*11, int64(i+1)*22) },
			func(tb testing.TB, r ResultRec) {
				raw := make([]byte, 8)
				binary.NativeEndian.PutUint64(raw, uint64(r.Agg[0]))
				if r.Gathered != 1 || r.Order[0] != 1 || !equal(DecodeVector(raw, TypeI32), []int64{22, 44}) {
					tb.Errorf("gathered %d order %v payload %x", r.Gathered, r.Order[:2], raw)
				}
			})
		c.Name = "gather"
		bpftest.Runner{Prog: f.o.Gather}.RunCase(t, c)
	})
}

func TestSweepExpires(t *testing.T) {
	f := newFixture(t, 0, coord4, w4, RedSum, TypeI64, 1, 0)
	id := uint64(9)<<10 | 3
	f.arm(t, 0, id, 3)
	if _, err := bpftest.Run(f.o.Gather, reply(w4[1], coord4, 0, 1, id, vec64(42), nil)); err != nil {
		t.Fatal(err)
	}
	if n, err := f.o.RunSweep(); err != nil || n != 0 {
		t.Fatalf("sweep before the deadline expired %d (%v)", n, err)
	}
	s := f.slot(t, id)
	s.DeadlineNs = 1 // in the past
	if err := f.o.Slots.Update(uint32(id&SlotMask), &s, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	if n, err := f.o.RunSweep(); err != nil || n != 1 {
		t.Fatalf("sweep after the deadline expired %d (%v)", n, err)
	}
	r := f.result(t)
	if r.Status != StatusTimeout || r.Count != 1 || r.Bitmap[0] != 0b10 || r.Agg[0] != 42 {
		t.Fatalf("timeout result: status %d count %d bitmap %b agg %d", r.Status, r.Count, r.Bitmap[0], r.Agg[0])
	}
	res, err := bpftest.Run(f.o.Gather, reply(w4[0], coord4, 0, 0, id, vec64(1), nil))
	if err != nil || res.Ret != bpftest.XDPDrop {
		t.Fatalf("late reply after timeout: verdict %d err %v", res.Ret, err)
	}
}
