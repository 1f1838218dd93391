package pacer

import (
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

func TestOptionsDefaultsAndRanges(t *testing.T) {
	var o Options
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if o.Backend != BackendAuto || o.Period != 10*time.Millisecond || o.Resolution != 100*time.Microsecond ||
		o.RateMbit != 100 || o.FillerBytes != 1514 || o.LostAfter != 100*time.Millisecond || o.IfName != "kedge-pc0" {
		t.Errorf("defaults %+v", o)
	}
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Backend: "tbf"}, "use auto, edt, netem, conveyor"},
		{Options{Period: time.Microsecond}, "use 200us..10s"},
		{Options{Resolution: time.Second}, "use 10us..period"},
		{Options{RateMbit: -1}, "use 1..10000"},
		{Options{FillerBytes: 20000}, "use 128..9014"},
	} {
		if err := c.o.setDefaults(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one containing %q", c.o, err, c.want)
		}
	}
}

func TestTickFrameBytes(t *testing.T) {
	for _, c := range []struct {
		backend    string
		carry      bool
		resolution time.Duration
		rate       int
		want       int
	}{
		{BackendEDT, false, 100 * time.Microsecond, 100, tickMinBytes},
		{BackendNetem, false, 100 * time.Microsecond, 100, tickMinBytes},
		{BackendConveyor, true, 100 * time.Microsecond, 100, tickMinBytes},
		{BackendConveyor, false, 100 * time.Microsecond, 100, 1250},        // 100 us at 12.5 MB/s
		{BackendConveyor, false, 10 * time.Microsecond, 100, tickMinBytes}, // below the smallest frame
		{BackendConveyor, false, time.Millisecond, 100, maxFrame},          // above the MTU
	} {
		p := &Pacer{backend: c.backend, opts: Options{Carry: c.carry, Resolution: c.resolution}, rateBytes: uint64(c.rate) * 1_000_000 / 8}
		if got := p.tickFrameBytes(); got != c.want {
			t.Errorf("%+v: %d bytes, want %d", c, got, c.want)
		}
	}
}

func TestPassAndEarly(t *testing.T) {
	p := &Pacer{backend: BackendConveyor, opts: Options{Period: 10 * time.Millisecond}, rateBytes: 12_500_000, tickBytes: 1250}
	if got := p.pass(false); got != 100*time.Microsecond {
		t.Errorf("conveyor tick pass %v, want 100us", got)
	}
	p.opts.Carry, p.opts.FillerBytes = true, 1250
	if got := p.pass(true); got != 10*time.Millisecond {
		t.Errorf("conveyor with carry: carried pass %v, want the period", got)
	}
	if got := p.pass(false); got != 100*time.Microsecond {
		t.Errorf("conveyor with carry: tick pass %v, want one filler's time (100us)", got)
	}
	p.backend = BackendEDT
	if got := p.config(); got.EarlyNs != 0 || got.CarryEarlyNs != 0 {
		t.Errorf("edt early %d/%d, want 0", got.EarlyNs, got.CarryEarlyNs)
	}
	p.backend = BackendNetem
	if got := p.config(); got.EarlyNs != uint64(5*time.Millisecond) {
		t.Errorf("netem early %v, want half the period", time.Duration(got.EarlyNs))
	}
}

func TestSumStatsAndPrecision(t *testing.T) {
	a := pacerPacerStats{TicksDelivered: 2, LateMaxNs: 30_000, PeriodMinNs: 9, LateCount: 3, LateSumNs: 30_000, EarlyCount: 1}
	b := pacerPacerStats{TicksDelivered: 5, LateMaxNs: 10_000, PeriodMinNs: 0, LateCount: 96}
	a.LateHist[3] = 3  // 4-8 us
	b.LateHist[5] = 95 // 16-32 us
	b.LateHist[10] = 1 // 512-1024 us
	var s pacerPacerStats
	for _, c := range []pacerPacerStats{a, b} {
		bpfx.ReduceCounters(&s, &c, bpfx.Extrema)
	}
	if s.TicksDelivered != 7 || s.LateMaxNs != 30_000 || s.PeriodMinNs != 9 || s.LateHist[5] != 95 {
		t.Errorf("sum %+v", s)
	}
	pr := precisionOf(s)
	if pr.Count != 100 || pr.Early != 1 || pr.P50 != 32*time.Microsecond || pr.P99 != 32*time.Microsecond || pr.Max != 30*time.Microsecond {
		t.Errorf("precision %+v", pr)
	}
	if m := counterMap(s); m["ticks_delivered"] != 7 || m["late_max_ns"] != 30_000 {
		t.Errorf("counter map %v", m)
	}
}
