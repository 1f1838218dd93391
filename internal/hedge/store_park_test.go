package hedge

// A stalled request at the head of a store ring: the answered requests behind it leave the
// ring at once, because the first response behind a ring STORE_PARK_DEPTH deep moves the
// stalled one into its service's park ring (store_park, bpf/hedge/store.h); it is still
// hedged at its deadline, from the park ring (tick.h). Fixtures: bpf_fixtures_test.go.

import (
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestStoreParksStalledHead(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const stalled = 0x6000
	counters := func(tb testing.TB) bpftest.Counters {
		tb.Helper()
		c, err := f.counters()
		if err != nil {
			tb.Fatal(err)
		}
		return c
	}
	// stall stores the stalled request, then n more, each answered at once: more than the
	// ring holds when n is above STORE_RING. Returns the counters' change.
	stall := func(tb testing.TB, n int) bpftest.Counters {
		tb.Helper()
		before := counters(tb)
		f.store(tb, stReq(stalled))
		for i := range n {
			id := uint32(stalled + 1 + i)
			f.store(tb, stReq(id))
			f.answer(tb, id)
		}
		return counters(tb).Sub(before)
	}
	k := key(sSt4, client4, stalled)
	n := storeRing + storeRing/2
	depth := uint64(hedgeHedgeLimitsSTORE_PARK_DEPTH)

	t.Run("answered behind a stalled head leave; the stalled one is hedged at its deadline", func(t *testing.T) {
		f.reset(t)
		d := stall(t, n)
		if d["st4.StoreFull"] != 0 || d["st4.Stored"] != int64(n+1) {
			t.Errorf("counters %v: want %d stored, none finding the ring full", nonZeroCounts(d), n+1)
		}
		if d["st4.StoredParked"] != 1 || d["st4.StoredAnswered"] != int64(n) || d["st4.Responses"] != int64(n) {
			t.Errorf("counters %v: want the stalled request parked once, %d answered and popped", nonZeroCounts(d), n)
		}
		if h := f.heads(t, sSt4); h.Tail-h.Head >= depth {
			t.Errorf("store ring %d deep after every request behind the stalled one was answered, want below %d", h.Tail-h.Head, depth)
		}
		if q := f.queued(t, f.parkRing(sSt4)); len(q) != 1 || q[0].Key != k {
			t.Fatalf("park ring holds %d cells, want the stalled request's", len(q))
		}
		if e, ok := f.entry(t, k); !ok || e.State != reqPending {
			t.Fatalf("stalled request: %v (%v), want pending in the scoreboard", stateNames[e.State], ok)
		}
		var r bpftest.Result
		d = delta(t, f, func() {
			r = f.tickAt(t, func(now uint64) error { return f.dueAt(f.parkRing(sSt4), now, 100*time.Microsecond) })
		})
		if r.Ret != redirect {
			t.Errorf("tick verdict %s, want the hedge left to bpf_redirect_neigh", verdict(r.Ret))
		}
		if d["st4.HedgesSent"] != 1 || d["st4.TickHedges"] != 1 {
			t.Errorf("counters %v: want the stalled request's hedge sent", nonZeroCounts(d))
		}
		if e, ok := f.entry(t, k); !ok || e.State != reqHedged {
			t.Errorf("stalled request: %v (%v), want hedged", stateNames[e.State], ok)
		}
		if q := f.queued(t, f.parkRing(sSt4)); len(q) != 0 {
			t.Errorf("park ring holds %d cells after the tick, want none", len(q))
		}
	})

	t.Run("a parked request answered before its deadline: nothing sent", func(t *testing.T) {
		f.reset(t)
		d := stall(t, int(depth))
		if d["st4.StoredParked"] != 1 {
			t.Fatalf("counters %v: want the stalled request parked", nonZeroCounts(d))
		}
		d = delta(t, f, func() { f.answer(t, stalled) })
		if d["st4.Responses"] != 1 || d["st4.UnmatchedResponses"] != 0 {
			t.Errorf("counters %v: want the parked request's response counted first", nonZeroCounts(d))
		}
		// Its cell goes at the next tick, before its deadline, with the answered cells left in
		// the store ring; no hedge.
		left := len(f.queued(t, sSt4))
		var r bpftest.Result
		d = delta(t, f, func() { r = f.tick(t) })
		if r.Ret != shot || d["st4.HedgesSent"] != 0 || d["st4.StoredAnswered"] != int64(left+1) {
			t.Errorf("tick verdict %s, counters %v: want nothing sent, the parked cell and %d answered ones popped",
				verdict(r.Ret), nonZeroCounts(d), left)
		}
		if q := f.queued(t, f.parkRing(sSt4)); len(q) != 0 {
			t.Errorf("park ring holds %d cells after the tick, want none", len(q))
		}
	})
}

// delta is the change of f's counters over fn.
func delta(tb testing.TB, f *fixture, fn func()) bpftest.Counters {
	tb.Helper()
	before, err := f.counters()
	if err != nil {
		tb.Fatal(err)
	}
	fn()
	after, err := f.counters()
	if err != nil {
		tb.Fatal(err)
	}
	return after.Sub(before)
}

// stReq and stResp are a request of service st4 (the stored path) with id, and its response.
func stReq(id uint32) []byte  { return datagram(client4, svcSt4, idPayload(id, 64)) }
func stResp(id uint32) []byte { return datagram(svcSt4, client4, idPayload(id, 64)) }

// answer runs the response path on st4's response to id and fails unless it passed.
func (f *fixture) answer(tb testing.TB, id uint32) {
	tb.Helper()
	r, err := f.run(f.objs.HedgeResp, stResp(id), 0)
	if err != nil {
		tb.Fatal(err)
	}
	if r.Ret != unspec {
		tb.Fatalf("response verdict %s, want TC_ACT_UNSPEC", verdict(r.Ret))
	}
}
