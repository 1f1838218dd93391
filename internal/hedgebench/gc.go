package hedgebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/lab"
)

// The gc scenario: the client processes stop the world the way a Go, JVM or Python runtime
// does, while the server stalls as in Table 4.2. The harness stops each client (SIGSTOP)
// and continues it (SIGCONT) on one seeded schedule, the same for every method, with times
// counted from the client's start. A stopped app-hedged client cannot send its hedge; the
// kernel's leaves on time, and its answer waits in the socket for the client to resume.

// PauseSpec describes the stop-the-world pauses of the gc scenario.
type PauseSpec struct {
	Seed     uint64        // the schedule's seed: the same seed gives the same pauses
	Coverage float64       // fraction of the time stopped, on average (0.03)
	Min, Max time.Duration // bounds of one pause (5 ms, 50 ms)
}

// DefaultPauses is the gc scenario's default: 5-50 ms pauses covering 3% of the time.
func DefaultPauses() PauseSpec {
	return PauseSpec{Seed: 1, Coverage: 0.03, Min: 5 * time.Millisecond, Max: 50 * time.Millisecond}
}

// Validate checks the spec's ranges.
func (s PauseSpec) Validate() error {
	switch {
	case !(s.Coverage > 0 && s.Coverage <= 0.5):
		return paramErrorf("pause coverage %g out of range (0, 0.5]: give the share of the time each client is stopped, e.g. 0.03", s.Coverage)
	case s.Min <= 0 || s.Max < s.Min:
		return paramErrorf("pause length %v..%v: need 0 < min <= max", s.Min, s.Max)
	case s.Max > time.Second:
		return paramErrorf("pause length up to %v: at most 1s (a client timeout)", s.Max)
	}
	return nil
}

// Pause is one planned stop: at At from the process's start, for Len.
type Pause struct {
	At  time.Duration `json:"at_ns"`
	Len time.Duration `json:"len_ns"`
}

// Schedule returns the pauses of s that end within horizon, in time order. Each pause is
// preceded by a gap drawn uniformly from [0.5, 1.5] x g and lasts a length drawn uniformly
// from [Min, Max], with g = mean length x (1 - Coverage) / Coverage, so that the expected
// share of stopped time is Coverage. The sequence depends only on the seed: a longer
// horizon extends a schedule, it never changes its start.
func (s PauseSpec) Schedule(horizon time.Duration) []Pause {
	r := rand.New(rand.NewPCG(s.Seed, 0x6b6564676567)) // "kedgeg"
	mean := float64(s.Min+s.Max) / 2
	gap := mean * (1 - s.Coverage) / s.Coverage
	var out []Pause
	for t := time.Duration(0); ; {
		t += time.Duration(gap * (0.5 + r.Float64()))
		n := s.Min + time.Duration(r.Int64N(int64(s.Max-s.Min)+1))
		if t+n > horizon {
			return out
		}
		out = append(out, Pause{At: t, Len: n})
		t += n
	}
}

// Coverage is the share of [0, horizon) that the pauses cover.
func Coverage(ps []Pause, horizon time.Duration) float64 {
	if horizon <= 0 {
		return 0
	}
	var sum time.Duration
	for _, p := range ps {
		sum += max(0, min(p.At+p.Len, horizon)-p.At)
	}
	return float64(sum) / float64(horizon)
}

// Applied is one pause as the harness applied it: when the process was stopped and
// continued, from its start. Both are later than planned by the harness's own timer
// delays; the gc scenario records the difference.
type Applied struct {
	Planned Pause         `json:"planned"`
	Stopped time.Duration `json:"stopped_ns"`
	Resumed time.Duration `json:"resumed_ns"`
}

// PauseRecord is what a client run under pauses saw: its run time and the pauses applied.
type PauseRecord struct {
	Elapsed time.Duration `json:"elapsed_ns"`
	Applied []Applied     `json:"applied"`
}

// StoppedTime is the total time the process spent stopped.
func (r PauseRecord) StoppedTime() time.Duration {
	var d time.Duration
	for _, a := range r.Applied {
		d += a.Resumed - a.Stopped
	}
	return d
}

// MaxOverrun is the largest excess of an applied pause over its planned length.
func (r PauseRecord) MaxOverrun() time.Duration {
	var d time.Duration
	for _, a := range r.Applied {
		d = max(d, a.Resumed-a.Stopped-a.Planned.Len)
	}
	return d
}

// runPaused runs name with args in h and, while it runs, stops and continues it per
// sched (times from its start), through its pidfd (os.Process.Signal), so no signal can
// reach another process that reuses the PID after it exits. It waits for the process and
// returns what was applied. A process never stays stopped: every stop is followed by a
// continue, also when ctx ends (the process is then killed).
func runPaused(ctx context.Context, h *lab.Host, sched []Pause, name string, args ...string) (PauseRecord, error) {
	var rec PauseRecord
	cmd := h.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := h.Start(cmd); err != nil {
		return rec, fmt.Errorf("start %s: %w", filepath.Base(name), err)
	}
	start := time.Now()
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	rec.Applied = applyPauses(ctx, cmd.Process, start, sched, exited)
	select {
	case <-exited:
	default:
		select {
		case <-exited:
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-exited
			rec.Elapsed = time.Since(start)
			return rec, ctx.Err()
		}
	}
	rec.Elapsed = time.Since(start)
	if waitErr != nil {
		return rec, fmt.Errorf("%s: %w: %s", filepath.Base(name), waitErr, strings.TrimSpace(stderr.String()))
	}
	return rec, nil
}

// applyPauses stops (SIGSTOP) and continues (SIGCONT) p per sched, times from start, until
// the schedule ends, exited is closed or ctx ends, and returns the pauses applied. A stopped
// process is always continued.
func applyPauses(ctx context.Context, p *os.Process, start time.Time, sched []Pause, exited <-chan struct{}) []Applied {
	var out []Applied
	wait := func(d time.Duration) bool { // false once exited is closed or ctx ended
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-exited:
			return false
		case <-ctx.Done():
			return false
		}
	}
	for _, pz := range sched {
		if !wait(time.Until(start.Add(pz.At))) {
			break
		}
		if p.Signal(syscall.SIGSTOP) != nil {
			break // exited between the timer and the signal
		}
		a := Applied{Planned: pz, Stopped: time.Since(start)}
		ok := wait(time.Until(start.Add(a.Stopped + pz.Len)))
		_ = p.Signal(syscall.SIGCONT)
		a.Resumed = time.Since(start)
		out = append(out, a)
		if !ok {
			break
		}
	}
	return out
}

// scheduleHorizon bounds the schedule generated for one client run: longer than any run
// the table scenarios make (the runs end long before; pauses after the end are not applied).
const scheduleHorizon = 30 * time.Minute

// PauseRun is what one client run saw of the schedule, as result.json records it.
type PauseRun struct {
	ElapsedMS    float64   `json:"elapsed_ms"`
	Pauses       int       `json:"pauses"`
	StoppedMS    float64   `json:"stopped_ms"`
	Coverage     float64   `json:"coverage"` // stopped / elapsed
	MaxOverrunMS float64   `json:"max_overrun_ms"`
	Applied      []Applied `json:"applied"`
}

// PauseSchedule is the schedule as result.json records it: the spec and the pauses up to
// the end of the longest client run.
type PauseSchedule struct {
	Seed     uint64  `json:"seed"`
	Coverage float64 `json:"coverage"`
	MinMS    float64 `json:"min_ms"`
	MaxMS    float64 `json:"max_ms"`
	Clock    string  `json:"clock"`
	Pauses   []Pause `json:"pauses"`
}

// pauseParams records the schedule (the prefix the longest run used) and what each
// client run saw, for result.json.
func pauseParams(spec PauseSpec, sched []Pause, recs map[string]PauseRecord) map[string]any {
	var longest time.Duration
	for _, r := range recs {
		longest = max(longest, r.Elapsed)
	}
	used := sched
	for i, p := range sched {
		if p.At > longest {
			used = sched[:i]
			break
		}
	}
	runs := map[string]PauseRun{}
	for name, r := range recs {
		runs[name] = PauseRun{ElapsedMS: ms(r.Elapsed), Pauses: len(r.Applied), StoppedMS: ms(r.StoppedTime()),
			Coverage: safeDiv(float64(r.StoppedTime()), float64(r.Elapsed)), MaxOverrunMS: ms(r.MaxOverrun()), Applied: r.Applied}
	}
	return map[string]any{
		"pause_schedule": PauseSchedule{Seed: spec.Seed, Coverage: spec.Coverage, MinMS: ms(spec.Min), MaxMS: ms(spec.Max),
			Clock: "from each client process's start", Pauses: used},
		"pause_runs": runs,
	}
}

// WritePauseReport prints the gc scenario's schedule and, per series, the pauses its
// client met; nothing for a result of another scenario.
func WritePauseReport(w io.Writer, r bench.Result) error {
	sched, ok := r.Parameters["pause_schedule"].(PauseSchedule)
	runs, ok2 := r.Parameters["pause_runs"].(map[string]PauseRun)
	if !ok || !ok2 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "client pauses (SIGSTOP/SIGCONT from the harness): seed %d, %g-%g ms, %.1f%% of the time planned; per client:",
		sched.Seed, sched.MinMS, sched.MaxMS, sched.Coverage*100)
	for _, s := range r.Series {
		if pr, ok := runs[s.Name]; ok {
			fmt.Fprintf(&b, "\n  %s: %d pauses, %.0f ms stopped in %.1f s (%.1f%%), longest overrun %.2f ms",
				s.Name, pr.Pauses, pr.StoppedMS, pr.ElapsedMS/1000, pr.Coverage*100, pr.MaxOverrunMS)
		}
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// errNoPauses is returned for a gc run whose clients were never stopped: the scenario
// would then measure nothing it is named for.
var errNoPauses = errors.New("no pause was applied to a client: the schedule's first pause comes after the run ended (more requests, or a higher --pause-coverage)")
