package pacer

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
)

// TestBenchPacer prints the pacer's tick precision and its CPU cost idle, while a tick is
// pending, and (conveyor) with the filler queue of carry mode, per backend this kernel
// offers. Figures only, no timing asserts. Run it alone, on a quiet machine:
//
//	KEDGE_PACER_BENCH=1 flock /work/bench.lock go test -count=1 -run TestBenchPacer -v ./internal/pacer
func TestBenchPacer(t *testing.T) {
	if os.Getenv("KEDGE_PACER_BENCH") == "" {
		t.Skip("benchmark: set KEDGE_PACER_BENCH=1 (and hold /work/bench.lock)")
	}
	const (
		window = 2 * time.Second
		rounds = 3
		delay  = 5 * time.Millisecond
	)
	t.Logf("load average at start %v", bench.LoadAvg())
	type setup struct {
		name string
		o    Options
	}
	var setups []setup
	for _, b := range backendsToTest {
		switch b {
		case BackendConveyor:
			setups = append(setups,
				setup{"conveyor ticks, resolution 100us", Options{Backend: b, Period: 10 * time.Millisecond, Resolution: 100 * time.Microsecond}},
				setup{"conveyor ticks, resolution 500us", Options{Backend: b, Period: 10 * time.Millisecond, Resolution: 500 * time.Microsecond}},
				setup{"conveyor with carry (fillers 1514 B, 10ms)", Options{Backend: b, Period: 10 * time.Millisecond, Carry: true}})
		case BackendNetem:
			setups = append(setups, setup{"netem, pass 1ms", Options{Backend: b, Period: time.Millisecond}})
		default:
			setups = append(setups, setup{b, Options{Backend: b}})
		}
	}
	type cpu struct{ none, idle, pending []float64 }
	results := map[string]*cpu{}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			r := newEchoRig(t, s.o, delay)
			c := &cpu{}
			results[s.name] = c
			ctx := context.Background()
			for i := 0; i < rounds; i++ {
				// Alternating in one run: nothing armed (idle), a tick pending (armed an hour
				// ahead, re-armed by nothing: it goes round until then), and the same machine
				// with the pacer's programs detached is not possible here, so "none" is the
				// idle window before the pacer's first tick of the round.
				idle, err := bench.IdleCPU(ctx, window)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.p.Arm(Now() + time.Hour); err != nil {
					t.Fatal(err)
				}
				pend, err := bench.IdleCPU(ctx, window)
				if err != nil {
					t.Fatal(err)
				}
				// Disarm: the circulating tick is dropped as superseded at its next pass.
				if err := r.p.objs.PacerArming.Put(uint32(0), pacerPacerState{}); err != nil {
					t.Fatal(err)
				}
				c.idle = append(c.idle, idle)
				c.pending = append(c.pending, pend)
			}
			before, _ := r.p.Stats()
			rtts := r.runClient(t, echoPort, 300, 1, 2*time.Millisecond)
			after, _ := r.p.Stats()
			late := make([]time.Duration, len(rtts))
			for i, v := range rtts {
				late[i] = v - delay
			}
			t.Logf("%-45s echo RTT-delay p50 %8v p99 %8v max %8v | ticks %d, passes %d | busy CPUs idle %s pending %s",
				s.name, quantile(late, .5).Round(time.Microsecond), quantile(late, .99).Round(time.Microsecond), slices.Max(late).Round(time.Microsecond),
				after.Counters["ticks_delivered"]-before.Counters["ticks_delivered"], after.Counters["tick_passes"]-before.Counters["tick_passes"],
				fmtCPUs(c.idle), fmtCPUs(c.pending))
			t.Logf("  tick lateness at the tick program: %+v", after.Precision)
		})
	}
	t.Logf("load average at end %v", bench.LoadAvg())
}

func fmtCPUs(v []float64) string {
	s := ""
	for _, x := range v {
		s += fmt.Sprintf(" %.3f", x)
	}
	return "[" + s + " ]"
}
