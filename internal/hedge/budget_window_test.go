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
// ratio 0.5, floor 1): every request is cloned; a due clone becomes a hedge while
// hedges <= 0.5 x requests + 1 over the window, charged when sent; beyond it the clone is
// dropped, the request REFUSED and counted budget_exhausted; slots older than the window
// no longer count.
func TestWindowBudget(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.reset(t)
	req := func(id uint32) []byte { return datagram(client4, svcWin, idPayload(id, 32)) }
	delta := func(run func()) (d map[string]int64) {
		t.Helper()
		before, err := f.counters()
		if err != nil {
			t.Fatal(err)
		}
		run()
		after, err := f.counters()
		if err != nil {
			t.Fatal(err)
		}
		d = map[string]int64{}
		for k, v := range after {
			if v != before[k] {
				d[k] = v - before[k]
			}
		}
		return d
	}
	split := func(id uint32) {
		t.Helper()
		d := delta(func() {
			if _, err := f.run(f.objs.HedgeSplit, req(id), 0); err != nil {
				t.Fatal(err)
			}
		})
		if d["win.Clones"] != 1 || d["win.Requests"] != 1 || len(d) != 2 {
			t.Errorf("request %d: counter changes %v, want win.Requests and win.Clones +1 (every request is cloned)", id, d)
		}
	}
	rescue := func(id uint32, wantHedge bool) {
		t.Helper()
		k := key(sWin, client4, uint64(id))
		e, ok := f.entry(t, k)
		if !ok {
			t.Fatalf("request %d not on the scoreboard", id)
		}
		now := monoNow(t)
		e.DeadlineNs = now - 1e6 // due a millisecond ago
		f.put(t, k, e)
		var r runResult
		d := delta(func() {
			var err error
			if r, err = f.run(f.objs.HedgeRescue, req(id), 0); err != nil {
				t.Fatal(err)
			}
		})
		got, _ := f.entry(t, k)
		switch {
		case wantHedge && (r.ret != redirect || d["win.HedgesSent"] != 1 || got.State != reqHedged):
			t.Errorf("rescue of %d: verdict %d, changes %v, state %s; want a hedge", id, r.ret, d, stateNames[got.State])
		case !wantHedge && (r.ret != shot || d["win.BudgetExhausted"] != 1 || d["win.HedgesSent"] != 0 || got.State != reqRefused):
			t.Errorf("rescue of %d: verdict %d, changes %v, state %s; want refused (budget_exhausted, REFUSED)", id, r.ret, d, stateNames[got.State])
		}
	}
	expect := func(what string, requests, hedges uint64) {
		t.Helper()
		r, h := winSums(f.state(t, sWin))
		if r != requests || h != hedges {
			t.Errorf("%s: window requests %d hedges %d; want %d, %d", what, r, h, requests, hedges)
		}
	}

	for id := uint32(1); id <= 4; id++ {
		split(id)
	}
	expect("four requests", 4, 0)
	rescue(1, true)  // 1 <= 0.5*4 + 1
	rescue(2, true)  // 2 <= 3
	rescue(3, true)  // 3 <= 3
	rescue(4, false) // 4 > 3: refused, nothing charged
	expect("three hedges, one refused", 4, 3)
	split(5)
	split(6)
	rescue(5, true) // 4 <= 0.5*6 + 1
	expect("six requests, four hedges", 6, 4)

	// A refused request answered after its deadline counts as unhedged_late.
	d := delta(func() {
		if _, err := f.run(f.objs.HedgeResp, datagram(svcWin, client4, idPayload(4, 32)), 0); err != nil {
			t.Fatal(err)
		}
	})
	if d["win.UnhedgedLate"] != 1 || d["win.Responses"] != 1 {
		t.Errorf("late response of the refused request: changes %v, want win.Responses and win.UnhedgedLate +1", d)
	}

	// The window slides: slots from more than BUDGET_SLOTS slots ago no longer count. Age
	// every slot (its epoch far in the past) with a pile of hedges in it; then one request
	// is 0.5 + 1 hedges' worth, and its hedge goes out.
	// The epoch BUDGET_SLOTS slots before now's (0, "unused", within a guest's first
	// window: its clock starts at boot).
	st := f.state(t, sWin)
	slot := f.svcCfg(t, sWin).BudgetSlotNs
	aged := uint64(0)
	if cur := monoNow(t)/slot + 1; cur > uint64(budgetSlots) {
		aged = cur - uint64(budgetSlots)
	}
	for i := range st.WinEpoch {
		st.WinEpoch[i] = aged
		st.WinHedges[i] = 1000
	}
	if err := f.objs.SvcStates.Put(uint32(sWin), st); err != nil {
		t.Fatal(err)
	}
	split(7)
	rescue(7, true)
}
