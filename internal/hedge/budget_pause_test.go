package hedge

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/lab"
)

// TestBudgetRescuesPauses is issue 14's pause pattern with real processes and the default
// budget: `kedge chaos serve` answering at once in srv1 (the service) and srv2 (its
// replica), `kedge chaos client` in the client host (4 closed loops, as fast as answers
// come, sized to run about 5 s), and srv1's server process stopped (SIGSTOP, by its pid)
// for 40 ms every second from 0.3 s on, a stop-the-world pause of the whole process. Hedge
// delay 5 ms, budget defaults (5% + 10, window 10 s). Every request a pause stalls past the
// delay must be hedged: nothing refused by the budget during the bursts (budget_exhausted
// and unhedged_late +0 from SIGSTOP to 200 ms after SIGCONT), and hedges within the bound
// (<= 5% x requests + 10, the runs being shorter than 9 slots of the window). Outside the
// bursts, a loaded machine makes requests late too; those are hedged or refused like any.
func TestBudgetRescuesPauses(t *testing.T) {
	requireRoot(t)
	if inGuest() {
		// Under TCG an unstalled round trip is itself milliseconds and the 40 ms pause
		// cannot be told from the emulation's own stalls (see TestBudgetCoversShortStalls).
		t.Skip("timing-bound lab run: host only (TestWindowBudget and TestWindowBudgetSlots cover the budget's BPF in guests)")
	}
	l := hedgeLab(t, "hq")
	client, srv1, srv2 := l.Host("client"), l.Host("srv1"), l.Host("srv2")
	svc, alt := netip.AddrPortFrom(srv1.IPv4, 9999), netip.AddrPortFrom(srv2.IPv4, 9999)
	serve := func(h *lab.Host, at netip.AddrPort) *kedgeProc {
		p := startKedge(t, h, "chaos", "serve", "--listen", at.String(), "--stall-pct", "0", "--fast", "0", "--duration", "2m")
		t.Cleanup(func() {
			_ = syscall.Kill(p.pid(), syscall.SIGCONT) // never leave it stopped
			p.stop(t, syscall.SIGTERM, 5*time.Second)
		})
		waitUDPEcho(t, h, at, 5*time.Second)
		return p
	}
	server := serve(srv1, svc)
	serve(srv2, alt)
	const (
		delay = 5 * time.Millisecond
		pause = 40 * time.Millisecond
		every = time.Second
	)
	h := startHedger(t, l, &Config{
		Interface: "eth0",
		Services: []ServiceConfig{{Name: "pause", Address: svc.String(), Replicas: []string{alt.String()},
			Delay: DelaySpec{Fixed: delay}}}, // budget: the defaults
	}, "")
	b := h.Config.Services[0].Budget
	if b.Mode != BudgetWindow || b.Ratio != 0.05 || b.Burst != 10 || time.Duration(b.Window) != 10*time.Second {
		t.Fatalf("default budget %+v, want window 10s, 5%% + 10", b)
	}

	// The client runs a fixed count, so it is sized from a first, short run (also the steady
	// load before the pauses): about 5 s at that rate, between 20000 and 400000 requests.
	// The rate is taken from the run's own latencies (4 loops: their sum / 4 is its length),
	// not from the wall clock around it, which also counts the process's start: on a fast
	// machine that start made the rate look 1.6 times lower and the run too short for two
	// pauses. Pauses come every second, so even a run half as long as planned sees two.
	out := filepath.Join(t.TempDir(), "client.json")
	clientRun := func(n, base int) (int, string) {
		return runKedge(t, client, "chaos", "client", "--mode", "baseline", "--target", svc.String(), "--connected",
			"-n", fmt.Sprint(n), "--concurrency", "4", "--warmup", "0", "--base-id", fmt.Sprint(base), "--timeout", "1s", "--out", out)
	}
	began := time.Now()
	if code, stdout := clientRun(5000, 10000); code != 0 {
		t.Fatalf("chaos client: exit %d\n%s", code, stdout)
	}
	first, err := bench.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var busyUS float64
	for _, v := range first.Series[0].LatenciesUS {
		busyUS += v
	}
	n := 20000
	if busyUS > 0 {
		n = min(max(int(float64(len(first.Series[0].LatenciesUS))/(busyUS/4/1e6)*5), 20000), 400000)
	}

	// The pauses: from 0.5 s on, 40 ms in every 2 s, until the client is done. Around each
	// burst (right before SIGSTOP to 200 ms after SIGCONT, when its stalled requests have
	// been hedged and answered) the counters are read: what the budget refuses there is a
	// stalled request it left unrescued.
	stop := make(chan struct{})
	type burst struct{ before, after map[string]uint64 }
	var bursts []burst
	counters := func() map[string]uint64 {
		snap, err := h.Stats()
		if err != nil {
			t.Error(err)
			return nil
		}
		return snap.Services[0].Counters
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := time.Now().Add(300 * time.Millisecond)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Until(next)):
			}
			b := burst{before: counters()}
			if err := lab.Pause(server.pid()); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(pause) // the pause itself: nothing to poll
			if err := syscall.Kill(server.pid(), syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %d: %v", server.pid(), err)
				return
			}
			time.Sleep(200 * time.Millisecond) // the burst's answers: its counters settle
			b.after = counters()
			bursts = append(bursts, b)
			next = next.Add(every)
		}
	}()
	code, stdout := clientRun(n, 100000)
	close(stop)
	wg.Wait()
	if code != 0 {
		t.Fatalf("chaos client: exit %d\n%s", code, stdout)
	}
	r, err := bench.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s := r.Series[0]
	lat := slices.Clone(s.LatenciesUS)
	slices.Sort(lat)
	over := func(d time.Duration) (n int) {
		for _, v := range lat {
			if time.Duration(v*1000) >= d {
				n++
			}
		}
		return n
	}
	c := waitCounters(t, h, 2*time.Second, func(c map[string]uint64) bool {
		return c["responses"] >= c["requests"]
	})
	requests, took := c["requests"], time.Since(began)
	bound := 0.05*float64(requests) + 10
	t.Logf("%d pauses of %v in %v; client: %d requests, %d over the %v delay, %d over %v, max %s, timeouts %d; "+
		"kernel: requests %d hedges_sent %d (bound %.0f) hedges_won %d budget_exhausted %d unhedged_late %d",
		len(bursts), pause, took.Round(time.Millisecond), s.Requests(), over(delay), delay, over(pause), pause, time.Duration(lat[len(lat)-1]*1000),
		s.Timeouts, requests, c["hedges_sent"], bound, c["hedges_won"], c["budget_exhausted"], c["unhedged_late"])
	if len(bursts) < 2 {
		t.Fatalf("%d pauses during the client's run: it ran too short for the pattern (%d requests)", len(bursts), s.Requests())
	}
	var refused, late, hedged uint64
	for i, b := range bursts {
		d := func(name string) uint64 { return b.after[name] - b.before[name] }
		refused, late, hedged = refused+d("budget_exhausted"), late+d("unhedged_late"), hedged+d("hedges_sent")
		t.Logf("burst %d: requests +%d hedges_sent +%d hedges_won +%d budget_exhausted +%d unhedged_late +%d",
			i, d("requests"), d("hedges_sent"), d("hedges_won"), d("budget_exhausted"), d("unhedged_late"))
	}
	if refused != 0 || late != 0 {
		t.Errorf("during the bursts budget_exhausted +%d, unhedged_late +%d: the default window left stalled requests unrescued",
			refused, late)
	}
	if hedged < uint64(len(bursts)) {
		t.Errorf("%d hedges sent during %d bursts: the pauses stalled nothing?", hedged, len(bursts))
	}
	// Both client runs inside 9 s (9 slots): the window of the last hedge holds them all.
	switch {
	case took >= 9*time.Second:
		t.Logf("the runs took %v, longer than 9 slots of the window: the whole-run bound does not apply", took)
	case float64(c["hedges_sent"]) > bound:
		t.Errorf("hedges_sent %d above the bound 5%% x %d + 10 = %.0f", c["hedges_sent"], requests, bound)
	}
	if s.Timeouts != 0 || s.LateDuplicates != 0 {
		t.Errorf("client saw %d timeouts, %d late duplicates", s.Timeouts, s.LateDuplicates)
	}
}
