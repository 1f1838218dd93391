package hedge

// BPF_PROG_TEST_RUN tests of the clone path's rescuer (rescue_clone in bpf/hedge/request.h)
// beyond TestRescue: several hedges per request (max_hedges) and the far-overdue cutoff,
// which the clone path shares with the stored path (far_overdue in bpf/hedge/store.h).

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// dueDelay is the delay of the entries dueEntry writes: long, so that the far-overdue cutoff
// (max(delay, 4 pacer passes, 50 ms) past the deadline) is a second away. A loaded machine
// has left 65 ms between a case's setup and its run, which a 10 ms delay's 50 ms cutoff
// would have turned into an overdue drop.
const dueDelay = time.Second

// dueEntry is a PENDING entry whose hedge came due just before now, after dueDelay.
func dueEntry(now uint64) hedgeHreq {
	return pending(now-uint64(dueDelay)-1000, now-1000)
}

// rescueRun runs the rescuer on in and returns the result and the counters that moved.
func rescueRun(tb testing.TB, f *fixture, in []byte) (runResult, bpftest.Counters) {
	tb.Helper()
	return rescueRunAt(tb, f, in, hedgeHreqKey{}, nil)
}

// rescueRunAt is rescueRun with the scoreboard entry k written as entry(now) in the run's
// thread right before it (nil entry: nothing written).
func rescueRunAt(tb testing.TB, f *fixture, in []byte, k hedgeHreqKey, entry func(now uint64) hedgeHreq) (runResult, bpftest.Counters) {
	tb.Helper()
	var prepare func(uint64) error
	if entry != nil {
		prepare = func(now uint64) error { return f.objs.Scoreboard.Put(k, entry(now)) }
	}
	return deltaOf(tb, f, func() (runResult, error) { return f.runAfter(f.objs.HedgeRescue, in, 0, prepare) })
}

// respondRun runs the response path on a response to id from service rr's replica src.
func respondRun(tb testing.TB, f *fixture, src int, id uint32) (runResult, bpftest.Counters) {
	tb.Helper()
	return deltaOf(tb, f, func() (runResult, error) { return respondFrom(tb, f, id, src), nil })
}

// deltaOf runs run and returns its result and the counters that moved.
func deltaOf(tb testing.TB, f *fixture, run func() (runResult, error)) (runResult, bpftest.Counters) {
	tb.Helper()
	var r runResult
	delta, err := bpftest.Delta(f.counters, func() (err error) {
		r, err = run()
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return r, delta
}

func setMaxHedges(tb testing.TB, f *fixture, svc, n int) {
	tb.Helper()
	c := f.svcCfg(tb, svc)
	c.MaxHedges = uint8(n)
	if err := f.objs.SvcCfgs.Put(uint32(svc), c); err != nil {
		tb.Fatal(err)
	}
}

// TestRescueCloneMaxHedges follows one clone-path request of service rr (its own address
// and two replicas, bucket budget) with max_hedges 2 through the rescuer: the first due
// clone becomes the hedge to replica 1 and a copy of it, unrewritten, goes round the delay
// line again on a token of its own, due one delay after the hedge; back early it goes round
// again; due, it becomes the second hedge, to replica 2, the one replica left, and nothing
// goes round any more; a clone that comes out after that is dropped with its token back.
// Then the responses: the second hedge's wins, the two others are dropped and the entry goes.
// A third hedge allowed (max_hedges 3, written to the map: validation refuses it with two
// replicas) finds no replica left.
func TestRescueCloneMaxHedges(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x7007
	p := idPayload(id, 32)
	in := datagram(client4, svcRR, p)
	k := key(sRR, client4, id)
	full := f.state(t, sRR).TokensMilli
	mark := uint32(hedgeMark)

	for _, max := range []int{2, 3} {
		t.Run(fmt.Sprintf("max_hedges %d", max), func(t *testing.T) {
			f.reset(t)
			setMaxHedges(t, f, sRR, max)

			// 1. Due: hedge to replica 1, and the clone carried again.
			tx := f.dlTxPackets(t)
			r, d := rescueRunAt(t, f, in, k, dueEntry)
			e, _ := f.entry(t, k)
			if r.ret != redirect || !slices.Equal(r.out, datagram(client4, repRR1, p)) || r.ctx.Mark != mark {
				t.Fatalf("first hedge: verdict %s mark %#x, packet %s", verdict(r.ret), r.ctx.Mark, bpftest.DiffBytes(r.out, datagram(client4, repRR1, p)))
			}
			if diff := d.Diff(bpftest.Counters{"rr.HedgesSent": 1, "rr.Requeued": 1}); diff != "" {
				t.Errorf("first hedge, counter changes (got, want):\n%s", diff)
			}
			if got := f.dlTxPackets(t) - tx; got != 1 {
				t.Errorf("first hedge: %d packets into the delay line, want 1 (the clone carried again)", got)
			}
			if e.State != reqHedged || e.HedgesSent != 1 || e.Tried != 0b011 || e.HedgeReplica != 1 ||
				e.HedgedNs < r.t0 || e.HedgedNs > r.t1 || e.DeadlineNs != e.HedgedNs+uint64(dueDelay) {
				t.Errorf("entry after the first hedge %+v: want HEDGED, 1 sent, tried 0b011, replica 1, due one delay (%v) after the hedge", e, dueDelay)
			}
			if got := f.state(t, sRR).TokensMilli; got != full-1000 {
				t.Errorf("tokens %d after the first hedge, want %d (the carried clone holds one more)", got, full-1000)
			}

			// 2. Back before its deadline (one delay from the run, whenever it comes): round
			// again.
			r, d = rescueRunAt(t, f, in, k, func(now uint64) hedgeHreq {
				e.DeadlineNs = now + uint64(dueDelay)
				return e
			})
			if r.ret != redirect || d.Diff(bpftest.Counters{"rr.Recirculations": 1, "dl.CarriedRecirculated": 1}) != "" {
				t.Errorf("carried clone not due: verdict %s, counters %v; want sent round again", verdict(r.ret), d)
			}

			// 3. Due: the second hedge goes to replica 2.
			e, _ = f.entry(t, k)
			lastHedge := func(now uint64) hedgeHreq {
				e.HedgedNs, e.DeadlineNs = now-uint64(dueDelay)-1000, now-1000
				return e
			}
			tx = f.dlTxPackets(t)
			r, d = rescueRunAt(t, f, in, k, lastHedge)
			e, _ = f.entry(t, k)
			if r.ret != redirect || !slices.Equal(r.out, datagram(client4, repRR2, p)) || r.ctx.Mark != mark {
				t.Fatalf("second hedge: verdict %s mark %#x, packet %s", verdict(r.ret), r.ctx.Mark, bpftest.DiffBytes(r.out, datagram(client4, repRR2, p)))
			}
			want := bpftest.Counters{"rr.HedgesSent": 1}
			wantTx := uint64(0)
			if max > 2 {
				want["rr.Requeued"], wantTx = 1, 1
			}
			if diff := d.Diff(want); diff != "" {
				t.Errorf("second hedge, counter changes (got, want):\n%s", diff)
			}
			if got := f.dlTxPackets(t) - tx; got != wantTx {
				t.Errorf("second hedge: %d packets into the delay line, want %d", got, wantTx)
			}
			if e.State != reqHedged || e.HedgesSent != 2 || e.Tried != 0b111 || e.HedgeReplica != 2 {
				t.Errorf("entry after the second hedge %+v: want HEDGED, 2 sent, tried 0b111, replica 2", e)
			}

			// 4. One more clone out: max 2, nothing left to do (token back); max 3, no
			// replica left (token back, the entry stays HEDGED for its responses).
			tokens := f.state(t, sRR).TokensMilli
			r, d = rescueRunAt(t, f, in, k, lastHedge)
			want = bpftest.Counters{"rr.ClonesAnswered": 1}
			if max > 2 {
				want = bpftest.Counters{"rr.NoReplica": 1}
			}
			if diff := d.Diff(want); r.ret != shot || diff != "" {
				t.Errorf("clone after the last hedge: verdict %s, counter changes (got, want):\n%s", verdict(r.ret), diff)
			}
			if got := f.state(t, sRR).TokensMilli; got != tokens+1000 {
				t.Errorf("tokens %d after the dropped clone, want %d (its token back)", got, tokens+1000)
			}
			if e, _ = f.entry(t, k); e.State != reqHedged {
				t.Errorf("entry %s after the dropped clone, want HEDGED (its copies still out)", stateNames[e.State])
			}

			// 5. Responses: replica 2's (the last hedge) wins and is rewritten; the
			// service's own and replica 1's are dropped; then the entry goes.
			r, d = respondRun(t, f, 2, id)
			if r.ret != unspec || d.Diff(bpftest.Counters{"rr.Responses": 1, "rr.HedgesWon": 1, "rr.ResponsesRewritten": 1}) != "" {
				t.Errorf("first response: verdict %s, counters %v; want passed, won by the hedge, rewritten", verdict(r.ret), d)
			}
			for i, src := range []int{0, 1} {
				r, d = respondRun(t, f, src, id)
				if r.ret != shot || d.Diff(bpftest.Counters{"rr.DuplicatesDropped": 1}) != "" {
					t.Errorf("late response from replica %d: verdict %s, counters %v; want dropped as a duplicate", src, verdict(r.ret), d)
				}
				if _, ok := f.entry(t, k); ok != (i == 0) {
					t.Errorf("after %d late responses of 2 the entry is present=%v", i+1, ok)
				}
			}
		})
	}

	// A carried clone that comes out after the first hedge's response: dropped, token back.
	t.Run("answered after the first hedge", func(t *testing.T) {
		f.reset(t)
		setMaxHedges(t, f, sRR, 2)
		r, d := rescueRunAt(t, f, in, k, func(now uint64) hedgeHreq {
			e := dueEntry(now)
			e.State, e.HedgesSent, e.Tried, e.HedgeReplica, e.HedgedNs = reqAnsweredHedge, 1, 0b011, 1, now-1000
			return e
		})
		if diff := d.Diff(bpftest.Counters{"rr.ClonesAnswered": 1}); r.ret != shot || diff != "" {
			t.Errorf("verdict %s, counter changes (got, want):\n%s", verdict(r.ret), diff)
		}
		if e, _ := f.entry(t, k); e.State != reqAnsweredHedge {
			t.Errorf("entry %s, want ANSWERED_HEDGED kept for the late responses", stateNames[e.State])
		}
	})
}

// TestRescueCloneOverdue: a clone whose hedge comes due later than its deadline +
// max(delay, four pacer passes, 50 ms) is dropped unhedged (overdue_dropped, NOHEDGE, token
// back), as a stored request is; one within the cutoff is still hedged. Each case sets how
// late the clone is and checks, from the run's own clock readings, that the whole run fell
// on the intended side of the cutoff; a run that a loaded machine delayed across it is
// repeated (at most 5 times), never judged.
func TestRescueCloneOverdue(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x7117
	p := idPayload(id, 32)
	in := datagram(client4, svc4, p)
	k := key(sV4, client4, id)
	passes := 8 * uint64(testEarly) // four passes: the fixture's early_ns is half a pass
	if passes >= 50*uint64(time.Millisecond) {
		t.Fatalf("fixture pacer passes %v: the cases below assume the 50 ms floor is above them", time.Duration(passes))
	}
	cases := []struct {
		name         string
		delay, late  time.Duration
		cutoff       time.Duration
		hedged       bool
		hedgesBefore uint8 // a further hedge (max_hedges 2): its delay counts from the last hedge
	}{
		{"10 ms delay, 30 ms late: within the 50 ms floor, hedged", 10 * time.Millisecond, 30 * time.Millisecond, 50 * time.Millisecond, true, 0},
		{"10 ms delay, 60 ms late: past the 50 ms floor, dropped", 10 * time.Millisecond, 60 * time.Millisecond, 50 * time.Millisecond, false, 0},
		{"1 s delay, 600 ms late: within one delay, hedged", time.Second, 600 * time.Millisecond, time.Second, true, 0},
		{"1 s delay, 1.2 s late: past one delay, dropped", time.Second, 1200 * time.Millisecond, time.Second, false, 0},
		{"second hedge, 1 s delay from the first, 1.2 s late: dropped", time.Second, 1200 * time.Millisecond, time.Second, false, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for try := 1; ; try++ {
				f.reset(t)
				setMaxHedges(t, f, sV4, 2)
				tokens := f.state(t, sV4).TokensMilli
				// The entry is written in the run's own thread, right before the run: an
				// emulated guest takes 40-110 ms from a monoNow in the test to a run of f.run.
				var deadline uint64
				entry := func(now uint64) error {
					deadline = now - uint64(c.late)
					e := pending(deadline-uint64(c.delay), deadline)
					if c.hedgesBefore > 0 {
						// Sent long before; the first hedge left one delay before this deadline.
						e.SentNs, e.HedgedNs = deadline-uint64(10*time.Second), deadline-uint64(c.delay)
						e.State, e.HedgesSent, e.HedgeReplica = reqHedged, c.hedgesBefore, 1
					}
					return f.objs.Scoreboard.Put(k, e)
				}
				r, d := deltaOf(t, f, func() (runResult, error) { return f.runAfter(f.objs.HedgeRescue, in, 0, entry) })
				// The rescuer read its clock between t0 and t1: which side of the cutoff
				// did the whole run fall on?
				lo, hi := time.Duration(r.t0-deadline), time.Duration(r.t1-deadline)
				if (lo > c.cutoff) != (hi > c.cutoff) || (hi > c.cutoff) == c.hedged {
					if try < 5 {
						t.Logf("try %d: ran %v..%v after the deadline, the cutoff %v is not on the side the case tests; again", try, lo, hi, c.cutoff)
						continue
					}
					t.Fatalf("5 tries ran %v..%v after the deadline; the case needs the run on the other side of %v", lo, hi, c.cutoff)
				}
				got, _ := f.entry(t, k)
				if c.hedged {
					if r.ret != redirect || d["v4.HedgesSent"] != 1 || d["v4.OverdueDropped"] != 0 || got.State != reqHedged {
						t.Errorf("%v late: verdict %s, counters %v, state %s; want hedged", lo, verdict(r.ret), d, stateNames[got.State])
					}
					return
				}
				want := bpftest.Counters{"v4.OverdueDropped": 1}
				if diff := d.Diff(want); r.ret != shot || diff != "" {
					t.Errorf("%v late: verdict %s, counter changes (got, want):\n%s", lo, verdict(r.ret), diff)
				}
				// A first hedge's entry is closed (NOHEDGE: its response completes it); a
				// further hedge's stays HEDGED for the responses of the copies out.
				wantState := reqNoHedge
				if c.hedgesBefore > 0 {
					wantState = reqHedged
				}
				if got.State != wantState {
					t.Errorf("entry %s, want %s", stateNames[got.State], stateNames[wantState])
				}
				if tk := f.state(t, sV4).TokensMilli; tk != tokens+1000 {
					t.Errorf("tokens %d, want %d (the clone's token back)", tk, tokens+1000)
				}
				return
			}
		})
	}
}
