package hedge

// BPF_PROG_TEST_RUN tests of the clone path's rescuer (rescue_clone in bpf/hedge/tick.h)
// beyond TestRescue: several hedges per request (max_hedges) and the far-overdue cutoff,
// which the clone path shares with the stored path (the hedge decision, bpf/hedge/send.h).

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// dueDelay is the delay of the entries dueEntry writes: long, so that the far-overdue cutoff
// (max(delay, 4 pacer passes, 50 ms) past the deadline) is a second away.
const dueDelay = time.Second

// dueEntry is a PENDING entry whose hedge came due just before now, after dueDelay.
func dueEntry(now uint64) hedgeHreq {
	return pending(now-uint64(dueDelay)-1000, now-1000)
}

// rescueRun runs the rescuer on in and returns the result and the counters that moved.
func rescueRun(tb testing.TB, f *fixture, in []byte) (bpftest.Result, bpftest.Counters) {
	tb.Helper()
	return rescueRunAt(tb, f, in, hedgeHreqKey{}, nil)
}

// rescueRunAt is rescueRun with the scoreboard entry k written as entry(now) in the run's
// thread right before it (nil entry: nothing written).
func rescueRunAt(tb testing.TB, f *fixture, in []byte, k hedgeHreqKey, entry func(now uint64) hedgeHreq) (bpftest.Result, bpftest.Counters) {
	tb.Helper()
	var prepare func(uint64) error
	if entry != nil {
		prepare = func(now uint64) error { return f.objs.Scoreboard.Put(k, entry(now)) }
	}
	return deltaOf(tb, f, func() (bpftest.Result, error) { return f.runAt(f.objs.HedgeRescue, in, 0, prepare) })
}

// respondRun runs the response path on a response to id from service rr's replica src.
func respondRun(tb testing.TB, f *fixture, src int, id uint32) (bpftest.Result, bpftest.Counters) {
	tb.Helper()
	return deltaOf(tb, f, func() (bpftest.Result, error) { return respondFrom(tb, f, id, src), nil })
}

// deltaOf runs run and returns its result and the counters that moved.
func deltaOf(tb testing.TB, f *fixture, run func() (bpftest.Result, error)) (bpftest.Result, bpftest.Counters) {
	tb.Helper()
	var r bpftest.Result
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
			if r.Ret != redirect || !slices.Equal(r.Out, datagram(client4, repRR1, p)) || r.Skb.Mark != mark {
				t.Fatalf("first hedge: verdict %s mark %#x, packet %s", verdict(r.Ret), r.Skb.Mark, bpftest.DiffBytes(r.Out, datagram(client4, repRR1, p)))
			}
			if diff := d.Diff(bpftest.Counters{"rr.HedgesSent": 1, "rr.Requeued": 1}); diff != "" {
				t.Errorf("first hedge, counter changes (got, want):\n%s", diff)
			}
			if got := f.dlTxPackets(t) - tx; got != 1 {
				t.Errorf("first hedge: %d packets into the delay line, want 1 (the clone carried again)", got)
			}
			if e.State != reqHedged || e.HedgesSent != 1 || e.Tried != 0b011 || e.HedgeReplica != 1 ||
				e.HedgedNs < r.Now || e.HedgedNs > r.Now || e.DeadlineNs != e.HedgedNs+uint64(dueDelay) {
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
			if r.Ret != redirect || d.Diff(bpftest.Counters{"rr.Recirculations": 1, "dl.CarriedRecirculated": 1}) != "" {
				t.Errorf("carried clone not due: verdict %s, counters %v; want sent round again", verdict(r.Ret), d)
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
			if r.Ret != redirect || !slices.Equal(r.Out, datagram(client4, repRR2, p)) || r.Skb.Mark != mark {
				t.Fatalf("second hedge: verdict %s mark %#x, packet %s", verdict(r.Ret), r.Skb.Mark, bpftest.DiffBytes(r.Out, datagram(client4, repRR2, p)))
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
			if diff := d.Diff(want); r.Ret != shot || diff != "" {
				t.Errorf("clone after the last hedge: verdict %s, counter changes (got, want):\n%s", verdict(r.Ret), diff)
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
			if r.Ret != unspec || d.Diff(bpftest.Counters{"rr.Responses": 1, "rr.HedgesWon": 1, "rr.ResponsesRewritten": 1}) != "" {
				t.Errorf("first response: verdict %s, counters %v; want passed, won by the hedge, rewritten", verdict(r.Ret), d)
			}
			for i, src := range []int{0, 1} {
				r, d = respondRun(t, f, src, id)
				if r.Ret != shot || d.Diff(bpftest.Counters{"rr.DuplicatesDropped": 1}) != "" {
					t.Errorf("late response from replica %d: verdict %s, counters %v; want dropped as a duplicate", src, verdict(r.Ret), d)
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
		if diff := d.Diff(bpftest.Counters{"rr.ClonesAnswered": 1}); r.Ret != shot || diff != "" {
			t.Errorf("verdict %s, counter changes (got, want):\n%s", verdict(r.Ret), diff)
		}
		if e, _ := f.entry(t, k); e.State != reqAnsweredHedge {
			t.Errorf("entry %s, want ANSWERED_HEDGED kept for the late responses", stateNames[e.State])
		}
	})
}

// TestRescueCloneOverdue: a clone whose hedge comes due later than its deadline +
// max(delay, four pacer passes, 50 ms) is dropped unhedged (overdue_dropped, NOHEDGE, token
// back), as a stored request is; one at the cutoff or within it is still hedged. The
// fixture's clock is fixed, so each case sits exactly where it says, the cutoff's edge too.
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
	full := int64(v4Burst * 1000) // fillMaps starts the bucket full
	// entry: due late after a delay (the first hedge's, or with hedgesBefore a further one's,
	// counted from the last hedge), written relative to the run's time; max_hedges 2.
	entry := func(delay, late time.Duration, hedgesBefore uint8) func(testing.TB) {
		return func(tb testing.TB) {
			setMaxHedges(tb, f, sV4, 2)
			deadline := now0 - uint64(late)
			e := pending(deadline-uint64(delay), deadline)
			if hedgesBefore > 0 {
				// Sent long before; the first hedge left one delay before this deadline.
				e.SentNs, e.HedgedNs = deadline-uint64(10*time.Second), deadline-uint64(delay)
				e.State, e.HedgesSent, e.HedgeReplica = reqHedged, hedgesBefore, 1
			}
			f.put(tb, k, e)
		}
	}
	hedged := func(delay, late time.Duration) bpftest.Case {
		return bpftest.Case{Setup: entry(delay, late, 0), In: in, WantRet: redirect, WantOut: datagram(client4, rep4, p),
			WantMark: bpftest.Mark(hedgeMark), WantCounters: bpftest.Counters{"v4.HedgesSent": 1, "v4.Requeued": 1},
			// The hedge keeps its token; the clone carried again for the second holds another.
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqHedged}, tokensAre(f, sV4, full-1000, "the carried clone's token"))}
	}
	dropped := func(delay, late time.Duration, hedgesBefore uint8) bpftest.Case {
		// A first hedge's entry is closed (NOHEDGE: its response completes it); a further
		// hedge's stays HEDGED for the responses of the copies out.
		state := reqNoHedge
		if hedgesBefore > 0 {
			state = reqHedged
		}
		return bpftest.Case{Setup: entry(delay, late, hedgesBefore), In: in, WantRet: shot,
			WantCounters: bpftest.Counters{"v4.OverdueDropped": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: state}, tokensAre(f, sV4, full+1000, "the clone's token back"))}
	}
	named := func(name string, c bpftest.Case) bpftest.Case { c.Name = name; return c }
	ms := time.Millisecond
	runCases(t, f, f.objs.HedgeRescue, []bpftest.Case{
		named("10 ms delay, 30 ms late: within the 50 ms floor, hedged", hedged(10*ms, 30*ms)),
		named("10 ms delay, 50 ms late: at the floor, hedged", hedged(10*ms, 50*ms)),
		named("10 ms delay, 50 ms + 1 ns late: past the floor, dropped", dropped(10*ms, 50*ms+1, 0)),
		named("1 s delay, 600 ms late: within one delay, hedged", hedged(time.Second, 600*ms)),
		named("1 s delay, 1 s late: at the cutoff, hedged", hedged(time.Second, time.Second)),
		named("1 s delay, 1 s + 1 ns late: past one delay, dropped", dropped(time.Second, time.Second+1, 0)),
		named("second hedge, 1 s delay from the first, 1.2 s late: dropped", dropped(time.Second, 1200*ms, 1)),
	})
}
