package hedge

import (
	"fmt"
	"slices"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/hist"
	"github.com/kedge-dev/kedge/internal/pacer"
)

// ServiceStats is one service's counters (names as in bpf/include/hedge.h) plus its
// current delay and latency/precision quantiles.
type ServiceStats struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	Delay   string `json:"delay_config"`
	// RequestID is where the request id is read: "offset 0, 4 bytes, big-endian".
	RequestID string            `json:"request_id"`
	DelayNow  time.Duration     `json:"delay_ns"`
	Tokens    float64           `json:"budget_tokens"`
	Window    uint64            `json:"window_samples"`
	Counters  map[string]uint64 `json:"counters"`
	// Latency quantiles (request to first response) over the adaptive window.
	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP95 time.Duration `json:"latency_p95_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	// Delay-line precision: hedge send time minus intended time (negative: early).
	Precision Precision `json:"precision"`
	// ReplicaChoice is rr or p50; Replicas each replica's recent median latency.
	ReplicaChoice string         `json:"replica_choice"`
	MaxHedges     int            `json:"max_hedges"`
	Replicas      []ReplicaStats `json:"replicas"`
	// Protocol is the service's preset, Hedgeable its rule ("every request" without one),
	// Ejection its replica judgement.
	Protocol  string `json:"protocol"`
	Hedgeable string `json:"hedgeable"`
	Ejection  string `json:"ejection"`
	// Paused: every replica a hedge could go to is ejected, so no hedge is sent.
	Paused bool `json:"paused"`
	// Warning says what looks wrong (Watch): requests seen whose responses match none.
	Warning string `json:"warning,omitempty"`
}

// ReplicaStats is one replica's recent median latency: the kernel's stochastic median
// estimate (bpf/hedge/replica.h), 0 while the replica has not answered.
type ReplicaStats struct {
	Address string        `json:"address"`
	P50     time.Duration `json:"p50_ns"`
	// Replica judgement: ejected now (OutFor left of its back-off), ejections in all, and
	// hedges it has not answered since its last response.
	Ejected    bool          `json:"ejected"`
	OutFor     time.Duration `json:"out_for_ns"`
	Ejections  uint64        `json:"ejections"`
	Unanswered uint32        `json:"unanswered"`
}

// Precision summarises hedge send time - intended send time.
type Precision struct {
	Samples uint64        `json:"samples"`
	P50     time.Duration `json:"p50_ns"`
	P99     time.Duration `json:"p99_ns"`
	Min     time.Duration `json:"min_ns"`
	Max     time.Duration `json:"max_ns"`
}

// Snapshot is everything `kedge hedge stats` shows.
type Snapshot struct {
	Time        time.Time      `json:"time"`
	Backend     string         `json:"backend"`
	Period      time.Duration  `json:"period_ns"`
	Calibration Calibration    `json:"calibration"`
	Services    []ServiceStats `json:"services"`
	// Global holds the counters of no service (globalCounters); Services' Counters the rest.
	Global    map[string]uint64 `json:"global"`
	DelayLine map[string]uint64 `json:"delay_line"`
}

// The counters of struct hedge_stats this package reads by name (counterMap's names);
// TestCounterNamesExist pins each to the generated struct.
const (
	counterRequests        = "requests"
	counterHedgesSent      = "hedges_sent"
	counterUnhedgedLate    = "unhedged_late"
	counterBudgetExhausted = "budget_exhausted"
	counterNotHedgeable    = "not_hedgeable"
	counterResponses       = "responses"
	counterUnmatched       = "unmatched_responses"
	// counterReplicaEjections is no kernel counter: the sum of the replicas' ejections
	// (svc_state.rep_ejections), shown with the counters.
	counterReplicaEjections = "replica_ejections"
)

// countersByName lists the names above, for the test.
var countersByName = []string{counterRequests, counterHedgesSent, counterUnhedgedLate, counterBudgetExhausted,
	counterNotHedgeable, counterResponses, counterUnmatched}

// counterMap turns a counters struct into name -> value using the C field names.
func counterMap(v any) map[string]uint64 {
	fields, err := bpfx.Fields(v, "", bpfx.Naming{C: true})
	if err != nil {
		panic(err) // v is a bpf2go counter struct: checked by TestCounterNames
	}
	out := make(map[string]uint64, len(fields))
	for _, f := range fields {
		out[f.Name] = f.Value
	}
	return out
}

// pick keeps the global counters of m (global) or the per-service ones (!global): the BPF
// programs count each in one kind of slot only, so the other kind would always read 0.
func pick(m map[string]uint64, global bool) map[string]uint64 {
	for name := range m {
		if slices.Contains(globalCounters, name) != global {
			delete(m, name)
		}
	}
	return m
}

// Stats reads a consistent-enough snapshot of every counter and histogram.
func (h *Hedger) Stats() (*Snapshot, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	snap := &Snapshot{Time: time.Now(), Backend: h.Backend, Calibration: h.Calibration}
	if h.pacer != nil {
		snap.Period = h.pacer.Period()
	}
	global, err := bpfx.SumPerCPU[hedgeHedgeStats](h.objs.Stats, uint32(svcMax))
	if err != nil {
		return nil, fmt.Errorf("read global counters: %w", err)
	}
	snap.Global = pick(counterMap(global), true)
	dl, err := h.pacer.Stats()
	if err != nil {
		return nil, err
	}
	snap.DelayLine = dl.Counters
	for i, s := range h.Config.Services {
		idx := h.slot(i)
		counters, err := bpfx.SumPerCPU[hedgeHedgeStats](h.objs.Stats, idx)
		if err != nil {
			return nil, fmt.Errorf("read counters of %s: %w", s.Name, err)
		}
		var cfg hedgeSvcCfg
		var st hedgeSvcState
		if err := h.objs.SvcCfgs.Lookup(idx, &cfg); err != nil {
			return nil, fmt.Errorf("read config of %s: %w", s.Name, err)
		}
		if err := h.objs.SvcStates.Lookup(idx, &st); err != nil {
			return nil, fmt.Errorf("read state of %s: %w", s.Name, err)
		}
		ss := ServiceStats{
			Name: s.Name, Address: s.addr.String(), Delay: s.Delay.String(),
			DelayNow: time.Duration(cfg.DelayNs), Tokens: float64(st.TokensMilli) / 1000,
			Window: st.WindowCount, Counters: pick(counterMap(counters), false),
			RequestID: s.RequestID.String(), ReplicaChoice: s.ReplicaChoice, MaxHedges: s.MaxHedges,
		}
		ss.Protocol, ss.Hedgeable, ss.Ejection = s.Protocol, RulesString(s.Hedgeable), s.Ejection.String()
		ss.Warning = h.warnings[s.Name]
		now := uint64(pacer.Now())
		candidates, out := 0, 0
		for r, ap := range s.replicas {
			rs := ReplicaStats{Address: ap.String(), P50: time.Duration(st.RepP50Ns[r]),
				Ejections: st.RepEjections[r], Unanswered: st.RepUnanswered[r]}
			if until := st.RepOutUntilNs[r]; until > now {
				rs.Ejected, rs.OutFor = true, time.Duration(until-now)
			}
			if r > 0 { // replica 0 is the address the client used: never a hedge's
				candidates++
				if rs.Ejected {
					out++
				}
			}
			ss.Counters[counterReplicaEjections] += rs.Ejections
			ss.Replicas = append(ss.Replicas, rs)
		}
		ss.Paused = candidates > 0 && out == candidates
		var total hedgeKhist
		if err := h.objs.LatHist.Lookup(idx*uint32(histSlots+1)+uint32(histSlots), &total); err != nil {
			return nil, fmt.Errorf("read latency histogram of %s: %w", s.Name, err)
		}
		ss.LatencyP50 = histQuantile(total.B[:], 0.50)
		ss.LatencyP95 = histQuantile(total.B[:], 0.95)
		ss.LatencyP99 = histQuantile(total.B[:], 0.99)
		var late, early hedgeKhist
		if err := h.objs.DlPrecision.Lookup(idx*2, &late); err != nil {
			return nil, fmt.Errorf("read precision histogram: %w", err)
		}
		if err := h.objs.DlPrecision.Lookup(idx*2+1, &early); err != nil {
			return nil, fmt.Errorf("read precision histogram: %w", err)
		}
		ss.Precision = precision(late.B[:], early.B[:])
		snap.Services = append(snap.Services, ss)
	}
	return snap, nil
}

// bucketBounds returns [lo, hi) in microseconds of bucket b (hist.h); the last bucket's hi
// is its nominal end, 2^28 us, though it also holds larger values.
func bucketBounds(b int) (lo, hi uint64) {
	return histLayout.Lower(b), histLayout.Lower(b + 1)
}

// bucketOf is the bucket the kernel puts a latency of us microseconds in.
func bucketOf(us uint64) int { return histLayout.Bucket(us) }

// histQuantile returns the upper edge of the bucket holding quantile q (0 when empty), as
// the kernel's adaptive delay does (tick_service).
func histQuantile(b []uint32, q float64) time.Duration {
	i := hist.QuantileBucket(b, q)
	if i < 0 {
		return 0
	}
	_, hi := bucketBounds(i)
	return time.Duration(hi) * time.Microsecond
}

// precision merges the late and early histograms into one signed distribution.
func precision(late, early []uint32) Precision {
	type pt struct {
		v time.Duration
		n uint64
	}
	var pts []pt
	for i := len(early) - 1; i >= 0; i-- {
		if early[i] > 0 {
			lo, _ := bucketBounds(i)
			pts = append(pts, pt{-time.Duration(lo) * time.Microsecond, uint64(early[i])})
		}
	}
	for i, c := range late {
		if c > 0 {
			_, hi := bucketBounds(i)
			pts = append(pts, pt{time.Duration(hi) * time.Microsecond, uint64(c)})
		}
	}
	var p Precision
	for _, x := range pts {
		p.Samples += x.n
	}
	if p.Samples == 0 {
		return p
	}
	p.Min, p.Max = pts[0].v, pts[len(pts)-1].v
	q := func(f float64) time.Duration {
		target := uint64(float64(p.Samples)*f + 0.999999)
		var seen uint64
		for _, x := range pts {
			seen += x.n
			if seen >= target {
				return x.v
			}
		}
		return p.Max
	}
	p.P50, p.P99 = q(0.5), q(0.99)
	return p
}

// ServiceCounterNames are the per-service counters in struct hedge_stats order (the order
// `kedge hedge stats` prints them), then replica_ejections; GlobalCounterNames the counters
// of no service.
func ServiceCounterNames() []string {
	var out []string
	for _, name := range counterNames() {
		if !slices.Contains(globalCounters, name) {
			out = append(out, name)
		}
	}
	return append(out, counterReplicaEjections)
}

// GlobalCounterNames: see ServiceCounterNames.
func GlobalCounterNames() []string { return slices.Clone(globalCounters) }

func counterNames() []string {
	fields, err := bpfx.Fields(hedgeHedgeStats{}, "", bpfx.Naming{C: true})
	if err != nil {
		panic(err) // checked by TestCounterNames
	}
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = f.Name
	}
	return out
}
