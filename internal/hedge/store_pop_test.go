package hedge

// The stored path without per-request ticks: the first response to a stored request claims it
// in its ring cell (store_claim, store.h) and pops the answered cells at the head
// (store_pop_answered), and a tick pops cells whose request no longer waits even before their
// deadline (tick_one, tick.h), then asks the pacer for the first request that still waits. Fixtures: bpf_fixtures_test.go.

import (
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestStorePops(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const a, b, c = 0x5101, 0x5102, 0x5103
	armed := func(tb testing.TB) uint64 {
		tb.Helper()
		var st pacerState
		if err := f.objs.PacerArming.Lookup(uint32(0), &st); err != nil {
			tb.Fatal(err)
		}
		return st.ArmedNs
	}
	wantQueued := func(tb testing.TB, ids ...uint64) {
		tb.Helper()
		q := f.queued(tb, sSt4)
		if len(q) != len(ids) {
			tb.Fatalf("%d cells queued, want %d", len(q), len(ids))
		}
		for i, c := range q {
			if c.Key.Id != ids[i] {
				tb.Errorf("cell %d holds id %#x, want %#x", i, c.Key.Id, ids[i])
			}
		}
	}

	t.Run("in-order response pops its cell", func(t *testing.T) {
		f.reset(t)
		f.store(t, stReq(a))
		wantQueued(t, a)
		d := delta(t, f, func() { f.answer(t, a) })
		wantQueued(t)
		if _, ok := f.entry(t, key(sSt4, client4, a)); ok {
			t.Error("scoreboard entry of the popped request left")
		}
		if d["st4.StoredAnswered"] != 1 || d["st4.Responses"] != 1 {
			t.Errorf("counters %v: want one stored_answered, one response", nonZeroCounts(d))
		}
	})

	t.Run("out-of-order response stays until the head's pops it", func(t *testing.T) {
		f.reset(t)
		f.store(t, stReq(a))
		f.store(t, stReq(b))
		f.store(t, stReq(c))
		f.answer(t, b) // not the head: stays, answered in its cell
		wantQueued(t, a, b, c)
		if e, ok := f.entry(t, key(sSt4, client4, b)); !ok || e.State != reqAnswered {
			t.Errorf("b: %v (%v), want answered in its cell", stateNames[e.State], ok)
		}
		// The head's response pops its own cell and the answered one behind it.
		d := delta(t, f, func() { f.answer(t, a) })
		wantQueued(t, c)
		if d["st4.StoredAnswered"] != 2 || d["st4.Responses"] != 1 {
			t.Errorf("counters %v: want two stored_answered, one response", nonZeroCounts(d))
		}
		if b := f.board(t); len(b) != 1 || b[key(sSt4, client4, c)] != reqPending {
			t.Errorf("board %v: want c pending only", b)
		}
	})

	t.Run("answered head left to the tick", func(t *testing.T) {
		f.reset(t)
		f.store(t, stReq(a))
		f.store(t, stReq(b))
		// a answered in its cell, not popped (its response lost the head to a tick).
		e, _ := f.entry(t, key(sSt4, client4, a))
		e.State = reqAnswered
		f.put(t, key(sSt4, client4, a), e)
		// Nothing is due (the stored services wait a second, counted here from right before
		// the tick's run): the tick pops a, answered, sends nothing, and asks for a tick at
		// b's deadline, the first that still waits.
		var r bpftest.Result
		d := delta(t, f, func() {
			r = f.tickAt(t, func(now uint64) error { return f.dueAt(sSt4, now, -storeDelay) })
		})
		if r.Ret != bpftest.TCActShot {
			t.Errorf("tick verdict %s, want TC_ACT_SHOT (nothing sent)", verdict(r.Ret))
		}
		wantQueued(t, b)
		if d["st4.StoredAnswered"] != 1 || d["st4.TickHedges"] != 0 || d["dl.TicksArmed"] != 1 {
			t.Errorf("counters %v: want one stored_answered, no hedge, one tick armed", nonZeroCounts(d))
		}
		if cell, got := f.queued(t, sSt4)[0], armed(t); got != cell.DeadlineNs {
			t.Errorf("tick armed at %d, want b's deadline %d", got, cell.DeadlineNs)
		}
		if _, ok := f.entry(t, key(sSt4, client4, a)); ok {
			t.Error("the answered request left behind")
		}
	})

	t.Run("a response deep in the ring finds its cell", func(t *testing.T) {
		f.reset(t)
		// More waiting requests than the response path looks at in its plain loop
		// (CLAIM_NEAR, 16): the rest of the ring is searched too.
		const n, deep = 40, 37
		var ids []uint64
		for i := uint32(0); i < n; i++ {
			f.store(t, stReq(0x5200+i))
			ids = append(ids, uint64(0x5200+i))
		}
		d := delta(t, f, func() { f.answer(t, 0x5200+deep) })
		wantQueued(t, ids...)
		if e, ok := f.entry(t, key(sSt4, client4, 0x5200+deep)); !ok || e.State != reqAnswered {
			t.Errorf("request %d of %d: %v (%v), want answered in its cell", deep, n, stateNames[e.State], ok)
		}
		if d["st4.Responses"] != 1 || d["st4.UnmatchedResponses"] != 0 {
			t.Errorf("counters %v: want one response", nonZeroCounts(d))
		}
		// A second response of it is the application's own duplicate: passed, not counted.
		d = delta(t, f, func() { f.answer(t, 0x5200+deep) })
		if len(nonZeroCounts(d)) != 0 {
			t.Errorf("counters %v: want none for a later response of an unhedged request", nonZeroCounts(d))
		}
	})

	t.Run("nothing waits: no tick asked for", func(t *testing.T) {
		f.reset(t)
		f.store(t, stReq(a))
		f.store(t, stReq(b))
		f.answer(t, b)
		f.evict(t, key(sSt4, client4, a))
		var r bpftest.Result
		d := delta(t, f, func() { r = f.tick(t) })
		if r.Ret != bpftest.TCActShot {
			t.Errorf("tick verdict %s, want TC_ACT_SHOT", verdict(r.Ret))
		}
		wantQueued(t)
		if d["st4.StoredOrphaned"] != 1 || d["st4.StoredAnswered"] != 1 || d["dl.TicksArmed"] != 0 {
			t.Errorf("counters %v: want one orphaned, one answered, no tick armed", nonZeroCounts(d))
		}
		if got := armed(t); got != 0 {
			t.Errorf("a tick armed at %d with nothing waiting", got)
		}
	})
}

// nonZeroCounts is c without its zero counters (for messages).
func nonZeroCounts(c bpftest.Counters) bpftest.Counters {
	out := bpftest.Counters{}
	for k, v := range c {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}
