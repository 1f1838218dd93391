package hedge

// BPF_PROG_TEST_RUN tests of the stored path (bpf/hedge/store.h): the splitter stores a
// request in its service's ring and asks the pacer for a tick; the rescuer, given a tick,
// rebuilds the tick's skb into each due request's hedge. Fixtures: bpf_fixtures_test.go
// (services st4 and st6 take the stored path).

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

func lapEmpty(pos uint64) uint64 { return pos / uint64(storeRing) * 2 }

func cellIndex(svc int, pos uint64) uint32 {
	return uint32(svc*storeRing) + uint32(pos%uint64(storeRing))
}

// heads reads service svc's ring positions.
func (f *fixture) heads(tb testing.TB, svc int) hedgeStorePos {
	tb.Helper()
	return lookup[hedgeStorePos](tb, f.objs.StoreHeads, uint32(svc))
}

func (f *fixture) cell(tb testing.TB, svc int, pos uint64) hedgeHstore {
	tb.Helper()
	return lookup[hedgeHstore](tb, f.objs.StoreRing, cellIndex(svc, pos))
}

func (f *fixture) putCell(tb testing.TB, svc int, pos uint64, c hedgeHstore) {
	tb.Helper()
	if err := f.objs.StoreRing.Put(cellIndex(svc, pos), c); err != nil {
		tb.Fatalf("write store cell %d/%d: %v", svc, pos, err)
	}
}

// resetStore empties every service's ring (releases the cells between head and tail) and
// clears the pacer's armed deadline.
func (f *fixture) resetStore(tb testing.TB) {
	tb.Helper()
	for svc := range f.h.Config.Services {
		h := f.heads(tb, svc)
		for pos := h.Head; pos < h.Tail; pos++ {
			c := f.cell(tb, svc, pos)
			c.Lap = lapEmpty(pos) + 2
			f.putCell(tb, svc, pos, c)
		}
		h.Head = h.Tail
		if err := f.objs.StoreHeads.Put(uint32(svc), h); err != nil {
			tb.Fatalf("write store_heads[%d]: %v", svc, err)
		}
	}
	var st pacerState
	if err := f.objs.PacerArming.Put(uint32(0), st); err != nil {
		tb.Fatalf("clear pacer_arming: %v", err)
	}
}

// pending cells of svc, head first.
func (f *fixture) queued(tb testing.TB, svc int) []hedgeHstore {
	tb.Helper()
	h := f.heads(tb, svc)
	var out []hedgeHstore
	for pos := h.Head; pos < h.Tail; pos++ {
		out = append(out, f.cell(tb, svc, pos))
	}
	return out
}

// makeDue moves the deadline of every queued cell of svc to ago before now.
func (f *fixture) makeDue(tb testing.TB, svc int, ago time.Duration) {
	tb.Helper()
	if err := f.dueAt(svc, monoNow(tb), ago); err != nil {
		tb.Fatal(err)
	}
}

// dueAt moves the deadline of every queued cell of svc to ago before now (ago < 0: after
// now). For a run's prepare (runAfter), where now is the clock right before the run.
func (f *fixture) dueAt(svc int, now uint64, ago time.Duration) error {
	var h hedgeStorePos
	if err := f.objs.StoreHeads.Lookup(uint32(svc), &h); err != nil {
		return fmt.Errorf("read store_heads[%d]: %w", svc, err)
	}
	for pos := h.Head; pos < h.Tail; pos++ {
		var c hedgeHstore
		if err := f.objs.StoreRing.Lookup(cellIndex(svc, pos), &c); err != nil {
			return fmt.Errorf("read store cell %d/%d: %w", svc, pos, err)
		}
		c.DeadlineNs = uint64(int64(now) - int64(ago))
		if err := f.objs.StoreRing.Put(cellIndex(svc, pos), c); err != nil {
			return fmt.Errorf("write store cell %d/%d: %w", svc, pos, err)
		}
	}
	return nil
}

// storedDueAt is a prepare (runAfter) that makes every stored request of the stored
// services due 100 us before the run.
func (f *fixture) storedDueAt(now uint64) error {
	for _, svc := range []int{sSt4, sSt6} {
		if err := f.dueAt(svc, now, 100*time.Microsecond); err != nil {
			return err
		}
	}
	return nil
}

// tickFrame is a pacer tick frame (bpf/include/pacer.h, pacer_write_tick) for deadline.
func tickFrame(deadline uint64, n int) []byte {
	b := make([]byte, n)
	copy(b[0:6], []byte{0x02, 'k', 'p', 'a', 'c', 'e'})
	copy(b[6:12], []byte{0x02, 'k', 'p', 'a', 'c', 'e'})
	binary.BigEndian.PutUint16(b[12:], pktbuild.EtherTypeIPv4)
	ip := b[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(n-14))
	ip[9] = 253
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	binary.NativeEndian.PutUint64(b[34:], pacer.TickMagic)
	binary.NativeEndian.PutUint64(b[42:], deadline)
	return b
}

// store runs the splitter on req and fails unless it was stored.
func (f *fixture) store(tb testing.TB, req []byte) {
	tb.Helper()
	r, err := f.run(f.objs.HedgeSplit, req, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if r.ret != unspec {
		tb.Fatalf("splitter verdict %s, want TC_ACT_UNSPEC", verdict(r.ret))
	}
}

// armedTick returns a tick frame as the pacer delivers it: for the armed deadline, which is
// set to just now first (so pacer_receive finds it armed and records it as late).
func (f *fixture) armedTick(tb testing.TB) []byte {
	tb.Helper()
	d := monoNow(tb) - 1000
	if err := f.objs.PacerArming.Put(uint32(0), pacerState{ArmedNs: d}); err != nil {
		tb.Fatalf("write pacer_arming: %v", err)
	}
	return tickFrame(d, 128)
}

// tick runs the rescuer on a tick.
func (f *fixture) tick(tb testing.TB) runResult {
	tb.Helper()
	return f.tickAfter(tb, nil)
}

// tickAfter runs the rescuer on a tick, prepare (if not nil) called right before the run.
func (f *fixture) tickAfter(tb testing.TB, prepare func(now uint64) error) runResult {
	tb.Helper()
	r, err := f.runAfter(f.objs.HedgeRescue, f.armedTick(tb), 0, prepare)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func TestStoreSplit(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x5001
	p := idPayload(id, 64)
	req4, req6 := datagram(client4, svcSt4, p), datagram(client6, svcSt6, p)
	k4, k6 := key(sSt4, client4, id), key(sSt6, client6, id)
	big := datagram(client4, svcSt4, idPayload(id, DefaultStoreLimit+1))
	limit := datagram(client4, svcSt4, idPayload(id, DefaultStoreLimit))
	// stored checks the one queued cell: key, times, and the request's IP/UDP bytes with the
	// UDP checksum zeroed (each hedge computes its own).
	stored := func(svc int, k hedgeHreqKey, req []byte) func(testing.TB, *fixture, runResult, uint64, uint64) {
		return func(tb testing.TB, f *fixture, _ runResult, t0, t1 uint64) {
			tb.Helper()
			q := f.queued(tb, svc)
			if len(q) != 1 {
				tb.Fatalf("%d cells queued, want 1", len(q))
			}
			c := q[0]
			e, _ := f.entry(tb, k)
			if c.Key != k || c.SentNs != e.SentNs || c.DeadlineNs != e.DeadlineNs || c.DelayNs != uint64(storeDelay) {
				tb.Errorf("cell key %v sent %d deadline %d delay %d, want %v %d %d %d", c.Key, c.SentNs, c.DeadlineNs,
					c.DelayNs, k, e.SentNs, e.DeadlineNs, storeDelay)
			}
			want := slices.Clone(req[14:])
			l3 := 20
			if req[12] == 0x86 {
				l3 = 40
			}
			want[l3+6], want[l3+7] = 0, 0
			if int(c.Len) != len(want) || int(c.L3Len) != l3 || !slices.Equal(c.Data[:c.Len], want) {
				tb.Errorf("cell len %d l3 %d bytes %s", c.Len, c.L3Len, bpftest.DiffBytes(c.Data[:c.Len], want))
			}
			var ps pacerState
			if err := f.objs.PacerArming.Lookup(uint32(0), &ps); err != nil || ps.ArmedNs != e.DeadlineNs {
				tb.Errorf("pacer armed at %d (%v), want the deadline %d", ps.ArmedNs, err, e.DeadlineNs)
			}
		}
	}
	nothingQueued := func(svc int) func(testing.TB, *fixture, runResult, uint64, uint64) {
		return func(tb testing.TB, f *fixture, _ runResult, _, _ uint64) {
			if q := f.queued(tb, svc); len(q) != 0 {
				tb.Errorf("%d cells queued, want none", len(q))
			}
		}
	}
	armed := bpftest.Counters{"dl.TicksRequested": 1, "dl.TicksArmed": 1}
	with := func(c bpftest.Counters, more bpftest.Counters) bpftest.Counters {
		out := bpftest.Counters{}
		for k, v := range c {
			out[k] = v
		}
		for k, v := range more {
			out[k] = v
		}
		return out
	}
	cases := []progCase{
		{name: "ipv4 request: stored, a tick asked for at its deadline, not cloned", in: req4, ret: unspec,
			counters: with(armed, bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1}),
			board:    map[hedgeHreqKey]uint32{k4: reqPending}, check: stored(sSt4, k4, req4)},
		{name: "ipv6 request: stored", in: req6, ret: unspec,
			counters: with(armed, bpftest.Counters{"st6.Requests": 1, "st6.Stored": 1}),
			board:    map[hedgeHreqKey]uint32{k6: reqPending}, check: stored(sSt6, k6, req6)},
		{name: "payload at the store limit: stored", in: limit, ret: unspec,
			counters: with(armed, bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1}),
			board:    map[hedgeHreqKey]uint32{k4: reqPending}, check: stored(sSt4, k4, limit)},
		{name: "a later tick armed already: coalesced, stored", in: req4, ret: unspec,
			// Armed for 0.9 s after the clock right before the run: before the request's
			// deadline (1 s after the splitter's run) and not presumed lost (lost_ns 1 s).
			atRun: func(f *fixture, now uint64) error {
				return f.objs.PacerArming.Put(uint32(0), pacerState{ArmedNs: now + uint64(storeDelay*9/10)})
			},
			counters: bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1, "dl.TicksRequested": 1, "dl.TicksCoalesced": 1},
			board:    map[hedgeHreqKey]uint32{k4: reqPending}},
		{name: "payload above the store limit: cloned (store_too_large)", in: big, ret: unspec,
			counters: bpftest.Counters{"st4.Requests": 1, "st4.StoreTooLarge": 1, "st4.Clones": 1},
			board:    map[hedgeHreqKey]uint32{k4: reqPending}, check: nothingQueued(sSt4)},
		{name: "ring full: cloned (store_full)", in: req4, ret: unspec,
			setup: func(tb testing.TB, f *fixture) {
				// The cell a lap back is still held (filled, not released).
				h := f.heads(tb, sSt4)
				c := f.cell(tb, sSt4, h.Tail)
				c.Lap = lapEmpty(h.Tail) + 1
				f.putCell(tb, sSt4, h.Tail, c)
				h.Tail += uint64(storeRing)
				if err := f.objs.StoreHeads.Put(uint32(sSt4), h); err != nil {
					tb.Fatal(err)
				}
				tb.Cleanup(func() {}) // resetStore releases them
			},
			counters: bpftest.Counters{"st4.Requests": 1, "st4.StoreFull": 1, "st4.Clones": 1},
			board:    map[hedgeHreqKey]uint32{k4: reqPending}},
		{name: "ipv4 options: cloned (store_unsupported)", in: frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1}}}.build(client4, svcSt4, p),
			ret: unspec, counters: bpftest.Counters{"st4.Requests": 1, "st4.StoreUnsupported": 1, "st4.Clones": 1},
			board: map[hedgeHreqKey]uint32{k4: reqPending}, check: nothingQueued(sSt4)},
		{name: "vlan tag in the frame: cloned (store_unsupported)", in: frame{vlan: true}.build(client4, svcSt4, p),
			ret: unspec, counters: bpftest.Counters{"st4.Requests": 1, "st4.StoreUnsupported": 1, "st4.Clones": 1},
			board: map[hedgeHreqKey]uint32{k4: reqPending}, check: nothingQueued(sSt4)},
		{name: "a hedge (hedge mark): neither stored nor cloned", in: req4, mark: hedgeMark, ret: unspec, check: nothingQueued(sSt4)},
		{name: "truncated: passed, counted malformed, nothing stored", in: pktbuild.Truncate(req4, 14+20+4), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}, check: nothingQueued(sSt4)},
		{name: "request shorter than its id: passed, nothing stored", in: datagram(client4, svcSt4, []byte{1, 2}), ret: unspec,
			counters: bpftest.Counters{"st4.ShortRequests": 1}, check: nothingQueued(sSt4)},
	}
	runCases(t, f, f.objs.HedgeSplit, cases)
}

// pacerState is struct pacer_state (bpf/include/pacer.h) as bpf2go gives it to this package.
type pacerState = pacer.State

func TestStoreTick(t *testing.T) {
	const id = 0x5002
	p := idPayload(id, 100)
	req4, req6 := datagram(client4, svcSt4, p), datagram(client6, svcSt6, p)
	k4, k6 := key(sSt4, client4, id), key(sSt6, client6, id)
	// A datagram from a local socket at TC egress carries only the pseudo-header sum in its
	// UDP checksum (CHECKSUM_PARTIAL): a wrong checksum here, which the hedge must not keep.
	partial := slices.Clone(req4)
	partial[udpCsumOff(partial)] ^= 0x5a
	hedge := func(to netip.AddrPort, req []byte) []byte {
		if req[12] == 0x86 {
			return datagram(client6, to, p)
		}
		return datagram(client4, to, p)
	}

	type tickCase struct {
		name  string
		setup func(tb testing.TB, f *fixture) // requests stored, scoreboard changed
		// atRun: the cells' deadlines, set in the run's thread right before it (see
		// progCase.atRun); a run that ends later than within (0: atRunWithin) after it is
		// set up and run again.
		atRun  func(f *fixture, now uint64) error
		within time.Duration
		in     []byte // nil: a tick frame
		ret    uint32
		out    []byte // the skb afterwards, from the IP header on (nil: not compared)
		mark   uint32 // skb->mark going in
		counts bpftest.Counters
		board  map[hedgeHreqKey]uint32
		queued map[int]int // cells left per service
		check  func(tb testing.TB, f *fixture, r runResult)
	}
	// storeDue stores reqs; the case's atRun (storedDueAt) makes them due.
	storeDue := func(reqs ...[]byte) func(tb testing.TB, f *fixture) {
		return func(tb testing.TB, f *fixture) {
			for _, r := range reqs {
				f.store(tb, r)
			}
		}
	}
	due := (*fixture).storedDueAt
	setState := func(k hedgeHreqKey, s uint32) func(tb testing.TB, f *fixture) {
		return func(tb testing.TB, f *fixture) {
			e, ok := f.entry(tb, k)
			if !ok {
				tb.Fatalf("no entry %v", k)
			}
			e.State = s
			f.put(tb, k, e)
		}
	}
	maxHedges := func(svc int, n uint8) func(tb testing.TB, f *fixture) {
		return func(tb testing.TB, f *fixture) {
			c := f.svcCfg(tb, svc)
			c.MaxHedges = n
			if err := f.objs.SvcCfgs.Put(uint32(svc), c); err != nil {
				tb.Fatal(err)
			}
		}
	}
	seq := func(fs ...func(tb testing.TB, f *fixture)) func(tb testing.TB, f *fixture) {
		return func(tb testing.TB, f *fixture) {
			for _, fn := range fs {
				fn(tb, f)
			}
		}
	}
	hedgedTo := func(k hedgeHreqKey, tried uint8, n uint8, rep uint8) func(tb testing.TB, f *fixture, r runResult) {
		return func(tb testing.TB, f *fixture, _ runResult) {
			e, _ := f.entry(tb, k)
			if e.Tried != tried || e.HedgesSent != n || e.HedgeReplica != rep {
				tb.Errorf("entry %+v: want tried %#b, hedges_sent %d, hedge_replica %d", e, tried, n, rep)
			}
		}
	}
	tick := bpftest.Counters{"global.PacerTicks": 1, "dl.TicksDelivered": 1, "dl.LateCount": 1}
	with := func(more bpftest.Counters) bpftest.Counters {
		out := bpftest.Counters{}
		for k, v := range tick {
			out[k] = v
		}
		for k, v := range more {
			out[k] = v
		}
		return out
	}
	cases := []tickCase{
		{name: "nothing stored: tick dropped, no next tick", ret: shot, counts: tick},
		{name: "stored, not yet due: nothing sent, next tick asked for at its deadline", ret: shot,
			setup: func(tb testing.TB, f *fixture) { f.store(tb, req4) },
			// Due a delay after the run, however long after the store it comes.
			atRun:  func(f *fixture, now uint64) error { return f.dueAt(sSt4, now, -storeDelay) },
			counts: with(bpftest.Counters{"dl.TicksRequested": 1, "dl.TicksArmed": 1}),
			board:  map[hedgeHreqKey]uint32{k4: reqPending}, queued: map[int]int{sSt4: 1}},
		{name: "due ipv4: rebuilt into the hedge to the first replica, left to bpf_redirect_neigh",
			setup: storeDue(req4), atRun: due, ret: redirect, out: hedge(repSt1, req4)[14:],
			counts: with(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}),
			board:  map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(k4, 0b011, 1, 1)},
		{name: "due ipv6: rebuilt (protocol changed to IPv6), full checksum", setup: storeDue(req6), atRun: due, ret: redirect,
			out:    hedge(repSt6, req6)[14:],
			counts: with(bpftest.Counters{"st6.HedgesSent": 1, "st6.TickHedges": 1}),
			board:  map[hedgeHreqKey]uint32{k6: reqHedged}, check: hedgedTo(k6, 0b011, 1, 1)},
		{name: "stored bytes with a partial udp checksum: the hedge carries a full one", setup: storeDue(partial), atRun: due, ret: redirect,
			out:    hedge(repSt1, req4)[14:],
			counts: with(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}),
			board:  map[hedgeHreqKey]uint32{k4: reqHedged}},
		{name: "several due in one tick: a hedge each, all but the last cloned back in to leave", ret: redirect,
			setup: storeDue(req4, datagram(client4, svcSt4, idPayload(id+1, 100)), datagram(client4, svcSt4, idPayload(id+2, 100)), req6),
			atRun: due,
			out:   hedge(repSt6, req6)[14:],
			counts: with(bpftest.Counters{"st4.HedgesSent": 3, "st4.TickHedges": 3, "st6.HedgesSent": 1, "st6.TickHedges": 1,
				"global.HedgesReinjected": 3}),
			board: map[hedgeHreqKey]uint32{k4: reqHedged, key(sSt4, client4, id+1): reqHedged, key(sSt4, client4, id+2): reqHedged, k6: reqHedged}},
		{name: "a hedge cloned back in (hedge mark): left to bpf_redirect_neigh", in: hedge(repSt1, req4), mark: hedgeMark, ret: redirect,
			out: hedge(repSt1, req4)[14:]},
		{name: "answered before it was due: nothing sent, entry deleted", setup: seq(storeDue(req4), setState(k4, reqAnswered)), atRun: due, ret: shot,
			counts: with(bpftest.Counters{"st4.StoredAnswered": 1})},
		{name: "hedge answered already (ANSWERED_HEDGED): nothing sent, entry kept for the duplicate",
			setup: seq(storeDue(req4), setState(k4, reqAnsweredHedge)), atRun: due, ret: shot,
			counts: with(bpftest.Counters{"st4.StoredAnswered": 1}), board: map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}},
		{name: "evicted from the scoreboard: nothing sent (stored_orphaned)", ret: shot, atRun: due,
			setup: func(tb testing.TB, f *fixture) {
				storeDue(req4)(tb, f)
				if err := f.objs.Scoreboard.Delete(k4); err != nil {
					tb.Fatal(err)
				}
			},
			counts: with(bpftest.Counters{"st4.StoredOrphaned": 1})},
		{name: "replaced by a newer request with the same key: the old cell sends nothing", ret: shot, atRun: due,
			setup: func(tb testing.TB, f *fixture) {
				storeDue(req4)(tb, f)
				e, _ := f.entry(tb, k4)
				e.SentNs++
				f.put(tb, k4, e)
			},
			counts: with(bpftest.Counters{"st4.StoredOrphaned": 1}), board: map[hedgeHreqKey]uint32{k4: reqPending}},
		{name: "far overdue (deadline + delay passed): dropped, not sent late", ret: shot,
			setup: func(tb testing.TB, f *fixture) {
				f.store(tb, req4)
				f.makeDue(tb, sSt4, 2*storeDelay+time.Millisecond)
			},
			counts: with(bpftest.Counters{"st4.OverdueDropped": 1}), board: map[hedgeHreqKey]uint32{k4: reqNoHedge}},
		{name: "late but within the cutoff (deadline + delay): still sent", ret: redirect,
			setup: func(tb testing.TB, f *fixture) { f.store(tb, req4) },
			// Half a delay late right before the run: the cutoff (one delay) is 500 ms away,
			// and a run ending later than 250 ms after this is repeated.
			atRun:  func(f *fixture, now uint64) error { return f.dueAt(sSt4, now, storeDelay/2) },
			within: storeDelay / 4,
			out:    hedge(repSt1, req4)[14:],
			counts: with(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}), board: map[hedgeHreqKey]uint32{k4: reqHedged}},
		{name: "max_hedges 2: first hedge sent and the request queued again at now + delay", ret: redirect,
			setup: seq(maxHedges(sSt4, 2), storeDue(req4)), atRun: due,
			counts: with(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1, "st4.Requeued": 1,
				"dl.TicksRequested": 1, "dl.TicksArmed": 1}),
			board: map[hedgeHreqKey]uint32{k4: reqHedged}, queued: map[int]int{sSt4: 1},
			check: func(tb testing.TB, f *fixture, r runResult) {
				hedgedTo(k4, 0b011, 1, 1)(tb, f, r)
				q := f.queued(tb, sSt4)
				if len(q) == 0 {
					return // reported already: "0 cells queued, want 1"
				}
				// Re-queued at the rescuer's now (read during the run) + the delay.
				if d := q[0].DeadlineNs; d < r.t0+uint64(storeDelay) || d > r.t1+uint64(storeDelay) {
					tb.Errorf("re-queued deadline %d, want a delay after the run [%d, %d]", d, r.t0, r.t1)
				}
			}},
		{name: "max_hedges 2, second tick: second hedge to the other replica, not queued again", ret: redirect,
			setup: seq(maxHedges(sSt4, 2), storeDue(req4), func(tb testing.TB, f *fixture) {
				f.tickAfter(tb, f.storedDueAt)
			}),
			atRun:  due,
			counts: with(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}),
			out:    hedge(repSt2, req4)[14:],
			board:  map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(k4, 0b111, 2, 2)},
		{name: "max_hedges 4 but two replicas: the third finds none left (no_replica)", ret: shot,
			setup: seq(maxHedges(sSt4, 4), storeDue(req4), func(tb testing.TB, f *fixture) {
				for i := 0; i < 2; i++ {
					f.tickAfter(tb, f.storedDueAt)
				}
			}),
			atRun:  due,
			counts: with(bpftest.Counters{"st4.NoReplica": 1}), board: map[hedgeHreqKey]uint32{k4: reqHedged},
			check: hedgedTo(k4, 0b111, 2, 2)},
		{name: "malformed tick (bad magic): dropped, counted by the pacer", in: func() []byte {
			b := tickFrame(1, 128)
			b[34] ^= 0xff
			return b
		}(), ret: shot, counts: bpftest.Counters{"dl.MalformedTicks": 1}},
		{name: "truncated tick frame (headers, part of the tick): dropped, counted by the pacer", in: tickFrame(1, 128)[:40], ret: shot,
			counts: bpftest.Counters{"dl.MalformedTicks": 1}},
		{name: "not IP at all: no tick, dropped as unmatched", in: func() []byte {
			b := tickFrame(1, 60)
			binary.BigEndian.PutUint16(b[12:], 0x88b5)
			return b
		}(), ret: shot, counts: bpftest.Counters{"global.RescueUnmatched": 1}},
	}
	f := newFixture(t, fixtureOpts{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, delta := runCase(t, f, f.objs.HedgeRescue, progCase{in: c.in, tick: c.in == nil, mark: c.mark,
				setup: c.setup, atRun: c.atRun, within: c.within})
			if r.ret != c.ret {
				t.Errorf("verdict %s, want %s", verdict(r.ret), verdict(c.ret))
			}
			if c.out != nil {
				if len(r.out) < 14 || !slices.Equal(trimFrame(r.out)[14:], c.out) {
					t.Errorf("skb after the tick: %s", bpftest.DiffBytes(trimFrame(r.out)[14:], c.out))
				}
				if err := pktbuild.VerifyChecksums(trimFrame(r.out)); err != nil {
					t.Errorf("hedge: %v", err)
				}
			}
			if d := delta.Diff(c.counts); d != "" {
				t.Errorf("counter changes (got, want):\n%s", d)
			}
			if d := diffBoard(f.board(t), c.board); d != "" {
				t.Errorf("scoreboard (got, want):\n%s", d)
			}
			for svc := range f.h.Config.Services {
				if got := len(f.queued(t, svc)); got != c.queued[svc] {
					t.Errorf("service %d: %d cells queued, want %d", svc, got, c.queued[svc])
				}
			}
			if c.check != nil {
				c.check(t, f, r)
			}
		})
	}
}

// trimFrame cuts the test run's output to the IP datagram's length (DataOut is padded).
func trimFrame(b []byte) []byte {
	if len(b) < 14+40 {
		return b
	}
	switch binary.BigEndian.Uint16(b[12:]) {
	case pktbuild.EtherTypeIPv4:
		return b[:min(len(b), 14+int(binary.BigEndian.Uint16(b[16:])))]
	case pktbuild.EtherTypeIPv6:
		return b[:min(len(b), 14+40+int(binary.BigEndian.Uint16(b[18:])))]
	}
	return b
}

// TestStoreNoCarry: a hedger whose every store limit covers the MTU runs the pacer without
// carry; what the store cannot take is then recorded unhedged (NOCLONE), never cloned.
func TestStoreNoCarry(t *testing.T) {
	f := newFixture(t, fixtureOpts{noCarry: true})
	const id = 0x5003
	k4 := key(sSt4, client4, id)
	big := datagram(client4, svcSt4, idPayload(id, DefaultStoreLimit+1))
	runCases(t, f, f.objs.HedgeSplit, []progCase{
		{name: "payload above the store limit: not cloned, not hedged (NOCLONE)", in: big, ret: unspec,
			counters: bpftest.Counters{"st4.Requests": 1, "st4.StoreTooLarge": 1},
			board:    map[hedgeHreqKey]uint32{k4: reqNoClone}},
		{name: "ring full: not cloned, not hedged (NOCLONE)", in: datagram(client4, svcSt4, idPayload(id, 64)), ret: unspec,
			setup: func(tb testing.TB, f *fixture) {
				h := f.heads(tb, sSt4)
				c := f.cell(tb, sSt4, h.Tail)
				c.Lap = lapEmpty(h.Tail) + 1
				f.putCell(tb, sSt4, h.Tail, c)
				h.Tail += uint64(storeRing)
				if err := f.objs.StoreHeads.Put(uint32(sSt4), h); err != nil {
					tb.Fatal(err)
				}
			},
			counters: bpftest.Counters{"st4.Requests": 1, "st4.StoreFull": 1},
			board:    map[hedgeHreqKey]uint32{k4: reqNoClone}},
		{name: "within the limit: stored as ever", in: datagram(client4, svcSt4, idPayload(id, 64)), ret: unspec,
			counters: bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1, "dl.TicksRequested": 1, "dl.TicksArmed": 1},
			board:    map[hedgeHreqKey]uint32{k4: reqPending}},
	})
}
