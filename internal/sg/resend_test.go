package sg

// BPF_PROG_TEST_RUN fixtures for re-sends (GroupFlagResend, bpf/sg/stored.h and resend.h):
// the scatter stores the request and asks the pacer for a tick; sg_resend, given the tick,
// sends the workers that have not answered their copy again (the same worker: a retry; the
// next replica of a shard: a hedge), within the budget and the rounds allowed; replies of
// re-sent workers count once, a second one is a late reply. The copies are captured on the
// veth's peer and checked byte by byte (addresses, port, MAC, worker index, checksums).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const resendDelay = 5 * time.Millisecond

// tickEarly is the fixtures' pacer early margin (pacer_due: a tick this much before its
// deadline is on time; the conveyor's is half a pass).
const tickEarly = 100 * time.Microsecond

// resendOpts are what a fixture group re-sends with.
type resendOpts struct {
	rounds uint32 // resend_max
	tokens int64  // the budget's saved milli-copies at the start of each case
	ratio  uint32 // budget_ratio_milli
	shards [][]netip.AddrPort
}

// resendFixture is scatterFixtureWith for a group that re-sends after resendDelay. The
// pacer's tick requests go to the namespace's lo (up), so that the fixtures can read the
// deadline asked for (pacer_arming) instead of an arming error.
func resendFixture(t *testing.T, coord netip.AddrPort, workers []netip.AddrPort, ro resendOpts) (*fixture, *scatterNS) {
	t.Helper()
	bpftest.RequireRoot(t)
	if DetectTier() != TierLoop {
		t.Skip("re-sends need the bpf_loop tier (5.17+): this kernel has no bpf_loop")
	}
	f, s, _ := scatterFixtureWith(t, coord, workers, LoadOptions{Resend: true, FixClock: true,
		ReplicaEntries: uint32(len(ro.shards)), Pacer: &pacer.Client{Config: pacer.Config{TickIfindex: 1, EarlyNs: uint64(tickEarly)}}})
	err := s.ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatal(err)
	}
	if ro.shards != nil {
		f.setReplicas(t, 1, ro.shards, 0, time.Second, 4*time.Second) // judge 0: never ejected
	}
	var g GroupCfg
	if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	g.Flags |= GroupFlagResend
	g.ResendNs = uint64(resendDelay)
	g.ResendMax = ro.rounds
	g.BudgetRatioMilli = ro.ratio
	g.BudgetCapMilli = 8 * CopyMilli // a repeat leaves 4 copies (budget_keep); the cases' plenty lies above
	if err := f.o.Groups.Put(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	return f, s
}

// resetResend brings the budget to tokens and forgets every stored request of group 1
// (slots 64..127), so that no case's tick sends an earlier case's rounds. (The slots stay:
// writing one from user space would free its bpf_timer.)
func (f *fixture) resetResend(tb testing.TB, tokens int64) {
	tb.Helper()
	if err := f.o.Budgets.Put(uint32(1), &BudgetRec{TokensMilli: tokens}); err != nil {
		tb.Fatal(err)
	}
	for slot := uint32(64); slot < 128; slot++ {
		if err := f.o.Stored.Put(slot, &StoredRec{}); err != nil {
			tb.Fatal(err)
		}
	}
	if err := f.o.PacerArming.Put(uint32(0), &pacer.State{}); err != nil {
		tb.Fatal(err)
	}
	for f.rd.Available() > 0 {
		f.result(tb)
	}
}

func (f *fixture) stored(tb testing.TB, id uint64) StoredRec {
	tb.Helper()
	var st StoredRec
	if err := f.o.Stored.Lookup(uint32(id&SlotMask), &st); err != nil {
		tb.Fatal(err)
	}
	return st
}

func (f *fixture) armed(tb testing.TB) uint64 {
	tb.Helper()
	var st pacer.State
	if err := f.o.PacerArming.Lookup(uint32(0), &st); err != nil {
		tb.Fatal(err)
	}
	return st.ArmedNs
}

// tick is the frame the pacer hands the tick program for a tick armed at deadline.
func tick(deadline uint64) []byte {
	return pacer.TickFrame(pacer.Tick{Magic: pacer.TickMagic, DeadlineNs: deadline}, 128)
}

// sent is where a captured copy went (either family), after checking its checksums.
type sent struct {
	to     netip.AddrPort
	mac    [6]byte
	worker uint16
}

func sentOf(t testing.TB, frame []byte) sent {
	t.Helper()
	if err := pktbuild.VerifyChecksums(frame); err != nil {
		t.Errorf("copy: %v", err)
	}
	var to netip.AddrPort
	var hdr []byte
	if binary.BigEndian.Uint16(frame[12:]) == 0x86dd {
		to = netip.AddrPortFrom(netip.AddrFrom16([16]byte(frame[38:54])), binary.BigEndian.Uint16(frame[56:]))
		hdr = frame[62:]
	} else {
		to = netip.AddrPortFrom(netip.AddrFrom4([4]byte(frame[30:34])), binary.BigEndian.Uint16(frame[36:]))
		hdr = frame[42:]
	}
	h, p, err := ParseHeader(hdr)
	if err != nil || string(p) != "payload" {
		t.Errorf("copy to %v: header %+v payload %q: %v", to, h, p, err)
	}
	return sent{to: to, mac: [6]byte(frame[:6]), worker: h.Worker}
}

// wantResent checks that, after the scatter's n copies, exactly the copies want were sent.
func wantResent(t testing.TB, s *scatterNS, n int, want []sent) {
	t.Helper()
	got := s.captureQuiet(t)
	if len(got) != n+len(want) {
		t.Fatalf("captured %d copies, want %d scattered and %d re-sent", len(got), n, len(want))
	}
	for i, frame := range got[n:] {
		if g := sentOf(t, frame); g != want[i] {
			t.Errorf("re-sent copy %d: %+v, want %+v", i, g, want[i])
		}
	}
}

// captureQuiet returns the sg datagrams captured until none came for the socket's
// timeout (200 ms).
func (s *scatterNS) captureQuiet(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 65536)
	for {
		n, _, err := unix.Recvfrom(s.sock, buf, 0)
		if err != nil {
			return out
		}
		if bytes.Contains(buf[:n], []byte{0x6b, 0x53, Version, OpRequest}) {
			out = append(out, append([]byte(nil), buf[:n]...))
		}
	}
}

func workerMAC(i int) [6]byte { return [6]byte{2, 0, 0, 0, 0, byte(0x10 + i)} }

// TestResendFixtures: retries without replicas (group 1, three IPv4 workers).
func TestResendFixtures(t *testing.T) {
	f, s := resendFixture(t, coord4, w4, resendOpts{rounds: 2})
	const ms = uint64(time.Millisecond)
	t0 := bpftest.ClockStart
	due := t0 + uint64(resendDelay)
	slot := uint64(64)
	type step = bpftest.Case
	var id uint64
	scatter := func() step {
		return step{Name: "scatter", Prog: f.o.Scatter, Now: t0, In: request(coord4, w4[0], 1, id, []byte("payload")),
			WantRet: bpftest.TCActShot}
	}
	answer := func(w int, at uint64, ret uint32) step {
		return step{Name: "reply", Prog: f.o.Gather, Now: at, In: reply(w4[w], coord4, 1, uint16(w), id, vec64(1), nil), WantRet: ret}
	}
	tickAt := func(at, deadline uint64) step {
		return step{Name: "tick", Prog: f.o.Resend, Now: at, In: tick(deadline), WantRet: bpftest.TCActShot}
	}
	to := func(w int) sent { return sent{to: w4[w], mac: workerMAC(w), worker: uint16(w)} }
	tokens := int64(1 << 30)
	cases := []struct {
		name   string
		tokens int64
		steps  func() []step
		want   bpftest.Counters
		resent []sent
		check  func(t testing.TB)
	}{{
		name:   "due: the workers that have not answered get their copy again",
		steps:  func() []step { return []step{scatter(), answer(0, t0+ms, bpftest.XDPDrop), tickAt(due, due)} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Replies": 1, "1.Retries": 2, "1.ResendRounds": 1},
		resent: []sent{to(1), to(2)},
		check: func(t testing.TB) {
			st := f.stored(t, id)
			if st.Rounds != 1 || st.DueNs != due+uint64(resendDelay) || st.Resent[0] != 0b110 || st.ReqId != id {
				t.Errorf("stored: rounds %d due %d resent %b id %#x; want 1, %d, 110, %#x", st.Rounds, st.DueNs, st.Resent[0], st.ReqId, due+uint64(resendDelay), id)
			}
			if a := f.armed(t); a != due+uint64(resendDelay) {
				t.Errorf("next tick asked for %d, want %d (the next round)", a, due+uint64(resendDelay))
			}
		},
	}, {
		name:  "not due: a tick before the round sends nothing and asks again for the round",
		steps: func() []step { return []step{scatter(), tickAt(due-ms, due-ms)} },
		want:  bpftest.Counters{"1.Requests": 1, "1.Copies": 3},
		check: func(t testing.TB) {
			if st := f.stored(t, id); st.Rounds != 0 || st.DueNs != due {
				t.Errorf("stored: rounds %d due %d; want 0, %d", st.Rounds, st.DueNs, due)
			}
			if a := f.armed(t); a != due {
				t.Errorf("next tick asked for %d, want %d", a, due)
			}
		},
	}, {
		name: "answered before due: nothing sent, the stored request forgotten",
		steps: func() []step {
			return []step{scatter(), answer(0, t0+ms, bpftest.XDPDrop), answer(1, t0+ms, bpftest.XDPDrop),
				answer(2, t0+ms, bpftest.XDPDrop), tickAt(due, due)}
		},
		want: bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Replies": 3, "1.Completed": 1},
		check: func(t testing.TB) {
			f.result(t)
			if st := f.stored(t, id); st.DueNs != 0 || st.Rounds != 0 {
				t.Errorf("stored: due %d rounds %d; want 0, 0", st.DueNs, st.Rounds)
			}
			if a := f.armed(t); a != 0 {
				t.Errorf("a tick asked for %d with nothing to send", a)
			}
		},
	}, {
		name:   "budget: one copy paid, the other two refused",
		tokens: CopyMilli,
		steps:  func() []step { return []step{scatter(), tickAt(due, due)} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 1, "1.ResendRefused": 2, "1.ResendRounds": 1},
		resent: []sent{to(0)},
	}, {
		name:   "budget: a repeat leaves half the cap, a first re-send may spend the last copy",
		tokens: 5 * CopyMilli,
		steps: func() []step {
			return []step{scatter(), tickAt(due, due), tickAt(due+uint64(resendDelay), due+uint64(resendDelay))}
		},
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 3, "1.ResendRefused": 3, "1.ResendRounds": 2},
		resent: []sent{to(0), to(1), to(2)},
	}, {
		name:   "late tick: the round counts how late it came after its due time",
		steps:  func() []step { return []step{scatter(), tickAt(due+ms/2, due+ms/2)} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 3, "1.ResendRounds": 1, "1.ResendLateNs": int64(ms / 2)},
		resent: []sent{to(0), to(1), to(2)},
	}, {
		name: "rounds: the last round sets no next one; a later tick sends nothing",
		steps: func() []step {
			return []step{scatter(), tickAt(due, due), tickAt(due+uint64(resendDelay), due+uint64(resendDelay)),
				tickAt(due+2*uint64(resendDelay), due+2*uint64(resendDelay))}
		},
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 6, "1.ResendRounds": 2, "1.ResendAgain": 3},
		resent: []sent{to(0), to(1), to(2), to(0), to(1), to(2)},
		check: func(t testing.TB) {
			if st := f.stored(t, id); st.DueNs != 0 || st.Rounds != 2 {
				t.Errorf("stored: due %d rounds %d; want 0, 2", st.DueNs, st.Rounds)
			}
		},
	}, {
		name: "late reply: a re-sent worker's second reply is dropped and counted, not aggregated",
		steps: func() []step {
			return []step{scatter(), tickAt(due, due), answer(1, due+ms, bpftest.XDPDrop), answer(1, due+2*ms, bpftest.XDPDrop)}
		},
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 3, "1.Replies": 1, "1.LateReplies": 1, "1.ResendRounds": 1},
		resent: []sent{to(0), to(1), to(2)},
		check: func(t testing.TB) {
			if s := f.slot(t, id); s.Res.Count != 1 || s.Res.Agg[0] != 1 {
				t.Errorf("slot: count %d agg %d; want 1, 1", s.Res.Count, s.Res.Agg[0])
			}
		},
	}, {
		name: "expired: the request timed out before the round; nothing sent",
		steps: func() []step {
			return []step{scatter(), {Name: "sweep", Prog: f.o.Sweep, In: make([]byte, 64), WantRet: 1, Setup: func(tb testing.TB) {
				s := f.slot(tb, id)
				s.DeadlineNs = 1 // the sweep reads the kernel's clock: long past
				if err := f.o.Slots.Put(uint32(id&SlotMask), &s); err != nil {
					tb.Fatal(err)
				}
			}}, tickAt(due, due)}
		},
		want:  bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Timeouts": 1, "16.Sweeps": 1},
		check: func(t testing.TB) { f.result(t) },
	}}
	r := bpftest.Runner{Counters: f.counters, Clock: f.o.Clock, Within: s.ns.Do}
	for k, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			slot++
			id = uint64(k+1)<<10 | slot
			f.resetResend(t, cmpOr(c.tokens, tokens))
			s.captureQuiet(t) // drain
			r.RunCase(t, bpftest.Case{Name: c.name, Steps: c.steps(), WantCounters: c.want})
			wantResent(t, s, 3, c.resent)
			if c.check != nil {
				c.check(t)
			}
		})
	}
}

func cmpOr(v, def int64) int64 {
	if v != 0 {
		return v
	}
	return def
}

// TestResendHedges: shards with replicas (shards4: one, two and three replicas). Request
// seq 5's first copies go to replica (5 + i) mod n: 0, 0 and 1; at the round, shard 0 (one
// replica) gets a retry, shards 1 and 2 a hedge to their next replica (1 and 2); an ejected
// replica is skipped. The hedged replica's reply wins (hedges_won) and the first replica's,
// after it, is a late reply; a first reply from the first copy's replica is no win. A
// round's hedges are not held back past its first quantile_late_max copies, as retries are.
func TestResendHedges(t *testing.T) {
	f, s := resendFixture(t, coord4, w4, resendOpts{rounds: 2, shards: shards4})
	const ms = uint64(time.Millisecond)
	t0 := bpftest.ClockStart
	due := t0 + uint64(resendDelay)
	type step = bpftest.Case
	slot := uint64(64)
	var id uint64
	scatter := func() step {
		return step{Name: "scatter", Prog: f.o.Scatter, Now: t0, In: request(coord4, w4[0], 1, id, []byte("payload")),
			WantRet: bpftest.TCActShot}
	}
	answer := func(shard, r int, ret uint32) step {
		return step{Name: "reply", Prog: f.o.Gather, Now: due + ms, WantRet: ret,
			In: reply(shards4[shard][r], coord4, 1, uint16(shard), id, vec64(1), nil)}
	}
	rep := func(shard, r int) sent {
		return sent{to: shards4[shard][r], mac: replicaMAC(shard, r), worker: uint16(shard)}
	}
	tickStep := step{Name: "tick", Prog: f.o.Resend, Now: due, In: tick(due), WantRet: bpftest.TCActShot}
	// adaptive sets the group's quantile (0.95) and floor, and the estimate to the fixed
	// delay, so that the scatter's round is due at the tick as with the fixed delay.
	adaptive := func(floor uint64, tokens int64) func(tb testing.TB) {
		return func(tb testing.TB) {
			var g GroupCfg
			if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
				tb.Fatal(err)
			}
			old := g
			g.ResendQuantileMilli, g.ResendMinNs = 950, floor
			if err := f.o.Groups.Put(uint32(1), &g); err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() {
				if err := f.o.Groups.Put(uint32(1), &old); err != nil {
					tb.Error(err)
				}
			})
			if err := f.o.Budgets.Put(uint32(1), &BudgetRec{TokensMilli: tokens, DelayNs: uint64(resendDelay)}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	cases := []struct {
		name   string
		setup  func(tb testing.TB)
		steps  func() []step
		want   bpftest.Counters
		resent []sent
		next   uint64 // the next round's due time after the tick (from due; 0: not checked)
	}{{
		name:   "retry the shard of one replica, hedge the others to their next replica; the fixed delay: the next round a whole delay on",
		steps:  func() []step { return []step{scatter(), tickStep} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 1, "1.Hedges": 2, "1.ResendRounds": 1},
		resent: []sent{rep(0, 0), rep(1, 1), rep(2, 2)},
		next:   uint64(resendDelay),
	}, {
		name:   "the adaptive delay: the next round half the delay on (resend_again_delay)",
		setup:  adaptive(uint64(resendDelay)/10, 1<<30),
		steps:  func() []step { return []step{scatter(), tickStep} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 1, "1.Hedges": 2, "1.ResendRounds": 1, "1.ResendCensored": 2},
		resent: []sent{rep(0, 0), rep(1, 1), rep(2, 2)},
		next:   uint64(resendDelay) / 2,
	}, {
		name:   "the adaptive delay: the next round at least the floor on",
		setup:  adaptive(uint64(resendDelay)*3/4, 1<<30),
		steps:  func() []step { return []step{scatter(), tickStep} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 1, "1.Hedges": 2, "1.ResendRounds": 1, "1.ResendCensored": 2},
		resent: []sent{rep(0, 0), rep(1, 1), rep(2, 2)},
		next:   uint64(resendDelay) * 3 / 4,
	}, {
		name: "the hedge's reply wins; the first copy's reply after it is late",
		steps: func() []step {
			return []step{scatter(), tickStep, answer(1, 1, bpftest.XDPDrop), answer(1, 0, bpftest.XDPDrop),
				answer(2, 1, bpftest.XDPDrop)}
		},
		want: bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 1, "1.Hedges": 2, "1.Replies": 2, "1.ResendRounds": 1,
			"1.HedgesWon": 1, "1.LateReplies": 1},
		resent: []sent{rep(0, 0), rep(1, 1), rep(2, 2)},
	}, {
		name: "an ejected replica is skipped: shard 2's hedge goes to replica 0",
		setup: func(tb testing.TB) {
			sh := f.shard(tb, 2)
			sh.OutUntilNs[2] = due + uint64(time.Second)
			if err := f.o.Replicas.Put(uint32(2), &sh); err != nil {
				tb.Fatal(err)
			}
		},
		steps:  func() []step { return []step{scatter(), tickStep} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 1, "1.Hedges": 2, "1.ResendRounds": 1},
		resent: []sent{rep(0, 0), rep(1, 1), rep(2, 0)},
	}, {
		// q 0.95: a request of 3 lacks at most 2 in the ordinary case (quantile_late_max);
		// TestResendAdaptiveDelay's round of 3 retries with the same 6 copies saved is
		// refused its third.
		name: "a hedge past the round's first quantile_late_max copies spends below half the cap (budget_keep)",
		setup: func(tb testing.TB) {
			var g GroupCfg
			if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
				tb.Fatal(err)
			}
			q := g.ResendQuantileMilli
			g.ResendQuantileMilli = 950
			if err := f.o.Groups.Put(uint32(1), &g); err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() {
				g.ResendQuantileMilli = q
				if err := f.o.Groups.Put(uint32(1), &g); err != nil {
					tb.Error(err)
				}
			})
			if err := f.o.Budgets.Put(uint32(1), &BudgetRec{TokensMilli: 6 * CopyMilli}); err != nil {
				tb.Fatal(err)
			}
		},
		steps:  func() []step { return []step{scatter(), tickStep} },
		want:   bpftest.Counters{"1.Requests": 1, "1.Copies": 3, "1.Retries": 1, "1.Hedges": 2, "1.ResendRounds": 1},
		resent: []sent{rep(0, 0), rep(1, 1), rep(2, 2)},
	}}
	r := bpftest.Runner{Counters: f.counters, Clock: f.o.Clock, Within: s.ns.Do}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			slot++
			id = 5<<10 | slot
			f.resetResend(t, 1<<30)
			for i := range shards4 {
				sh := f.shard(t, uint32(i))
				sh.OutUntilNs, sh.UnansweredNs = [4]uint64{}, [4]uint64{}
				if err := f.o.Replicas.Put(uint32(i), &sh); err != nil {
					t.Fatal(err)
				}
			}
			if c.setup != nil {
				c.setup(t)
			}
			s.captureQuiet(t)
			r.RunCase(t, bpftest.Case{Name: c.name, Steps: c.steps(), WantCounters: c.want})
			got := s.captureQuiet(t)
			if len(got) != len(shards4)+len(c.resent) {
				t.Fatalf("captured %d copies, want %d scattered and %d re-sent", len(got), len(shards4), len(c.resent))
			}
			for i, frame := range got[:len(shards4)] {
				if g, w := sentOf(t, frame), rep(i, int((5+uint64(i))%uint64(len(shards4[i])))); g != w {
					t.Errorf("scattered copy %d: %+v, want %+v", i, g, w)
				}
			}
			for i, frame := range got[len(shards4):] {
				if g := sentOf(t, frame); g != c.resent[i] {
					t.Errorf("re-sent copy %d: %+v, want %+v", i, g, c.resent[i])
				}
			}
			if st := f.stored(t, id); c.next != 0 && st.DueNs != due+c.next {
				t.Errorf("next round due %d ns after the tick, want %d", int64(st.DueNs-due), c.next)
			}
		})
	}
}

// TestResendIPv6AndEdges: a retry over IPv6 (checksums over the IPv6 pseudo header), a
// request too long to store (scattered, never re-sent), and what else may reach the tick
// program: a packet that is no tick passes, a tick frame with a bad magic is dropped.
func TestResendIPv6AndEdges(t *testing.T) {
	t0 := bpftest.ClockStart
	due := t0 + uint64(resendDelay)
	t.Run("IPv6 retry", func(t *testing.T) {
		f, s := resendFixture(t, coord6, w6, resendOpts{rounds: 1})
		f.resetResend(t, 1<<30)
		id := uint64(3<<10 | 70)
		r := bpftest.Runner{Counters: f.counters, Clock: f.o.Clock, Within: s.ns.Do}
		r.RunCase(t, bpftest.Case{Name: "IPv6", Steps: []bpftest.Case{
			{Name: "scatter", Prog: f.o.Scatter, Now: t0, In: request(coord6, w6[0], 1, id, []byte("payload")), WantRet: bpftest.TCActShot},
			{Name: "reply", Prog: f.o.Gather, Now: t0, In: reply(w6[1], coord6, 1, 1, id, vec64(1), nil), WantRet: bpftest.XDPDrop},
			{Name: "tick", Prog: f.o.Resend, Now: due, In: tick(due), WantRet: bpftest.TCActShot,
				// The skb the next tick is cloned from is IPv4 again: the IPv6 frame less
				// the 20 bytes bpf_skb_change_proto pushed (resend.h).
				Check: func(tb testing.TB, res bpftest.Result) {
					if frame := request(coord6, w6[0], 1, id, []byte("payload")); len(res.Out) != len(frame)-20 {
						tb.Errorf("after the round the tick's skb is %d bytes, want the IPv6 frame's %d less 20", len(res.Out), len(frame))
					}
				}},
		}, WantCounters: bpftest.Counters{"1.Requests": 1, "1.Copies": 2, "1.Replies": 1, "1.Retries": 1, "1.ResendRounds": 1}})
		wantResent(t, s, 2, []sent{{to: w6[0], mac: workerMAC(0), worker: 0}})
	})
	t.Run("edges", func(t *testing.T) {
		f, s := resendFixture(t, coord4, w4, resendOpts{rounds: 1})
		f.resetResend(t, 1<<30)
		long := make([]byte, StoreBytes)
		id := uint64(4<<10 | 71)
		notTick := pktbuild.New().IPv4(pktbuild.IPv4{Src: coord4.Addr(), Dst: w4[0].Addr()}).
			UDP(pktbuild.UDP{Src: 1, Dst: 2}).Payload([]byte("not a tick")).Build()
		bad := tick(due)
		bad[14+20] ^= 0xff // the magic
		r := bpftest.Runner{Counters: f.counters, Clock: f.o.Clock, Within: s.ns.Do}
		r.Run(t, []bpftest.Case{{
			Name: "a request too long to store is scattered, never re-sent",
			Steps: []bpftest.Case{
				{Name: "scatter", Prog: f.o.Scatter, Now: t0, In: request(coord4, w4[0], 1, id, long), WantRet: bpftest.TCActShot},
				{Name: "tick", Prog: f.o.Resend, Now: due, In: tick(due), WantRet: bpftest.TCActShot},
			},
			Check: func(tb testing.TB, _ bpftest.Result) {
				c, err := f.counters()
				if err != nil {
					tb.Fatal(err)
				}
				if c["1.ResendUnstored"] != 1 || c["1.Retries"] != 0 {
					tb.Errorf("resend_unstored %d retries %d; want 1, 0", c["1.ResendUnstored"], c["1.Retries"])
				}
				if st := f.stored(tb, id); st.Len != 0 || st.DueNs != 0 {
					tb.Errorf("stored: len %d due %d; want 0, 0", st.Len, st.DueNs)
				}
			},
		}, {
			Name: "a loopback group's copy back from the pacer veth (its mark): out of lo by bpf_redirect_neigh",
			Prog: f.o.Resend, In: request(coord4, w4[0], 1, id, []byte("payload")), Skb: &bpftest.SkBuff{Mark: CopyMark},
			WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{},
		}, {
			Name: "not a tick: passed", Prog: f.o.Resend, In: notTick, WantRet: bpftest.TCActUnspec,
			WantCounters: bpftest.Counters{},
		}, {
			Name: "a tick frame with a bad magic: dropped", Prog: f.o.Resend, In: bad, WantRet: bpftest.TCActShot,
			WantCounters: bpftest.Counters{},
		}})
	})
}

// quantileStep mirrors bpf/sg/stored.h's quantile_step.
func quantileStep(m, ns uint64, qMilli uint64) uint64 {
	step := m>>5 + 1
	up, down := step*qMilli/1000+1, step*(1000-qMilli)/1000+1
	switch {
	case ns == 0:
		ns = 1
		fallthrough
	default:
		if m == 0 {
			return ns
		}
		if ns > m {
			return m + up
		}
		if ns < m {
			if m > down {
				return m - down
			}
			return 1
		}
		return m
	}
}

// TestResendAdaptiveDelay: with resend_q_milli the delay is the group's estimated quantile
// of reply times, stepped by each first reply of a worker that was not re-sent (the first
// sample sets it; then up by q, down by 1 - q of 1/32 of itself), clamped to [resend_min_ns,
// resend_ns]; no estimate: resend_ns. A re-sent worker's reply does not step it; its first
// re-send does instead, as a sample known to lie above the time waited (censored): one step
// up when that time has reached the estimate, none before it, none for a worker the budget
// did not pay for (its own reply is sampled) and none at its second round. A request counts
// at most 2 + 4 x workers x (1 - q) samples above (quantile_claim_up), and a round's copies
// past that many leave half the budget's cap (budget_keep).
func TestResendAdaptiveDelay(t *testing.T) {
	f, s := resendFixture(t, coord4, w4, resendOpts{rounds: 2})
	const ms = uint64(time.Millisecond)
	var g GroupCfg
	if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	// q 0.95: a request of 3 workers counts at most 2 samples above the estimate
	// (quantile_claim_up: 2 + 4 x 3 x 0.05, rounded down).
	const q = 950
	g.ResendNs, g.ResendMinNs, g.ResendQuantileMilli = 20*ms, 1*ms, q
	if err := f.o.Groups.Put(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	estimate := func(tb testing.TB) uint64 {
		var b BudgetRec
		if err := f.o.Budgets.Lookup(uint32(1), &b); err != nil {
			tb.Fatal(err)
		}
		return b.DelayNs
	}
	setEstimate := func(v uint64, tokens int64) func(testing.TB) {
		return func(tb testing.TB) {
			if err := f.o.Budgets.Put(uint32(1), &BudgetRec{TokensMilli: tokens, DelayNs: v}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	up := func(m uint64) uint64 { return quantileStep(m, m+1, q) } // a sample above m
	t0 := bpftest.ClockStart
	slot := uint64(64)
	r := bpftest.Runner{Counters: f.counters, Clock: f.o.Clock, Within: s.ns.Do}
	type step = bpftest.Case
	cases := []struct {
		name     string
		estimate uint64 // before the case (0: none)
		steps    func(id uint64) []step
		tokens   int64  // the budget's milli-copies (0: plenty)
		wantDue  uint64 // the stored request's due time after the steps (from t0; 0: none)
		wantEst  uint64
		censored int64 // first re-sends counted above the estimate (resend_censored)
		refused  int64 // copies the budget refused (resend_refused)
	}{{
		name:    "no estimate: resend_ns",
		steps:   func(id uint64) []step { return []step{scatterStep(f, id, t0)} },
		wantDue: 20 * ms,
		wantEst: 0,
	}, {
		name: "the first reply sets the estimate, the next equal ones keep it",
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), replyStep(f, id, 0, t0+2*ms), replyStep(f, id, 1, t0+2*ms)}
		},
		wantDue: 20 * ms,
		wantEst: 2 * ms,
	}, {
		name:     "a request after: due at the estimate",
		estimate: 2 * ms,
		steps:    func(id uint64) []step { return []step{scatterStep(f, id, t0)} },
		wantDue:  2 * ms,
		wantEst:  2 * ms,
	}, {
		name:     "clamped up to resend_min_ns",
		estimate: ms / 10,
		steps:    func(id uint64) []step { return []step{scatterStep(f, id, t0)} },
		wantDue:  1 * ms,
		wantEst:  ms / 10,
	}, {
		name:     "clamped down to resend_ns",
		estimate: 50 * ms,
		steps:    func(id uint64) []step { return []step{scatterStep(f, id, t0)} },
		wantDue:  20 * ms,
		wantEst:  50 * ms,
	}, {
		name:     "a slower reply steps it up by q, a faster one down by 1 - q",
		estimate: 10 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), replyStep(f, id, 0, t0+20*ms), replyStep(f, id, 1, t0+5*ms)}
		},
		wantDue: 10 * ms,
		wantEst: quantileStep(quantileStep(10*ms, 20*ms, q), 5*ms, q),
	}, {
		name:     "a re-sent worker steps it up (censored above it), its reply does not; the request's third does not (two samples above per request at 3 workers, q 0.95); the next round is due at the estimate before",
		estimate: 3 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), tickStep(f, t0+3*ms), replyStep(f, id, 2, t0+9*ms)}
		},
		wantDue:  6 * ms,
		wantEst:  up(up(3 * ms)),
		censored: 2,
	}, {
		name:     "replies above it: the request's first two step it up, the third does not (quantile_claim_up)",
		estimate: 3 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), replyStep(f, id, 0, t0+4*ms), replyStep(f, id, 1, t0+5*ms), replyStep(f, id, 2, t0+6*ms)}
		},
		wantDue: 3 * ms,
		wantEst: up(up(3 * ms)),
	}, {
		name:     "a reply below steps it down after the request's samples above ran out",
		estimate: 3 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), replyStep(f, id, 0, t0+4*ms), replyStep(f, id, 1, t0+5*ms), replyStep(f, id, 2, t0+1*ms)}
		},
		wantDue: 3 * ms,
		wantEst: quantileStep(up(up(3*ms)), 1*ms, q),
	}, {
		name:     "an answered worker is sampled (below: not one of the two above), both re-sent ones step it up",
		estimate: 3 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), replyStep(f, id, 0, t0+1*ms), tickStep(f, t0+3*ms)}
		},
		wantDue:  3*ms + quantileStep(3*ms, 1*ms, q),
		wantEst:  up(up(quantileStep(3*ms, 1*ms, q))),
		censored: 2,
	}, {
		name:     "a second round does not step it again",
		estimate: 3 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), tickStep(f, t0+3*ms), tickStep(f, t0+6*ms)}
		},
		wantDue:  0, // the last round (resend_max 2)
		wantEst:  up(up(3 * ms)),
		censored: 2,
	}, {
		name:     "a round the pacer delivered within its early margin of the estimate steps it up as one at it",
		estimate: 3 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), tickStep(f, t0+3*ms-uint64(tickEarly)/2)}
		},
		wantDue:  6*ms - uint64(tickEarly)/2,
		wantEst:  up(up(3 * ms)),
		censored: 2,
	}, {
		name:     "a worker the budget refuses does not step it",
		estimate: 3 * ms,
		tokens:   CopyMilli,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), tickStep(f, t0+3*ms)}
		},
		wantDue:  6 * ms,
		wantEst:  up(3 * ms),
		censored: 1,
		refused:  2,
	}, {
		name:     "a round's copies past the two a request of 3 lacks at most in the ordinary case (q 0.95) leave half the cap (budget_keep): of 6 copies saved the third copy is refused",
		estimate: 3 * ms,
		tokens:   6 * CopyMilli,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), tickStep(f, t0+3*ms)}
		},
		wantDue:  6 * ms,
		wantEst:  up(up(3 * ms)),
		censored: 2,
		refused:  1,
	}, {
		name:     "a re-send before the estimate (the delay clamped to resend_ns) does not step it",
		estimate: 50 * ms,
		steps: func(id uint64) []step {
			return []step{scatterStep(f, id, t0), tickStep(f, t0+20*ms)}
		},
		wantDue: 40 * ms,
		wantEst: 50 * ms,
	}}
	for k, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			slot++
			id := uint64(k+1)<<10 | slot
			f.resetResend(t, 1<<30)
			setEstimate(c.estimate, cmpOr(c.tokens, 1<<30))(t)
			before, err := f.counters()
			if err != nil {
				t.Fatal(err)
			}
			r.RunCase(t, bpftest.Case{Name: c.name, Steps: c.steps(id)})
			s.captureQuiet(t)
			if after, err := f.counters(); err != nil {
				t.Fatal(err)
			} else {
				if n := after["1.ResendCensored"] - before["1.ResendCensored"]; n != c.censored {
					t.Errorf("resend_censored +%d, want +%d", n, c.censored)
				}
				if n := after["1.ResendRefused"] - before["1.ResendRefused"]; n != c.refused {
					t.Errorf("resend_refused +%d, want +%d", n, c.refused)
				}
			}
			if st := f.stored(t, id); c.wantDue == 0 && st.DueNs != 0 {
				t.Errorf("due %d ms after the scatter, want no round left", (st.DueNs-t0)/ms)
			} else if c.wantDue != 0 && st.DueNs != t0+c.wantDue {
				t.Errorf("due %d ns after the scatter, want %d", st.DueNs-t0, c.wantDue)
			}
			if e := estimate(t); e != c.wantEst {
				t.Errorf("estimate %d ns, want %d", e, c.wantEst)
			}
		})
	}
}

func scatterStep(f *fixture, id, at uint64) bpftest.Case {
	return bpftest.Case{Name: "scatter", Prog: f.o.Scatter, Now: at, In: request(coord4, w4[0], 1, id, []byte("payload")),
		WantRet: bpftest.TCActShot}
}

func tickStep(f *fixture, at uint64) bpftest.Case {
	return bpftest.Case{Name: "tick", Prog: f.o.Resend, Now: at, In: tick(at), WantRet: bpftest.TCActShot}
}

func replyStep(f *fixture, id uint64, w int, at uint64) bpftest.Case {
	return bpftest.Case{Name: fmt.Sprintf("reply %d", w), Prog: f.o.Gather, Now: at,
		In: reply(w4[w], coord4, 1, uint16(w), id, vec64(1), nil), WantRet: bpftest.XDPDrop}
}
