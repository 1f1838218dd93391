package hedge

import (
	"encoding/binary"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"net/netip"
	"sync"
	"testing"
	"time"
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
	// Slots of 1000 s: however slowly a loaded or emulated machine runs the steps below,
	// they share one slot, and the window's arithmetic is what is checked here (the slots'
	// edges and ageing at 1 s: TestWindowBudgetSlots).
	wc := f.svcCfg(t, sWin)
	wc.BudgetSlotNs = uint64(1000 * time.Second)
	if err := f.objs.SvcCfgs.Put(uint32(sWin), wc); err != nil {
		t.Fatal(err)
	}
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
		var r bpftest.Result
		d := delta(func() {
			var err error
			// Due a millisecond before the run, after dueDelay: the far-overdue cutoff is a
			// second away.
			r, err = f.runAt(f.objs.HedgeRescue, req(id), 0, func(now uint64) error {
				e.SentNs, e.DeadlineNs = now-uint64(dueDelay)-1e6, now-1e6
				return f.objs.Scoreboard.Put(k, e)
			})
			if err != nil {
				t.Fatal(err)
			}
		})
		got, _ := f.entry(t, k)
		switch {
		case wantHedge && (r.Ret != redirect || d["win.HedgesSent"] != 1 || got.State != reqHedged):
			t.Errorf("rescue of %d: verdict %d, changes %v, state %s; want a hedge", id, r.Ret, d, stateNames[got.State])
		case !wantHedge && (r.Ret != shot || d["win.BudgetExhausted"] != 1 || d["win.HedgesSent"] != 0 || got.State != reqRefused):
			t.Errorf("rescue of %d: verdict %d, changes %v, state %s; want refused (budget_exhausted, REFUSED)", id, r.Ret, d, stateNames[got.State])
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
	// The epoch BUDGET_SLOTS slots before now's.
	st := f.state(t, sWin)
	slot := f.svcCfg(t, sWin).BudgetSlotNs
	aged := uint64(0)
	if cur := f.now/slot + 1; cur > uint64(budgetSlots) {
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

// TestWindowBudgetSlots checks the window's arithmetic at its edges (service "win": ratio
// 0.5, floor 1, slots of 1 s), at the fixture's fixed time: a due request's hedge is charged to now's slot when
// hedges x 1000 <= requests x 500 + 1000 over the slots whose epoch lies within the last
// BUDGET_SLOTS (now's and the 9 before), refused one past it (and nothing stays charged);
// a slot 10 epochs old no longer counts; the slot now's epoch reuses is started over.
func TestWindowBudgetSlots(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.reset(t)
	slot := f.svcCfg(t, sWin).BudgetSlotNs
	if slot != uint64(time.Second) {
		t.Fatalf("slot %d ns, want 1 s (window 10 s / %d)", slot, budgetSlots)
	}
	// cur is the epoch (now / slot + 1) of the fixture's time, the one every run reads.
	cur := f.now/slot + 1
	type slotVal struct{ age, requests, hedges uint64 } // age: epochs before now's
	set := func(cur uint64, slots ...slotVal) {
		t.Helper()
		st := f.state(t, sWin)
		st.WinEpoch, st.WinRequests, st.WinHedges = [budgetSlots]uint64{}, [budgetSlots]uint64{}, [budgetSlots]uint64{}
		for _, s := range slots {
			e := cur - s.age
			st.WinEpoch[e%uint64(budgetSlots)], st.WinRequests[e%uint64(budgetSlots)], st.WinHedges[e%uint64(budgetSlots)] = e, s.requests, s.hedges
		}
		if err := f.objs.SvcStates.Put(uint32(sWin), st); err != nil {
			t.Fatal(err)
		}
	}
	// rescue runs the rescuer on a due request id: hedged or refused.
	rescue := func(id uint32) bool {
		t.Helper()
		r, e := rescueDue(t, f, sWin, svcWin, id)
		switch {
		case r.Ret == redirect && e.State == reqHedged:
			return true
		case r.Ret == shot && e.State == reqRefused:
			return false
		}
		t.Fatalf("request %d: verdict %s state %s: neither hedged nor refused", id, verdict(r.Ret), stateNames[e.State])
		return false
	}
	sums := func() (uint64, uint64) { return winSums(f.state(t, sWin)) }
	cases := []struct {
		name      string
		slots     []slotVal
		wantHedge bool
	}{
		// 20 requests allow 0.5 x 20 + 1 = 11 hedges.
		{"the 11th hedge of 20 requests: at the bound, sent", []slotVal{{9, 20, 10}}, true},
		{"the 12th: one past the bound, refused", []slotVal{{9, 20, 11}}, false},
		{"the oldest slot still in the window (9 epochs old) counts", []slotVal{{0, 0, 5}, {9, 20, 5}}, true},
		{"... up to its bound", []slotVal{{0, 0, 6}, {9, 20, 5}}, false},
		{"a slot 11 epochs old (index of the one before now) no longer counts", []slotVal{{11, 0, 1000}, {5, 20, 10}}, true},
		{"... while one epoch old it does", []slotVal{{1, 0, 1000}, {5, 20, 10}}, false},
		{"no requests: the floor alone allows one hedge", nil, true},
	}
	for i, c := range cases {
		set(cur, c.slots...)
		r0, h0 := sums()
		got := rescue(uint32(200 + i))
		r1, h1 := sums()
		wantH := h0
		if c.wantHedge {
			wantH++
		}
		if got != c.wantHedge || r1 != r0 || h1 != wantH {
			t.Errorf("%s: hedged %v (want %v); window requests %d -> %d, hedges %d -> %d (want %d: charged only when sent)",
				c.name, got, c.wantHedge, r0, r1, h0, h1, wantH)
		}
	}

	// Rollover: now's slot index holds epoch now-10 with a pile of counts; the next request
	// starts it over (epoch now, 1 request, no hedges) and its hedge counts against that
	// alone: 0.5 x 1 + 1 -> one hedge, then refused.
	set(cur, slotVal{10, 1000, 1000})
	const id = 300
	if _, err := f.run(f.objs.HedgeSplit, datagram(client4, svcWin, idPayload(id, 32)), 0); err != nil {
		t.Fatal(err)
	}
	after := f.state(t, sWin)
	first := rescue(id + 1)
	second := rescue(id + 2)
	i := cur % uint64(budgetSlots)
	if st := after; st.WinEpoch[i] != cur || st.WinRequests[i] != 1 || st.WinHedges[i] != 0 {
		t.Errorf("now's slot after a request: epoch %d requests %d hedges %d, want %d, 1, 0 (started over)",
			st.WinEpoch[i], st.WinRequests[i], st.WinHedges[i], cur)
	}
	if st := f.state(t, sWin); st.WinHedges[i] != 1 {
		t.Errorf("now's slot after the hedge and the refusal: %d hedges, want 1 (charged when sent)", st.WinHedges[i])
	}
	if !first || second {
		t.Errorf("after the rollover: hedged %v then %v, want one hedge (1 request x 0.5 + 1) and then a refusal", first, second)
	}
}

// TestWindowBudgetHoldsOutage: srv1 answers nothing (a full outage) while 4 clients send a
// request every 2 ms each (open loop, about 2000/s) for 3 s: every request is due, and the
// window (ratio 0.1, burst 5, window 1 s: slots of 100 ms) must hold the hedges to the
// ratio, window after window. The counters are sampled every 50 ms. A hedge is sent only if,
// counting it, hedges <= 0.1 x requests + 5 over the window at that moment (its last 9 to
// 10 slot lengths); so the hedges of any stretch of at most 850 ms - all inside the window
// of its last hedge - are at most 0.1 x the requests of the second before the stretch and
// the stretch itself, + 5. Without the budget they would be 10 times that ratio. Over the
// run the budget is used, not starved: hedges >= half of 0.1 x requests.
func TestWindowBudgetHoldsOutage(t *testing.T) {
	requireRoot(t)
	if inGuest() {
		t.Skip("open-loop load for 3 s: host only (TestWindowBudgetSlots covers the arithmetic in guests)")
	}
	l := hedgeLab(t, "ho")
	srv1, srv2 := l.Host("srv1"), l.Host("srv2")
	svc, alt := netip.AddrPortFrom(srv1.IPv4, 9999), netip.AddrPortFrom(srv2.IPv4, 9999)
	startRecServer(t, srv1, svc, -1)
	startRecServer(t, srv2, alt, 0)
	const (
		ratio, burst = 0.1, 5
		window       = time.Second
		run          = 3 * time.Second
		pace         = 2 * time.Millisecond
		workers      = 4
	)
	h := startHedger(t, l, &Config{
		Interface: "eth0",
		Services: []ServiceConfig{{Name: "outage", Address: svc.String(), Replicas: []string{alt.String()},
			Delay:  DelaySpec{Fixed: 5 * time.Millisecond},
			Budget: BudgetSpec{Mode: BudgetWindow, Ratio: ratio, Burst: burst, Window: Duration(window)}}},
	}, budgetTestBackend())

	type sample struct {
		at               time.Time
		requests, hedges uint64
	}
	var samples []sample
	read := func() sample {
		snap, err := h.Stats()
		if err != nil {
			t.Fatal(err)
		}
		c := snap.Services[0].Counters
		return sample{at: snap.Time, requests: c["requests"], hedges: c["hedges_sent"]}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		conn := clientSocket(t, l.Host("client"), svc, false)
		wg.Add(2)
		go func() { // drain the hedges' answers
			defer wg.Done()
			buf := make([]byte, 2048)
			for {
				if _, _, err := conn.ReadFromUDPAddrPort(buf); err != nil {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			defer conn.Close()
			req := make([]byte, 32)
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for i := uint32(0); ; i++ {
				binary.BigEndian.PutUint32(req, uint32(w)<<24|i)
				if _, err := conn.WriteToUDPAddrPort(req, svc); err != nil {
					t.Errorf("send: %v", err)
					return
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
	end := time.Now().Add(run)
	for time.Now().Before(end) {
		samples = append(samples, read())
		time.Sleep(50 * time.Millisecond) // the sampling period: nothing to wait for
	}
	close(stop)
	wg.Wait()
	c := waitCounters(t, h, 2*time.Second, func(c map[string]uint64) bool {
		return c["hedges_sent"]+c["budget_exhausted"] >= c["requests"]
	})
	t.Logf("%d samples; requests %d hedges_sent %d budget_exhausted %d (ratio %g: %.0f)",
		len(samples), c["requests"], c["hedges_sent"], c["budget_exhausted"], ratio, ratio*float64(c["requests"]))

	worst, checks := 0.0, 0 // the largest share of a bound any stretch used
	for i, s := range samples {
		for j := i - 1; j >= 0 && s.at.Sub(samples[j].at) <= 850*time.Millisecond; j-- {
			// The requests from a sample at least a window before samples[j] (or the start).
			k := j
			for k > 0 && samples[j].at.Sub(samples[k].at) < window {
				k--
			}
			if k == 0 && samples[j].at.Sub(samples[0].at) < window {
				continue // the run's first second: no sample a window earlier
			}
			bound := ratio*float64(s.requests-samples[k].requests) + burst
			d := float64(s.hedges - samples[j].hedges)
			worst, checks = max(worst, d/bound), checks+1
			if d > bound {
				t.Errorf("samples %d..%d (%v): %.0f hedges sent, above 0.1 x %d requests (from sample %d) + 5 = %.1f",
					j, i, s.at.Sub(samples[j].at).Round(time.Millisecond), d, s.requests-samples[k].requests, k, bound)
			}
		}
	}
	if checks == 0 {
		t.Fatalf("no stretch checked in %d samples", len(samples))
	}
	t.Logf("%d stretches of <= 850 ms checked; the largest used %.0f%% of its bound", checks, worst*100)
	if float64(c["hedges_sent"]) < ratio*float64(c["requests"])/2 {
		t.Errorf("hedges_sent %d: fewer than half of 0.1 x %d requests; the budget starves the outage", c["hedges_sent"], c["requests"])
	}
}
