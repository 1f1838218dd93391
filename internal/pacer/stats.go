package pacer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// Calibration is what the pacer measured at Start. The pacer owns it: consumers read it
// here, never from the pacer's maps.
type Calibration struct {
	Backend string `json:"backend"`
	// Target is one pass: what a tick not yet due waits before it is looked at again
	// (netem: Period; conveyor: the filler queue with carry, one tick frame without; edt: 0).
	Target time.Duration `json:"target_ns"`
	// Mean, Min, Max: the conveyor's filler round trips (with carry), after calibration.
	Mean    time.Duration `json:"mean_ns"`
	Min     time.Duration `json:"min_ns"`
	Max     time.Duration `json:"max_ns"`
	Fillers int           `json:"fillers"`
	// Spread is one filler's (with carry) or one tick frame's transmission time at the
	// conveyor's rate: the granularity of a pass.
	Spread    time.Duration `json:"spread_ns"`
	TickBytes int           `json:"tick_bytes"`
	// TickLate is the lateness of the ticks Start armed to measure it.
	TickLate Precision `json:"tick_late"`
}

// Precision summarises tick lateness (arrival at the tick program minus deadline).
type Precision struct {
	Count int64         `json:"count"`
	Early int64         `json:"early"` // arrived before their deadline (netem/conveyor: by up to half a pass)
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"` // upper edge of the histogram bucket (a power of two in us)
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
	// EarlyMax is the largest lead of an early tick.
	EarlyMax time.Duration `json:"early_max_ns"`
}

// Stats are the pacer's counters and precision since Start.
type Stats struct {
	Backend   string            `json:"backend"`
	Counters  map[string]uint64 `json:"counters"`
	Precision Precision         `json:"precision"`
	Fillers   int               `json:"fillers"`
	ArmedNs   uint64            `json:"armed_ns"` // deadline of the tick in flight, 0: none
}

// Calibration returns what Start measured.
func (p *Pacer) Calibration() Calibration { return p.cal }

// Stats reads the counters (summed over CPUs; maxima and minima taken as such).
func (p *Pacer) Stats() (Stats, error) {
	s := Stats{Backend: p.backend, Fillers: p.fillers}
	c, err := p.counters()
	if err != nil {
		return s, err
	}
	s.Counters = counterMap(c)
	s.Precision = precisionOf(c)
	var st pacerPacerState
	if p.objs.PacerArming != nil {
		if err := p.objs.PacerArming.Lookup(uint32(0), &st); err != nil {
			return s, fmt.Errorf("read pacer state: %w", err)
		}
	}
	s.ArmedNs = st.ArmedNs
	return s, nil
}

// counters reads the per-CPU counters: _max_ns fields take the maximum, _min_ns the
// smallest non-zero value, the rest add up.
func (p *Pacer) counters() (pacerPacerStats, error) {
	if p.objs.PacerCounters == nil {
		return pacerPacerStats{}, errors.New("read pacer counters: not started")
	}
	s, err := bpfx.SumPerCPU[pacerPacerStats](p.objs.PacerCounters, uint32(0), bpfx.Extrema)
	if err != nil {
		return s, fmt.Errorf("read pacer counters: %w", err)
	}
	return s, nil
}

// counterMap names the scalar counters in snake_case as in struct pacer_stats (late_hist
// is reported as Precision).
func counterMap(s pacerPacerStats) map[string]uint64 { return counterMapOf(s) }

// counterMapOf names the scalar fields of a bpf2go counter struct in snake_case.
func counterMapOf[T any](s T) map[string]uint64 {
	fs, _ := bpfx.Fields(s, "", bpfx.Naming{C: true, NoArrays: true}) // bpf2go's struct: integers only
	m := make(map[string]uint64, len(fs))
	for _, f := range fs {
		m[f.Name] = f.Value
	}
	return m
}

// precisionOf summarises the lateness counters. Bucket i of late_hist holds lateness in
// [2^(i-1), 2^i) us (bucket 0: under 1 us); a quantile is reported as its bucket's upper edge.
func precisionOf(s pacerPacerStats) Precision {
	pr := Precision{
		Count:    int64(s.LateCount + s.EarlyCount),
		Early:    int64(s.EarlyCount),
		Max:      time.Duration(s.LateMaxNs),
		EarlyMax: time.Duration(s.EarlyMaxNs),
	}
	if s.LateCount > 0 {
		pr.Mean = time.Duration(s.LateSumNs / s.LateCount)
	}
	pr.P50 = histQuantile(s.LateHist[:], s.EarlyCount, 0.50)
	pr.P99 = histQuantile(s.LateHist[:], s.EarlyCount, 0.99)
	return pr
}

// histQuantile counts early ticks as on time (lateness 0).
func histQuantile(h []uint64, early uint64, q float64) time.Duration {
	total := early
	for _, n := range h {
		total += n
	}
	if total == 0 {
		return 0
	}
	target := uint64(math.Ceil(q * float64(total)))
	seen := early
	if seen >= target {
		return 0
	}
	for i, n := range h {
		seen += n
		if seen >= target {
			return time.Duration(uint64(1)<<i) * time.Microsecond
		}
	}
	return time.Duration(uint64(1)<<(len(h)-1)) * time.Microsecond
}

// measureTicks arms a few ticks one after another and records their lateness as the
// calibration's TickLate (delta of the counters over these ticks only).
func (p *Pacer) measureTicks() error {
	const n = 5
	before, err := p.counters()
	if err != nil {
		return err
	}
	wait := max(2*p.cal.Target, 2*time.Millisecond)
	for i := 0; i < n; i++ {
		delivered := before.TicksDelivered
		if c, err := p.counters(); err == nil {
			delivered = c.TicksDelivered
		}
		if err := p.Arm(Now() + wait); err != nil {
			return err
		}
		if err := p.waitDelivered(delivered+1, wait+p.opts.LostAfter+time.Second); err != nil {
			return err
		}
	}
	after, err := p.counters()
	if err != nil {
		return err
	}
	d := after
	d.LateSumNs -= before.LateSumNs
	d.LateCount -= before.LateCount
	d.EarlyCount -= before.EarlyCount
	for i := range d.LateHist {
		d.LateHist[i] -= before.LateHist[i]
	}
	p.cal.TickLate = precisionOf(d)
	return nil
}

// waitDelivered polls the counters until ticks_delivered reaches want.
func (p *Pacer) waitDelivered(want uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := p.counters()
		if err != nil {
			return err
		}
		if c.TicksDelivered >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pacer calibration: no tick arrived within %v (backend %s; counters %v)", timeout, p.backend, counterMap(c))
		}
		time.Sleep(time.Millisecond) // polling a counter: nothing to wait on
	}
}

// CounterNames are the keys of Stats.Counters (struct pacer_stats' scalar fields).
func CounterNames() []string {
	var names []string
	for name := range counterMap(pacerPacerStats{}) {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
