package hedge

// BPF_PROG_TEST_RUN tests of the stored path (bpf/hedge/store.h, tick.h): the splitter stores a
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

// lapWord is the lap word of position pos in state (enum lap_state, bpf/hedge/store.h).
func lapWord(pos uint64, state hedgeLapState) uint64 {
	return pos/uint64(storeRing)<<uint64(hedgeLapStateLAP_STATE_BITS) | uint64(state)
}

func lapEmpty(pos uint64) uint64 { return lapWord(pos, hedgeLapStateLAP_EMPTY) }

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

// putLap writes the lap of service svc's cell at pos (store_laps).
func (f *fixture) putLap(tb testing.TB, svc int, pos uint64, lap uint64) {
	tb.Helper()
	if err := f.objs.StoreLaps.Put(cellIndex(svc, pos), hedgeStoreLap{Lap: lap}); err != nil {
		tb.Fatalf("write store lap %d/%d: %v", svc, pos, err)
	}
}

// held finds the stored request with key k that lives in its ring cell (pending or answered
// there, not moved to the scoreboard): its position and the scoreboard entry it stands for.
func (f *fixture) held(tb testing.TB, k hedgeHreqKey) (pos uint64, e hedgeHreq, ok bool) {
	tb.Helper()
	svc := int(k.Svc)
	var h hedgeStorePos
	if err := f.objs.StoreHeads.Lookup(uint32(svc), &h); err != nil {
		return 0, e, false
	}
	for pos := h.Head; pos < h.Tail; pos++ {
		var l hedgeStoreLap
		if err := f.objs.StoreLaps.Lookup(cellIndex(svc, pos), &l); err != nil {
			tb.Fatalf("read store lap %d/%d: %v", svc, pos, err)
		}
		if l.Key != k {
			continue
		}
		switch l.Lap {
		case lapWord(pos, hedgeLapStateLAP_PENDING):
			e.State = reqPending
		case lapWord(pos, hedgeLapStateLAP_ANSWERED):
			e.State = reqAnswered
		default:
			continue
		}
		c := f.cell(tb, svc, pos)
		e.SentNs, e.DeadlineNs, e.OrigReplica, e.HedgeReplica = c.SentNs, c.DeadlineNs, c.OrigReplica, replicaNone
		if c.OrigReplica < 8 {
			e.Tried = 1 << c.OrigReplica
		}
		return pos, e, true
	}
	return 0, e, false
}

// evict removes request k's scoreboard entry, as the LRU map's eviction does. A stored request
// that lives in its cell is never evicted (it has no entry): it is marked moved to the
// scoreboard first (a request past its deadline whose hedge was queued again, say), then its
// entry goes.
func (f *fixture) evict(tb testing.TB, k hedgeHreqKey) {
	tb.Helper()
	if pos, _, ok := f.held(tb, k); ok {
		idx := cellIndex(int(k.Svc), pos)
		var l hedgeStoreLap
		if err := f.objs.StoreLaps.Lookup(idx, &l); err != nil {
			tb.Fatal(err)
		}
		l.Lap = lapWord(pos, hedgeLapStateLAP_MOVED)
		if err := f.objs.StoreLaps.Put(idx, l); err != nil {
			tb.Fatal(err)
		}
		return
	}
	if err := f.objs.Scoreboard.Delete(k); err != nil {
		tb.Fatalf("evict %v: %v", k, err)
	}
}

// parkRing is the ring id of service svc's park ring (bpf/hedge/store.h): after the store rings.
func (f *fixture) parkRing(svc int) int {
	return int(f.objs.StoreRing.MaxEntries())/(2*storeRing) + svc
}

// resetStore empties every service's rings, store and park (releases the cells between head
// and tail), and clears the pacer's armed deadline.
func (f *fixture) resetStore(tb testing.TB) {
	tb.Helper()
	for svc := range f.h.Config.Services {
		for _, ring := range []int{svc, f.parkRing(svc)} {
			h := f.heads(tb, ring)
			for pos := h.Head; pos < h.Tail; pos++ {
				f.putLap(tb, ring, pos, lapEmpty(pos+uint64(storeRing)))
			}
			h.Head = h.Tail
			if err := f.objs.StoreHeads.Put(uint32(ring), h); err != nil {
				tb.Fatalf("write store_heads[%d]: %v", ring, err)
			}
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

// makeDue moves the deadline of every queued cell of svc to ago before f.now.
func (f *fixture) makeDue(tb testing.TB, svc int, ago time.Duration) {
	tb.Helper()
	if err := f.dueAt(svc, f.now, ago); err != nil {
		tb.Fatal(err)
	}
}

// dueAt moves the deadline of every queued cell of svc to ago before now (ago < 0: after
// now): a run's prepare (runAt).
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

// storedDueAt is a prepare (runAt) that makes every stored request of the stored services
// due 100 us before the run.
func (f *fixture) storedDueAt(now uint64) error {
	for _, svc := range []int{sSt4, sSt6} {
		if err := f.dueAt(svc, now, 100*time.Microsecond); err != nil {
			return err
		}
	}
	return nil
}

// tickFrame is a pacer tick frame for deadline, n bytes long, as the pacer delivers it.
func tickFrame(deadline uint64, n int) []byte {
	return pacer.TickFrame(pacer.Tick{Magic: pacer.TickMagic, DeadlineNs: deadline}, n)
}

// store runs the splitter on req and fails unless it was stored.
func (f *fixture) store(tb testing.TB, req []byte) {
	tb.Helper()
	r, err := f.run(f.objs.HedgeSplit, req, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if r.Ret != unspec {
		tb.Fatalf("splitter verdict %s, want TC_ACT_UNSPEC", verdict(r.Ret))
	}
}

// armTick arms the pacer for deadline, as the pacer has it when it delivers that tick.
func (f *fixture) armTick(tb testing.TB, deadline uint64) {
	tb.Helper()
	if err := f.objs.PacerArming.Put(uint32(0), pacerState{ArmedNs: deadline}); err != nil {
		tb.Fatalf("write pacer_arming: %v", err)
	}
}

// armed is a Setup: the pacer armed for tickIn.
func (f *fixture) armed(tb testing.TB) { f.armTick(tb, now0-1000) }

// at turns fn, which writes state relative to the time a run reads, into a case's Setup (at
// now0, the time every case runs at).
func (f *fixture) at(fn func(f *fixture, now uint64) error) func(testing.TB) {
	return func(tb testing.TB) {
		tb.Helper()
		if err := fn(f, now0); err != nil {
			tb.Fatal(err)
		}
	}
}

// armedTick arms the pacer 1 us before f.now and returns that tick's frame, as the pacer
// delivers it.
func (f *fixture) armedTick(tb testing.TB) []byte {
	tb.Helper()
	f.armTick(tb, f.now-1000)
	return tickFrame(f.now-1000, 128)
}

// setClock sets the programs' clock to f.now, for runs outside f.run (the race tests').
func (f *fixture) setClock(tb testing.TB) {
	tb.Helper()
	if err := f.objs.KedgeClockNs.Set(f.now); err != nil {
		tb.Fatalf("set the clock: %v", err)
	}
}

// tick runs the rescuer on a tick at f.now (the pacer armed for it 1 us before).
func (f *fixture) tick(tb testing.TB) bpftest.Result {
	tb.Helper()
	return f.tickAt(tb, nil)
}

// tickAt is tick with prepare (if not nil) called with f.now right before the run.
func (f *fixture) tickAt(tb testing.TB, prepare func(now uint64) error) bpftest.Result {
	tb.Helper()
	r, err := f.runAt(f.objs.HedgeRescue, f.armedTick(tb), 0, prepare)
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
	stored := func(svc int, k hedgeHreqKey, req []byte) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, _ bpftest.Result) {
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
	nothingQueued := func(svc int) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, _ bpftest.Result) {
			if q := f.queued(tb, svc); len(q) != 0 {
				tb.Errorf("%d cells queued, want none", len(q))
			}
		}
	}
	armed := bpftest.Counters{"dl.TicksRequested": 1, "dl.TicksArmed": 1}
	cases := []bpftest.Case{
		{Name: "ipv4 request: stored, a tick asked for at its deadline, not cloned", In: req4, WantRet: unspec,
			WantCounters: armed.With(bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, stored(sSt4, k4, req4))},
		{Name: "ipv6 request: stored", In: req6, WantRet: unspec,
			WantCounters: armed.With(bpftest.Counters{"st6.Requests": 1, "st6.Stored": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k6: reqPending}, stored(sSt6, k6, req6))},
		{Name: "payload at the store limit: stored", In: limit, WantRet: unspec,
			WantCounters: armed.With(bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, stored(sSt4, k4, limit))},
		{ // Armed for 0.9 s after the run's time: before the request's deadline (1 s after
			// the splitter's run) and not presumed lost (lost_ns 1 s).
			Name: "a later tick armed already: coalesced, stored", In: req4,
			Setup: f.at(func(f *fixture, now uint64) error {
				return f.objs.PacerArming.Put(uint32(0), pacerState{ArmedNs: now + uint64(storeDelay*9/10)})
			}),
			WantRet:      unspec,
			WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1, "dl.TicksRequested": 1, "dl.TicksCoalesced": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending})},
		{Name: "payload above the store limit: cloned (store_too_large)", In: big, WantRet: unspec,
			WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.StoreTooLarge": 1, "st4.Clones": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, nothingQueued(sSt4))},
		{Name: "ring full: cloned (store_full)", In: req4,
			Setup: func(tb testing.TB) {
				// The cell a lap back is still held (filled, not released).
				h := f.heads(tb, sSt4)
				f.putLap(tb, sSt4, h.Tail, lapWord(h.Tail, hedgeLapStateLAP_MOVED))
				h.Tail += uint64(storeRing)
				if err := f.objs.StoreHeads.Put(uint32(sSt4), h); err != nil {
					tb.Fatal(err)
				}
				tb.Cleanup(func() {}) // resetStore releases them
			},
			WantRet: unspec, WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.StoreFull": 1, "st4.Clones": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending})},
		{Name: "ipv4 options: cloned (store_unsupported)",
			In: frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1}}}.build(client4, svcSt4, p), WantRet: unspec,
			WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.StoreUnsupported": 1, "st4.Clones": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, nothingQueued(sSt4))},
		{Name: "vlan tag in the frame: cloned (store_unsupported)", In: frame{vlan: true}.build(client4, svcSt4, p),
			WantRet: unspec, WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.StoreUnsupported": 1, "st4.Clones": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, nothingQueued(sSt4))},
		{Name: "a hedge (hedge mark): neither stored nor cloned", In: req4, Skb: &skBuff{Mark: hedgeMark},
			WantRet: unspec, Check: f.leaves(nil, nothingQueued(sSt4))},
		{Name: "truncated: passed, counted malformed, nothing stored", In: pktbuild.Truncate(req4, 14+20+4),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.Malformed": 1},
			Check: f.leaves(nil, nothingQueued(sSt4))},
		{Name: "request shorter than its id: passed, nothing stored", In: datagram(client4, svcSt4, []byte{1, 2}),
			WantRet: unspec, WantCounters: bpftest.Counters{"st4.ShortRequests": 1},
			Check: f.leaves(nil, nothingQueued(sSt4))},
	}
	runCases(t, f, f.objs.HedgeSplit, cases)
}

// pacerState is struct pacer_state (bpf/include/pacer.h) as bpf2go gives it to this package.
type pacerState = pacer.State

func TestStoreTick(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
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

	// storeDue stores reqs; the case's Setup makes them due (storedDue).
	storeDue := func(reqs ...[]byte) func(tb testing.TB) {
		return func(tb testing.TB) {
			for _, r := range reqs {
				f.store(tb, r)
			}
		}
	}
	due := f.at((*fixture).storedDueAt)
	setState := func(k hedgeHreqKey, s uint32) func(tb testing.TB) {
		return func(tb testing.TB) {
			e, ok := f.entry(tb, k)
			if !ok {
				tb.Fatalf("no entry %v", k)
			}
			e.State = s
			f.put(tb, k, e)
		}
	}
	maxHedges := func(svc int, n uint8) func(tb testing.TB) {
		return func(tb testing.TB) {
			c := f.svcCfg(tb, svc)
			c.MaxHedges = n
			if err := f.objs.SvcCfgs.Put(uint32(svc), c); err != nil {
				tb.Fatal(err)
			}
		}
	}
	hedgedTo := func(k hedgeHreqKey, tried uint8, n uint8, rep uint8) func(tb testing.TB, r bpftest.Result) {
		return func(tb testing.TB, _ bpftest.Result) {
			e, _ := f.entry(tb, k)
			if e.Tried != tried || e.HedgesSent != n || e.HedgeReplica != rep {
				tb.Errorf("entry %+v: want tried %#b, hedges_sent %d, hedge_replica %d", e, tried, n, rep)
			}
		}
	}
	// queued: the cells left per service (every other service's ring empty).
	queued := func(want map[int]int) func(tb testing.TB, r bpftest.Result) {
		return func(tb testing.TB, _ bpftest.Result) {
			for svc := range f.h.Config.Services {
				if got := len(f.queued(tb, svc)); got != want[svc] {
					tb.Errorf("service %d: %d cells queued, want %d", svc, got, want[svc])
				}
			}
		}
	}
	// sent: the skb after the tick is the hedge out, from its IP header on, with valid
	// checksums.
	sent := func(out []byte) func(tb testing.TB, r bpftest.Result) {
		return func(tb testing.TB, r bpftest.Result) {
			if len(r.Out) < 14 || !slices.Equal(trimFrame(r.Out)[14:], out) {
				tb.Errorf("skb after the tick: %s", bpftest.DiffBytes(trimFrame(r.Out)[14:], out))
			}
			if err := pktbuild.VerifyChecksums(trimFrame(r.Out)); err != nil {
				tb.Errorf("hedge: %v", err)
			}
		}
	}
	none := queued(nil)
	tick := bpftest.Counters{"global.PacerTicks": 1, "dl.TicksDelivered": 1, "dl.LateCount": 1}
	// Every case: the tick's skb compared only where a hedge is expected (Check: sent); the
	// counters, the scoreboard (f.leaves) and every ring's cells checked.
	f.runner(f.objs.HedgeRescue).Run(t, []bpftest.Case{
		{Name: "nothing stored: tick dropped, no next tick", In: tickIn, Setup: f.armed, WantRet: shot, WantCounters: tick,
			Check: f.leaves(nil, none)},
		{Name: "stored, not yet due: nothing sent, next tick asked for at its deadline", In: tickIn, WantRet: shot,
			// Due a delay after the run.
			Setup:        bpftest.Seq(f.armed, func(tb testing.TB) { f.store(tb, req4) }, f.at(func(f *fixture, now uint64) error { return f.dueAt(sSt4, now, -storeDelay) })),
			WantCounters: tick.With(bpftest.Counters{"dl.TicksRequested": 1, "dl.TicksArmed": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, queued(map[int]int{sSt4: 1}))},
		{Name: "due ipv4: rebuilt into the hedge to the first replica, left to bpf_redirect_neigh", In: tickIn,
			Setup: bpftest.Seq(f.armed, storeDue(req4), due), WantRet: redirect,
			WantCounters: tick.With(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, none, sent(hedge(repSt1, req4)[14:]), hedgedTo(k4, 0b011, 1, 1))},
		{Name: "due ipv6: rebuilt (protocol changed to IPv6), full checksum", In: tickIn,
			Setup: bpftest.Seq(f.armed, storeDue(req6), due), WantRet: redirect,
			WantCounters: tick.With(bpftest.Counters{"st6.HedgesSent": 1, "st6.TickHedges": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k6: reqHedged}, none, sent(hedge(repSt6, req6)[14:]), hedgedTo(k6, 0b011, 1, 1))},
		{Name: "stored bytes with a partial udp checksum: the hedge carries a full one", In: tickIn,
			Setup: bpftest.Seq(f.armed, storeDue(partial), due), WantRet: redirect,
			WantCounters: tick.With(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, none, sent(hedge(repSt1, req4)[14:]))},
		{Name: "several due in one tick: a hedge each, all but the last cloned back in to leave", In: tickIn, WantRet: redirect,
			Setup: bpftest.Seq(f.armed, storeDue(req4, datagram(client4, svcSt4, idPayload(id+1, 100)), datagram(client4, svcSt4, idPayload(id+2, 100)), req6), due),
			WantCounters: tick.With(bpftest.Counters{"st4.HedgesSent": 3, "st4.TickHedges": 3, "st6.HedgesSent": 1, "st6.TickHedges": 1,
				"global.HedgesReinjected": 3}),
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged, key(sSt4, client4, id+1): reqHedged, key(sSt4, client4, id+2): reqHedged, k6: reqHedged},
				none, sent(hedge(repSt6, req6)[14:]))},
		{Name: "a hedge cloned back in (hedge mark): left to bpf_redirect_neigh", In: hedge(repSt1, req4), Skb: &skBuff{Mark: hedgeMark},
			WantRet: redirect, WantCounters: bpftest.Counters{}, Check: f.leaves(nil, none, sent(hedge(repSt1, req4)[14:]))},
		{Name: "answered before it was due: nothing sent, entry deleted", In: tickIn,
			Setup: bpftest.Seq(f.armed, storeDue(req4), setState(k4, reqAnswered), due), WantRet: shot,
			WantCounters: tick.With(bpftest.Counters{"st4.StoredAnswered": 1}), Check: f.leaves(nil, none)},
		{Name: "hedge answered already (ANSWERED_HEDGED): nothing sent, entry kept for the duplicate", In: tickIn,
			Setup: bpftest.Seq(f.armed, storeDue(req4), setState(k4, reqAnsweredHedge), due), WantRet: shot,
			WantCounters: tick.With(bpftest.Counters{"st4.StoredAnswered": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}, none)},
		{Name: "moved to the scoreboard, then evicted: nothing sent (stored_orphaned)", In: tickIn, WantRet: shot,
			Setup:        bpftest.Seq(f.armed, storeDue(req4), func(tb testing.TB) { f.evict(tb, k4) }, due),
			WantCounters: tick.With(bpftest.Counters{"st4.StoredOrphaned": 1}), Check: f.leaves(nil, none)},
		{Name: "replaced by a newer request with the same key: the old cell sends nothing", In: tickIn, WantRet: shot,
			Setup: bpftest.Seq(f.armed, storeDue(req4), func(tb testing.TB) {
				e, _ := f.entry(tb, k4)
				e.SentNs++
				f.put(tb, k4, e)
			}, due),
			WantCounters: tick.With(bpftest.Counters{"st4.StoredOrphaned": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, none)},
		{Name: "far overdue (deadline + delay passed): dropped, not sent late", In: tickIn, WantRet: shot,
			Setup: bpftest.Seq(f.armed, func(tb testing.TB) { f.store(tb, req4) },
				f.at(func(f *fixture, now uint64) error { return f.dueAt(sSt4, now, storeDelay+time.Nanosecond) })),
			WantCounters: tick.With(bpftest.Counters{"st4.OverdueDropped": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqNoHedge}, none)},
		{Name: "late, at the cutoff (deadline + delay) exactly: still sent", In: tickIn, WantRet: redirect,
			Setup: bpftest.Seq(f.armed, func(tb testing.TB) { f.store(tb, req4) },
				f.at(func(f *fixture, now uint64) error { return f.dueAt(sSt4, now, storeDelay) })),
			WantCounters: tick.With(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, none, sent(hedge(repSt1, req4)[14:]))},
		{Name: "max_hedges 2: first hedge sent and the request queued again at now + delay", In: tickIn, WantRet: redirect,
			Setup: bpftest.Seq(f.armed, maxHedges(sSt4, 2), storeDue(req4), due),
			WantCounters: tick.With(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1, "st4.Requeued": 1,
				"dl.TicksRequested": 1, "dl.TicksArmed": 1}),
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, queued(map[int]int{sSt4: 1}), hedgedTo(k4, 0b011, 1, 1),
				func(tb testing.TB, r bpftest.Result) {
					q := f.queued(tb, sSt4)
					if len(q) == 0 {
						return // reported already: "0 cells queued, want 1"
					}
					// Re-queued at the rescuer's now + the delay.
					if d := q[0].DeadlineNs; d != r.Now+uint64(storeDelay) {
						tb.Errorf("re-queued deadline %d, want a delay after the run (%d)", d, r.Now+uint64(storeDelay))
					}
				})},
		{Name: "max_hedges 2, second tick: second hedge to the other replica, not queued again", In: tickIn, WantRet: redirect,
			Setup: bpftest.Seq(maxHedges(sSt4, 2), storeDue(req4), func(tb testing.TB) {
				f.tickAt(tb, f.storedDueAt)
			}, f.armed, due),
			WantCounters: tick.With(bpftest.Counters{"st4.HedgesSent": 1, "st4.TickHedges": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, none, sent(hedge(repSt2, req4)[14:]), hedgedTo(k4, 0b111, 2, 2))},
		{Name: "max_hedges 4 but two replicas: the third finds none left (no_replica)", In: tickIn, WantRet: shot,
			Setup: bpftest.Seq(maxHedges(sSt4, 4), storeDue(req4), func(tb testing.TB) {
				for i := 0; i < 2; i++ {
					f.tickAt(tb, f.storedDueAt)
				}
			}, f.armed, due),
			WantCounters: tick.With(bpftest.Counters{"st4.NoReplica": 1}),
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, none, hedgedTo(k4, 0b111, 2, 2))},
		{Name: "malformed tick (bad magic): dropped, counted by the pacer", In: func() []byte {
			b := tickFrame(1, 128)
			b[34] ^= 0xff
			return b
		}(), WantRet: shot, WantCounters: bpftest.Counters{"dl.MalformedTicks": 1}, Check: f.leaves(nil, none)},
		{Name: "truncated tick frame (headers, part of the tick): dropped, counted by the pacer", In: tickFrame(1, 128)[:40], WantRet: shot,
			WantCounters: bpftest.Counters{"dl.MalformedTicks": 1}, Check: f.leaves(nil, none)},
		{Name: "not IP at all: no tick, dropped as unmatched", In: func() []byte {
			b := tickFrame(1, 60)
			binary.BigEndian.PutUint16(b[12:], 0x88b5)
			return b
		}(), WantRet: shot, WantCounters: bpftest.Counters{"global.RescueUnmatched": 1}, Check: f.leaves(nil, none)},
	})
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
	runCases(t, f, f.objs.HedgeSplit, []bpftest.Case{
		{Name: "payload above the store limit: not cloned, not hedged (NOCLONE)", In: big, WantRet: unspec,
			WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.StoreTooLarge": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqNoClone})},
		{Name: "ring full: not cloned, not hedged (NOCLONE)", In: datagram(client4, svcSt4, idPayload(id, 64)),
			Setup: func(tb testing.TB) {
				h := f.heads(tb, sSt4)
				f.putLap(tb, sSt4, h.Tail, lapWord(h.Tail, hedgeLapStateLAP_MOVED))
				h.Tail += uint64(storeRing)
				if err := f.objs.StoreHeads.Put(uint32(sSt4), h); err != nil {
					tb.Fatal(err)
				}
			},
			WantRet: unspec, WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.StoreFull": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqNoClone})},
		{Name: "within the limit: stored as ever", In: datagram(client4, svcSt4, idPayload(id, 64)), WantRet: unspec,
			WantCounters: bpftest.Counters{"st4.Requests": 1, "st4.Stored": 1, "dl.TicksRequested": 1, "dl.TicksArmed": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending})},
	})
}
