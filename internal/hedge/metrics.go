package hedge

import (
	"slices"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a hedger's counters to Prometheus. It reads the kernel's maps on every
// scrape (through Hedger.Stats), so nothing is polled between scrapes.
//
// Per service (label service):
//
//	kedge_hedge_<counter>_total        every counter of struct hedge_stats (bpf/include/hedge.h)
//	                                   but the global ones, HELP from counterHelp
//	kedge_hedge_delay_seconds          the hedge delay now (adaptive delays move)
//	kedge_hedge_budget_tokens          free budget tokens (clones the splitter may send now)
//	kedge_hedge_window_samples         latencies in the adaptive-delay window
//	kedge_hedge_latency_p{50,95,99}_seconds   request to first response over the window
//	kedge_hedge_precision_p{50,99}_seconds    hedge send time - intended time
//
// Once, without labels: the counters of no service (globalCounters: malformed datagrams,
// fragments, expiry, unmatched clones), kedge_hedge_<counter>_total.
//
// Delay line:
//
//	kedge_hedge_delay_line_<counter>_total   struct dl_stats counters (entered, exited, ...)
//	kedge_hedge_delay_line_period_seconds    summary (_sum, _count) of conveyor filler round trips
//	kedge_hedge_delay_line_period_{min,max}_seconds, _target_seconds, _spread_seconds, _fillers
//	kedge_hedge_info{backend}                1
type Collector struct {
	stats func() (*Snapshot, error)

	counters   map[string]*prometheus.Desc // per-service counters by C name
	dlCounters map[string]*prometheus.Desc
	gauges     []*prometheus.Desc // everything else, for Describe
	delay, tokens, window, replicaP50, replicaOut, replicaEjections, paused, idMismatch, lat50, lat95, lat99, prec50, prec99,
	period, periodMin, periodMax, target, spread, fillers, info *prometheus.Desc
}

// dlPeriodFields are the pacer_stats fields exported as the period summary and gauges rather
// than as counters.
var dlPeriodFields = []string{"period_sum_ns", "period_count", "period_min_ns", "period_max_ns"}

// globalCounters are the hedge_stats fields bpf/hedge counts in the slot of no service
// (stats_global()) and nowhere else; they are exported once, without a service label.
var globalCounters = []string{"fragments", "malformed", "malformed_responses", "gc_expired", "rescue_unmatched",
	"pacer_ticks", "tick_more", "hedges_reinjected", "tick_send_errors"}

// counterHelp says what each struct hedge_stats counter (bpf/include/hedge.h) counts; it
// is the metric's HELP text. Every field has one (TestCounterNames).
var counterHelp = map[string]string{
	"requests":                "Requests seen by the splitter.",
	"short_requests":          "Requests shorter than the request-id field, passed unhedged.",
	"short_responses":         "Responses from a service or replica address shorter than the request-id field, passed untouched.",
	"fragments":               "Fragmented requests, passed untouched.",
	"malformed":               "Outgoing packets parse.h rejects, passed untouched.",
	"malformed_responses":     "Incoming packets parse.h rejects, passed untouched.",
	"clones":                  "Clones sent into the delay line; each holds a budget token.",
	"clone_errors":            "Clones bpf_clone_redirect failed to send (token given back).",
	"scoreboard_errors":       "Requests not recorded: scoreboard update failed.",
	"responses":               "First responses.",
	"clones_answered":         "Clones dropped at the delay-line exit: request already answered (token given back).",
	"clones_orphaned":         "Clones dropped at the delay-line exit: no scoreboard entry (token given back).",
	"recirculations":          "Clones sent round the delay line again, not due yet.",
	"hedges_sent":             "Hedges sent.",
	"hedges_won":              "Hedges whose response arrived first.",
	"duplicates_dropped":      "Later responses of hedged requests, dropped.",
	"budget_exhausted":        "Requests never hedged for lack of budget: not cloned (bucket) or their due clone refused (window).",
	"unhedged_late":           "First responses after the deadline to requests the budget refused (or not cloned: a clone error).",
	"responses_rewritten":     "Responses whose source was rewritten to the address the client used.",
	"hedge_rewrite_errors":    "Hedges not sent: rewriting the destination failed.",
	"response_rewrite_errors": "Responses passed without their source rewritten: the rewrite failed.",
	"redirect_errors":         "Hedges or recirculating clones dropped: bpf_redirect_neigh or bpf_redirect failed.",
	"gc_expired":              "Scoreboard entries removed by the timer (TTL).",
	"rescue_unmatched":        "Packets at the delay-line exit that are no clone of a hedged service's request, dropped.",
	"no_replica":              "Hedges due but not sent: every replica already had the request.",
	"stored":                  "Requests stored for a hedge from a pacer tick (the stored path: not cloned).",
	"store_too_large":         "Requests whose payload is above the service's store limit, cloned instead.",
	"store_full":              "Requests that found the service's store ring full, cloned instead.",
	"store_unsupported":       "Requests with IPv4 options, IPv6 extension headers or an in-band VLAN tag, cloned instead of stored.",
	"pacer_ticks":             "Pacer ticks the rescuer received.",
	"tick_hedges":             "Hedges sent from pacer ticks (hedges per tick = tick_hedges / pacer_ticks).",
	"overdue_dropped":         "Stored requests or clones due so long ago (deadline + max(delay, four pacer passes, 50ms)) that no hedge was sent.",
	"stored_answered":         "Stored requests popped after their response arrived: nothing sent.",
	"stored_orphaned":         "Stored requests popped without their scoreboard entry (evicted, expired or replaced): nothing sent.",
	"hedge_build_errors":      "Stored requests whose hedge could not be rebuilt into the tick: not sent.",
	"requeued":                "Hedged requests queued again for a further hedge (max_hedges): stored cell re-queued or clone carried again.",
	"requeue_full":            "Hedged requests that could not be queued again for a further hedge: store ring full, or the clone into the delay line failed.",
	"tick_more":               "Ticks that ended with due requests left (hedges per tick at most TICK_HEDGES_MAX): the next tick comes at once.",
	"hedges_reinjected":       "Hedges of a tick but its last, cloned back into the pacer veth to leave by bpf_redirect_neigh.",
	"tick_send_errors":        "Hedges of a tick that could not be cloned back in or redirected: lost.",
	"not_hedgeable":           "Requests the service's hedgeable rule does not match (not safe to send twice): passed unrecorded, never hedged.",
	"replicas_out":            "Hedges due but not sent because every replica without a copy of the request is ejected (hedging to them paused).",
	"stored_parked":           "Pending stored requests moved off the head of a deep store ring into the service's park ring, so that the answered requests behind them could leave the ring.",
	"unmatched_responses":     "Responses from a service or replica address matching no recorded request (not hedgeable, expired, or a wrong request-id spec): passed untouched.",
}

// NewCollector returns a Collector for h; register it with a prometheus.Registry.
func NewCollector(h *Hedger) *Collector { return newCollector(h.Stats) }

func newCollector(stats func() (*Snapshot, error)) *Collector {
	c := &Collector{stats: stats, counters: map[string]*prometheus.Desc{}, dlCounters: map[string]*prometheus.Desc{}}
	svc := []string{"service"}
	for name := range counterMap(hedgeHedgeStats{}) {
		var labels []string
		if !slices.Contains(globalCounters, name) {
			labels = svc
		}
		c.counters[name] = prometheus.NewDesc("kedge_hedge_"+name+"_total", counterHelp[name], labels, nil)
	}
	for _, name := range pacer.CounterNames() {
		if slices.Contains(dlPeriodFields, name) || strings.HasSuffix(name, "_ns") {
			continue // the period summary and gauges below; times (sums, maxima) are no counts
		}
		c.dlCounters[name] = prometheus.NewDesc("kedge_hedge_delay_line_"+name+"_total",
			"Delay-line (pacer) counter "+name+" (bpf/include/pacer.h struct pacer_stats).", nil, nil)
	}
	g := func(name, help string, labels ...string) *prometheus.Desc {
		d := prometheus.NewDesc(name, help, labels, nil)
		c.gauges = append(c.gauges, d)
		return d
	}
	c.delay = g("kedge_hedge_delay_seconds", "Current hedge delay.", "service")
	c.tokens = g("kedge_hedge_budget_tokens", "Free budget tokens: clones the splitter may send now (clones in the delay line hold theirs).", "service")
	c.replicaP50 = g("kedge_hedge_replica_p50_seconds", "A replica's recent median latency (the kernel's stochastic median estimate; 0: no response yet), which replica_choice p50 picks by.", "service", "replica")
	c.replicaOut = g("kedge_hedge_replica_ejected", "1 while the replica is ejected from hedging (replica judgement), else 0.", "service", "replica")
	c.replicaEjections = prometheus.NewDesc("kedge_hedge_replica_ejections_total", "Times the replica was ejected from hedging (replica judgement).", []string{"service", "replica"}, nil)
	c.paused = g("kedge_hedge_paused", "1 while every replica a hedge could go to is ejected: the service's hedging is paused.", "service")
	c.idMismatch = g("kedge_hedge_id_mismatch", "1 while the service's requests are seen but its responses match none of them (a wrong request-id spec).", "service")
	c.window = g("kedge_hedge_window_samples", "Latency samples in the adaptive-delay window.", "service")
	// Quantiles as gauges of their own: a "quantile" label belongs to summaries only.
	lat := func(p string) *prometheus.Desc {
		return g("kedge_hedge_latency_"+p+"_seconds", "Request to first response, "+p+" over the adaptive-delay window (bucket upper edge).", "service")
	}
	prec := func(p string) *prometheus.Desc {
		return g("kedge_hedge_precision_"+p+"_seconds", "Hedge send time minus intended send time, "+p+" (negative: early).", "service")
	}
	c.lat50, c.lat95, c.lat99, c.prec50, c.prec99 = lat("p50"), lat("p95"), lat("p99"), prec("p50"), prec("p99")
	c.period = g("kedge_hedge_delay_line_period_seconds", "Conveyor filler round-trip times (rate(_sum)/rate(_count) is the mean period).")
	c.periodMin = g("kedge_hedge_delay_line_period_min_seconds", "Shortest conveyor filler round trip since calibration.")
	c.periodMax = g("kedge_hedge_delay_line_period_max_seconds", "Longest conveyor filler round trip since calibration.")
	c.target = g("kedge_hedge_delay_line_target_seconds", "Delay-line transit time per pass the line is calibrated for.")
	c.spread = g("kedge_hedge_delay_line_spread_seconds", "Conveyor spread: one filler's transmission time.")
	c.fillers = g("kedge_hedge_delay_line_fillers", "Conveyor filler frames circulating.")
	c.info = g("kedge_hedge_info", "Always 1; the delay-line backend in use as a label.", "backend")
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	for _, d := range c.dlCounters {
		ch <- d
	}
	ch <- c.replicaEjections
	for _, d := range c.gauges {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	snap, err := c.stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.info, err)
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for name, d := range c.counters {
		if slices.Contains(globalCounters, name) {
			counter(d, snap.Global[name])
			continue
		}
		for _, s := range snap.Services {
			counter(d, s.Counters[name], s.Name)
		}
	}
	for _, s := range snap.Services {
		gauge(c.delay, s.DelayNow.Seconds(), s.Name)
		gauge(c.tokens, s.Tokens, s.Name)
		gauge(c.window, float64(s.Window), s.Name)
		for _, r := range s.Replicas {
			gauge(c.replicaP50, r.P50.Seconds(), s.Name, r.Address)
			gauge(c.replicaOut, b2f(r.Ejected), s.Name, r.Address)
			counter(c.replicaEjections, r.Ejections, s.Name, r.Address)
		}
		gauge(c.paused, b2f(s.Paused), s.Name)
		gauge(c.idMismatch, b2f(s.Warning != ""), s.Name)
		gauge(c.lat50, s.LatencyP50.Seconds(), s.Name)
		gauge(c.lat95, s.LatencyP95.Seconds(), s.Name)
		gauge(c.lat99, s.LatencyP99.Seconds(), s.Name)
		gauge(c.prec50, s.Precision.P50.Seconds(), s.Name)
		gauge(c.prec99, s.Precision.P99.Seconds(), s.Name)
	}
	for name, d := range c.dlCounters {
		counter(d, snap.DelayLine[name])
	}
	dl := snap.DelayLine
	ch <- prometheus.MustNewConstSummary(c.period, dl["period_count"], time.Duration(dl["period_sum_ns"]).Seconds(), nil)
	gauge(c.periodMin, time.Duration(dl["period_min_ns"]).Seconds())
	gauge(c.periodMax, time.Duration(dl["period_max_ns"]).Seconds())
	gauge(c.target, snap.Calibration.Target.Seconds())
	gauge(c.spread, snap.Calibration.Spread.Seconds())
	gauge(c.fillers, float64(snap.Calibration.Fillers))
	gauge(c.info, 1, snap.Backend)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
