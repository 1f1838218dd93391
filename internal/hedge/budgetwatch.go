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

// idMismatch judges the stretch between two snapshots of a service. It returns a warning
// when the service's requests were seen but its responses matched none of them: at least
// minSeen hedgeable requests, fewer than one in ten with a first response, and at least half
// as many responses from its addresses that matched no request (unmatched_responses). That
// is a request-id spec that does not fit the protocol (DNS's id is 2 bytes: a 4-byte spec
// takes in the flags, which differ in the response), not a slow service (its responses
// would match, late). The bool is false when responses do match (a warning can be cleared),
// true with a warning or with no verdict either way (too few requests or responses).
func idMismatch(cur, prev ServiceStats) (string, bool) {
	delta := func(name string) uint64 {
		c, p := cur.Counters[name], prev.Counters[name]
		if c < p {
			return 0
		}
		return c - p
	}
	req := delta(counterRequests) - min(delta(counterNotHedgeable), delta(counterRequests))
	resp, unmatched := delta(counterResponses), delta(counterUnmatched)
	switch {
	case req < minSeen:
		return "", true // no verdict: too few requests
	case resp*10 >= req:
		return "", false // responses match
	case unmatched*2 < req:
		return "", true // no verdict: too few responses came back at all
	}
	return fmt.Sprintf("service %q: %d requests, %d matched responses, %d responses from its addresses matched no request: "+
		"the request id (%s) is probably not where this protocol keeps it, and every request is hedged for nothing; "+
		"use protocol: dns or memcached-udp (--protocol), or fix request_id (--id-offset, --id-length)",
		cur.Name, req, resp, unmatched, cur.RequestID), true
}

// minSeen is the number of hedgeable requests between two snapshots below which idMismatch
// says nothing.
const minSeen = 10

// Watch checks every interval, until ctx ends, what keeps hedging from working and logs it
// with what to change: the budget (budgetWatch), and a request-id spec that matches no
// response (idMismatch; also shown by Stats as the service's warning, and by the metric
// kedge_hedge_id_mismatch). It logs replicas being ejected and hedging pausing, too.
func (h *Hedger) Watch(ctx context.Context, interval time.Duration) {
	w := newBudgetWatch(nil)
	t := time.NewTicker(interval)
	defer t.Stop()
	var prev *Snapshot
	for {
		h.mu.RLock()
		w.services = h.Config.Services // Update may have changed them
		h.mu.RUnlock()
		if snap, err := h.Stats(); err == nil {
			for _, msg := range w.check(snap) {
				h.log.Warn("budget refuses hedges", "advice", msg)
			}
			h.watchServices(prev, snap)
			prev = snap
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchServices compares two snapshots per service: the id-spec warning (set and cleared),
// ejections and pauses.
func (h *Hedger) watchServices(prev, cur *Snapshot) {
	if prev == nil {
		return
	}
	before := map[string]ServiceStats{}
	for _, s := range prev.Services {
		before[s.Name] = s
	}
	for _, s := range cur.Services {
		p, ok := before[s.Name]
		if !ok {
			continue
		}
		if msg, judged := idMismatch(s, p); msg != "" {
			if h.setWarning(s.Name, msg) {
				h.log.Warn("responses match no request", "advice", msg)
			}
		} else if !judged && h.setWarning(s.Name, "") {
			h.log.Info("responses match requests again", "service", s.Name)
		}
		for i, r := range s.Replicas {
			if i < len(p.Replicas) && r.Ejections > p.Replicas[i].Ejections {
				h.log.Warn("replica ejected from hedging", "service", s.Name, "replica", r.Address,
					"for", r.OutFor.Round(time.Millisecond), "ejections", r.Ejections)
			}
		}
		switch {
		case s.Paused && !p.Paused:
			h.log.Warn("hedging paused: every replica is ejected", "service", s.Name)
		case !s.Paused && p.Paused:
			h.log.Info("hedging resumed: a replica is back", "service", s.Name)
		}
	}
}

// setWarning records (or with "" clears) a service's warning; true when it changed.
func (h *Hedger) setWarning(name, msg string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.warnings[name] == msg {
		return false
	}
	if h.warnings == nil {
		h.warnings = map[string]string{}
	}
	h.warnings[name] = msg
	if msg == "" {
		delete(h.warnings, name)
	}
	return true
}
