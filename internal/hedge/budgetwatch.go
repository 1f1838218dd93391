package hedge

import (
	"context"
	"fmt"
	"math"
	"time"
)

// The budget can silently defeat hedging. In bucket mode every request waiting out its
// delay holds a token (the clone carries it), so at R requests/s and a delay D about R*D are
// held at any time: a burst < R*D is empty before a stall even starts. In either mode a
// ratio or window too small for the stalls refuses their hedges. budgetWatch
// compares successive snapshots and says so, naming the setting to change:
//   - bucket mode, once per service, as soon as its request rate is known: burst < R*D;
//   - while running: of the requests that stalled (answered after the delay), more than
//     refusedShare were not hedged for lack of a token (counter unhedged_late).
type budgetWatch struct {
	services []ServiceConfig
	prev     *Snapshot
	rateSaid map[string]bool
	lastSaid map[string]time.Time
}

const (
	// refusedShare is the share of stalled requests left unhedged by the budget above which
	// the watch warns.
	refusedShare = 0.1
	// minStalled is the number of stalled requests in a window below which it stays quiet.
	minStalled = 10
	// budgetWarnEvery rate-limits the running warning per service.
	budgetWarnEvery = time.Minute
)

func newBudgetWatch(services []ServiceConfig) *budgetWatch {
	return &budgetWatch{services: services, rateSaid: map[string]bool{}, lastSaid: map[string]time.Time{}}
}

// check returns the warnings cur gives rise to, compared with the previous snapshot.
func (w *budgetWatch) check(cur *Snapshot) []string {
	prev := w.prev
	w.prev = cur
	if prev == nil {
		return nil
	}
	dt := cur.Time.Sub(prev.Time)
	if dt <= 0 {
		return nil
	}
	var out []string
	for i, s := range cur.Services {
		if i >= len(prev.Services) || i >= len(w.services) || prev.Services[i].Name != s.Name || w.services[i].Name != s.Name {
			continue
		}
		b := w.services[i].Budget
		delta := func(name string) uint64 {
			c, p := s.Counters[name], prev.Services[i].Counters[name]
			if c < p {
				return 0
			}
			return c - p
		}
		rate := float64(delta(counterRequests)) / dt.Seconds()
		held := rate * s.DelayNow.Seconds()
		// Only the bucket has to hold requests/s x delay tokens in burst; a window's
		// allowance grows with the requests (ratio x requests/s x window).
		if b.Mode == BudgetBucket && !w.rateSaid[s.Name] && rate > 0 {
			w.rateSaid[s.Name] = true
			if need := int(math.Ceil(held)); need > b.Burst {
				out = append(out, fmt.Sprintf("service %q: at %.0f requests/s each %v delay keeps about %d requests waiting, "+
					"each holding a budget token, but budget.burst is %d: requests beyond it are never hedged (budget_exhausted); "+
					"raise budget.burst (--budget-burst) above %d", s.Name, rate, s.DelayNow, need, b.Burst, need))
			}
		}
		late, hedged := delta(counterUnhedgedLate), delta(counterHedgesSent)
		stalled := late + hedged
		if stalled < minStalled || float64(late) <= refusedShare*float64(stalled) {
			continue
		}
		if t, ok := w.lastSaid[s.Name]; ok && cur.Time.Sub(t) < budgetWarnEvery {
			continue
		}
		w.lastSaid[s.Name] = cur.Time
		what := fmt.Sprintf("service %q: in the last %v, %d of %d stalled requests (answered after the %v delay) "+
			"were not hedged for lack of budget (budget_exhausted +%d); ",
			s.Name, dt.Round(time.Second), late, stalled, s.DelayNow, delta(counterBudgetExhausted))
		if b.Mode == BudgetWindow {
			// The window allows ratio x its requests: the stalls are more than that share.
			out = append(out, what+fmt.Sprintf("the stalls take more than budget.ratio of the requests over the window: "+
				"raise budget.ratio (--budget-ratio, now %g) above the share of requests that stall, or budget.burst "+
				"(--budget-burst, now %d) for a rare long stall", b.Ratio, b.Burst))
			continue
		}
		out = append(out, what+fmt.Sprintf("raise budget.burst (--budget-burst, now %d) "+
			"to cover a stall's requests (about %.0f per delay at %.0f requests/s), or budget.ratio (--budget-ratio, now %g)",
			b.Burst, held, rate, b.Ratio))
	}
	return out
}

// WatchBudget logs a warning when the budget keeps hedging from working (see budgetWatch),
// checking every interval until ctx ends.
func (h *Hedger) WatchBudget(ctx context.Context, interval time.Duration) {
	w := newBudgetWatch(nil)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		h.mu.RLock()
		w.services = h.Config.Services // Update may have changed them
		h.mu.RUnlock()
		if snap, err := h.Stats(); err == nil {
			for _, msg := range w.check(snap) {
				h.log.Warn("budget refuses hedges", "advice", msg)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
