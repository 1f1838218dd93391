package hedge

// Two responses of one hedged request on two CPUs at the same moment (the original's and the
// hedge's, or two late ones): the response path (respond in bpf/hedge/respond.h) claims the
// entry's state by compare-and-exchange (claim_response), so exactly one passes as the
// first, the other is dropped as a duplicate, and the entry goes once every copy was
// answered (late_responses, a fetch-and-add). TestClaimRace races the rescuer against a
// response; this file races two responses.
//
// The claim's window is a few instructions, so a barrier's release latency (hundreds of
// nanoseconds to microseconds, and lopsided) would rarely line the two runs up on it. Here
// both threads start on the clock instead: each round the first thread names a start time
// a little ahead (nextLead), and each thread spins on CLOCK_MONOTONIC (the vDSO) until it, plus its own
// offset; the offset of the second sweeps -1..+1 us in 25 ns steps over the rounds, so some
// rounds put the two claims at the same instant whatever the runs' fixed costs are. Nothing
// is allocated between the spin and the run: an output buffer made there spread the starts
// over microseconds (a middle half of -3..+6 us, against -15..+15 ns without).

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
)

// pairRun is one thread's run of a round: the verdict and when the run's syscall began and
// ended (since the race's base time).
type pairRun struct {
	ret    uint32
	t0, t1 time.Duration
}

// raceOffset is round i's start offset of the second thread: -1..+1 us in 25 ns steps, the
// steps visited in a scattered order.
func raceOffset(i int) time.Duration {
	const steps = 81 // -40..+40 x 25 ns
	return time.Duration((i*37)%steps-steps/2) * 25 * time.Nanosecond
}

// raceOnClock runs rounds rounds of prog on two threads pinned to CPUs 0 and 1: setup(i)
// (on CPU 0, between rounds) prepares round i's entry and returns the two inputs; both runs
// start at a time CPU 0 names 50 us ahead, the second thread's shifted by raceOffset(i).
func raceOnClock(t *testing.T, f *fixture, rounds int, prog *ebpf.Program, setup func(i int) ([2][]byte, error)) [][2]pairRun {
	t.Helper()
	f.setClock(t)
	out := make([][2]pairRun, rounds)
	base := time.Now()
	var (
		start   atomic.Int64 // round i's start time (since base), published with round
		round   atomic.Int64 // i+1: round i released; -(i+1): CPU 1's run of round i done
		inputs  [2][]byte
		wg      sync.WaitGroup
		errs    = make(chan error, 2)
		bufs    [2][]byte
		runOnce = func(cpu, i int, in []byte) error {
			if len(bufs[cpu]) < len(in)+bpftest.OutPad {
				bufs[cpu] = make([]byte, len(in)+bpftest.OutPad)
			}
			opts := ebpf.RunOptions{Data: in, DataOut: bufs[cpu][:len(in)+bpftest.OutPad], Context: skBuff{}}
			r := &out[i][cpu]
			at := time.Duration(start.Load())
			if cpu == 1 {
				at += raceOffset(i)
			}
			for time.Since(base) < at {
			}
			r.t0 = time.Since(base)
			ret, err := prog.Run(&opts)
			r.t1 = time.Since(base)
			r.ret = ret
			return err
		}
	)
	wg.Add(2)
	lead := minLead
	go func() {
		defer wg.Done()
		errs <- f.pinned(0, func() error {
			for i := range rounds {
				in, err := setup(i)
				if err != nil {
					round.Store(-int64(rounds) - 1) // release the other thread for good
					return err
				}
				inputs = in
				start.Store(int64(time.Since(base) + lead))
				round.Store(int64(i) + 1)
				if err := runOnce(0, i, inputs[0]); err != nil {
					round.Store(-int64(rounds) - 1) // release the other thread for good
					return err
				}
				for round.Load() != -int64(i)-1 {
					runtime.Gosched()
				}
				lead = nextLead(lead, out[i], time.Duration(start.Load()), raceOffset(i))
			}
			return nil
		})
	}()
	go func() {
		defer wg.Done()
		errs <- f.pinned(1, func() error {
			for i := range rounds {
				for n := 1; ; n++ {
					r := round.Load()
					if r == int64(i)+1 {
						break
					}
					if r == -int64(rounds)-1 {
						return nil
					}
					if n%4096 == 0 {
						runtime.Gosched()
					}
				}
				err := runOnce(1, i, inputs[1])
				round.Store(-int64(i) - 1)
				if err != nil {
					return err
				}
			}
			return nil
		})
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// The start time a round names lies lead ahead: long enough for the second thread to see
// the round and be spinning when it comes. 20 us on this machine's host; an emulated (TCG)
// guest's second thread took 0.25-4 ms to see it, so the lead follows the rounds: doubled
// (up to maxLead) after a round the second thread started late, shrunk slowly otherwise.
const (
	minLead = 20 * time.Microsecond
	maxLead = 5 * time.Millisecond
)

// nextLead is the lead after round r, which was to start at start (+ offset for CPU 1). Only
// the second thread's lateness counts: it is the one that must see the round in time (the
// first names the start itself; when it is late, it was preempted, and no lead helps).
func nextLead(lead time.Duration, r [2]pairRun, start, offset time.Duration) time.Duration {
	late := r[1].t0 - start - offset
	switch {
	case late > lead/2:
		return min(2*lead, maxLead)
	case late < lead/8:
		return max(lead-lead/8, minLead)
	}
	return lead
}

// overlapped counts the rounds whose two runs were in the kernel at the same time.
func overlapped(res [][2]pairRun) int {
	n := 0
	for _, r := range res {
		if r[0].t0 < r[1].t1 && r[1].t0 < r[0].t1 {
			n++
		}
	}
	return n
}

// skewIQR is the middle half of the rounds' start skews (the second run's start minus the
// first's, less the round's offset): how closely the clock lined the runs up.
func skewIQR(res [][2]pairRun) (lo, hi time.Duration) {
	skew := make([]time.Duration, len(res))
	for i, r := range res {
		skew[i] = r[1].t0 - r[0].t0 - raceOffset(i)
	}
	slices.Sort(skew)
	return skew[len(skew)/4], skew[len(skew)*3/4]
}

// TestResponseClaimRace: the two responses of a hedged request (one from the replica the
// client addressed, one from the hedge's) reach the response path on two CPUs at once, round
// after round, on each path's service. Exactly one may pass as the first - rewritten to the
// service's address when it is the hedge's - and the other must be dropped as a duplicate;
// the entry must be gone afterwards (both copies answered); the counters must count each
// round's first response once and its duplicate once. The test fails when the claim is a
// plain write: with claim_response's compare-and-exchange made one (and the late count's
// fetch-and-add a plain increment), 8000 rounds let both responses pass in 72 (clone path)
// and 68 (stored path) rounds and left 25 entries behind in "late responses" (a loaded
// 2-CPU VM, load average 5-7).
//
// "late responses": a request hedged twice (max_hedges 2) whose first response passed; the
// two later ones race: both are dropped and the entry goes exactly once, when the second of
// them is counted (late_responses, a fetch-and-add: with a plain increment both could read
// 0 and the entry would stay until the LRU evicted it).
func TestResponseClaimRace(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs to race on")
	}
	f := newFixture(t, fixtureOpts{})
	rounds := 8000
	if inGuest() {
		rounds = 600 // an emulated (TCG) guest runs each program ~40 times slower
	}
	for _, c := range []struct {
		name      string
		svc       int
		orig, rep netip.AddrPort
		state     uint32
		hedges    uint8
	}{
		{"clone path: original and hedge", sV4, svc4, rep4, reqHedged, 1},
		{"stored path: original and hedge", sSt4, svcSt4, repSt1, reqHedged, 1},
		{"late responses of a twice-hedged request", sV4, svc4, rep4, reqAnsweredHedge, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.reset(t)
			name := f.h.Config.Services[c.svc].Name
			base := uint32(0x200000)
			k := func(i int) hedgeHreqKey { return key(c.svc, client4, uint64(base)+uint64(i)) }
			var res [][2]pairRun
			delta, err := bpftest.Delta(f.counters, func() error {
				res = raceOnClock(t, f, rounds, f.objs.HedgeResp, func(i int) ([2][]byte, error) {
					now := f.now
					e := pending(now-uint64(5*time.Millisecond), now+uint64(time.Second))
					e.State, e.Tried, e.HedgesSent, e.HedgeReplica, e.HedgedNs = c.state, 0b11, c.hedges, 1, now-uint64(time.Millisecond)
					if err := f.objs.Scoreboard.Put(k(i), e); err != nil {
						return [2][]byte{}, fmt.Errorf("write scoreboard entry %v: %w", k(i), err)
					}
					p := idPayload(base+uint32(i), 32)
					// CPU 0 gets the original's response, CPU 1 the hedge's.
					return [2][]byte{datagram(c.orig, client4, p), datagram(c.rep, client4, p)}, nil
				})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var origFirst, hedgeFirst, left int
			for i, r := range res {
				a, b := r[0].ret, r[1].ret
				switch {
				case c.state == reqAnsweredHedge && a == shot && b == shot:
				case c.state == reqHedged && a == unspec && b == shot:
					origFirst++
				case c.state == reqHedged && a == shot && b == unspec:
					hedgeFirst++
				default:
					t.Errorf("round %d: original's response %s, hedge's %s: want one passed and one dropped (both dropped when late)",
						i, verdict(a), verdict(b))
				}
				if e, ok := f.entry(t, k(i)); ok {
					left++
					if left <= 5 {
						t.Errorf("round %d: entry left %s with %d late responses of %d hedges, want it gone (every copy answered)",
							i, stateNames[e.State], e.LateResponses, e.HedgesSent)
					}
				}
			}
			if left > 5 {
				t.Errorf("... %d entries left in all", left)
			}
			ov := overlapped(res)
			lo, hi := skewIQR(res)
			t.Logf("%d rounds (%d with both runs in the kernel at once, start skew %v..%v in the middle half): %d original first, %d hedge first, %d entries left; counters %v",
				rounds, ov, lo, hi, origFirst, hedgeFirst, left, movedOnly(delta))
			want := bpftest.Counters{name + ".DuplicatesDropped": int64(2 * rounds)}
			if c.state == reqHedged {
				want = bpftest.Counters{name + ".Responses": int64(rounds), name + ".DuplicatesDropped": int64(rounds),
					name + ".HedgesWon": int64(hedgeFirst), name + ".ResponsesRewritten": int64(hedgeFirst)}
			}
			if d := delta.Diff(want); d != "" {
				t.Errorf("counter changes (got, want):\n%s", d)
			}
			// A run that never overlapped tested nothing: the machine kept the two threads
			// apart (each run is microseconds long and they start on the same clock tick).
			// An emulated guest's vCPUs are host threads that start rounds milliseconds
			// apart (105 of 600 overlapped in one 6.12 run): there the outcome is checked
			// and the overlap only reported.
			if ov < rounds/4 && !inGuest() {
				t.Errorf("only %d of %d rounds ran both responses at once: the race was not run", ov, rounds)
			}
		})
	}
}
