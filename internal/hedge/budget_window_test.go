package hedge

import (
	"testing"
)

// winSums adds up the window budget's slots (all of them: a fixture's run lasts well
// inside one window).
func winSums(st hedgeSvcState) (requests, hedges uint64) {
	for i := range st.WinEpoch {
		requests += st.WinRequests[i]
		hedges += st.WinHedges[i]
	}
	return requests, hedges
}

// TestWindowBudget runs the splitter and the rescuer of service "win" (window budget:
// ratio 0.5, floor 1) request by request: a clone reserves its hedge while
// hedges + reservations <= 0.5 x requests + 1 over the window; a hedge sent charges the
// window, a clone dropped unhedged releases its reservation; slots older than the window
// no longer count.
func TestWindowBudget(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.reset(t)
	req := func(id uint32) []byte { return datagram(client4, svcWin, idPayload(id, 32)) }
	split := func(id uint32, wantClone bool) {
		t.Helper()
		before, err := f.counters()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.run(f.objs.HedgeSplit, req(id), 0); err != nil {
			t.Fatal(err)
		}
		after, err := f.counters()
		if err != nil {
			t.Fatal(err)
		}
		cloned := after["win.Clones"] - before["win.Clones"]
		refused := after["win.BudgetExhausted"] - before["win.BudgetExhausted"]
		if wantClone && (cloned != 1 || refused != 0) || !wantClone && (cloned != 0 || refused != 1) {
			t.Errorf("request %d: clones +%d, budget_exhausted +%d; want cloned=%v", id, cloned, refused, wantClone)
		}
	}
	expect := func(what string, reserved int64, requests, hedges uint64) {
		t.Helper()
		st := f.state(t, sWin)
		r, h := winSums(st)
		if st.Reserved != reserved || r != requests || h != hedges {
			t.Errorf("%s: reserved %d, window requests %d hedges %d; want %d, %d, %d", what, st.Reserved, r, h, reserved, requests, hedges)
		}
	}
	rescue := func(id uint32, state uint32, wantRet uint32) {
		t.Helper()
		k := key(sWin, client4, uint64(id))
		now := monoNow(t)
		e := pending(now-20e6, now-10e6) // due 10 ms ago
		e.State = state
		f.put(t, k, e)
		r, err := f.run(f.objs.HedgeRescue, req(id), 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.ret != wantRet {
			t.Errorf("rescue of %d: verdict %d, want %d", id, r.ret, wantRet)
		}
	}

	split(1, true) // 0 + 1 <= 0.5*1 + 1
	expect("one request", 1, 1, 0)
	split(2, true) // 0 + 2 <= 0.5*2 + 1
	expect("two requests", 2, 2, 0)
	split(3, false) // 0 + 3 > 0.5*3 + 1: no clone, no reservation
	expect("a third request refused", 2, 3, 0)
	rescue(1, reqPending, redirect) // due, unanswered: the hedge charges the window
	expect("clone 1 became a hedge", 1, 3, 1)
	rescue(2, reqAnswered, shot) // answered: the reservation goes back
	expect("clone 2 dropped unhedged", 0, 3, 1)
	split(4, true) // 1 + 1 <= 0.5*4 + 1
	expect("a fourth request cloned", 1, 4, 1)
	split(5, true)  // 1 + 2 <= 0.5*5 + 1
	split(6, true)  // 1 + 3 <= 0.5*6 + 1
	split(7, false) // 1 + 4 > 0.5*7 + 1
	expect("seven requests", 3, 7, 1)

	// The window slides: slots from more than BUDGET_SLOTS slots ago no longer count. Age
	// every slot (its epoch far in the past) with a pile of hedges in it; only the floor and
	// the new request count then.
	st := f.state(t, sWin)
	for i := range st.WinEpoch {
		st.WinEpoch[i] = 1
		st.WinHedges[i] = 1000
	}
	st.Reserved = 0
	if err := f.objs.SvcStates.Put(uint32(sWin), st); err != nil {
		t.Fatal(err)
	}
	split(8, true) // 0 + 1 <= 0.5*1 + 1: the old hedges left the window
	if st := f.state(t, sWin); st.Reserved != 1 {
		t.Errorf("after the window slid: reserved %d, want 1", st.Reserved)
	}
}
