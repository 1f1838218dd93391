package hedge

// BPF_PROG_TEST_RUN fixtures of replica judgement (bpf/hedge/replica.h): a replica that left
// its last hedges unanswered is ejected at the next pick and the hedge goes to another; with
// every replica out the hedge is not sent (replicas_out) and the request is left to its
// response; after the back-off the replica is picked again, on probation; a response makes
// it good again; a replica far slower than the others is ejected by the response path.

import (
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestReplicaJudgement(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x77
	p := idPayload(id, 32)
	k := key(sRR, client4, id)
	req := datagram(client4, svcRR, p)
	due := f.at(func(f *fixture, now uint64) error { return f.objs.Scoreboard.Put(k, dueEntry(now)) })
	cfg := f.svcCfg(t, sRR)
	if cfg.EjectAfter != DefaultEjectAfter || cfg.JudgeNs != uint64(2*testDelay) || cfg.EjectBaseNs != uint64(time.Second) {
		t.Fatalf("rr's judgement %d after, judge %d ns, base %d ns: not the defaults", cfg.EjectAfter, cfg.JudgeNs, cfg.EjectBaseNs)
	}
	judge := uint64(cfg.JudgeNs)
	// state edits svc rr's state before a case.
	state := func(edit func(st *hedgeSvcState)) func(testing.TB) {
		return func(tb testing.TB) {
			st := f.state(tb, sRR)
			edit(&st)
			if err := f.objs.SvcStates.Put(uint32(sRR), st); err != nil {
				tb.Fatal(err)
			}
		}
	}
	// silent: replica i left its last 3 hedges unanswered, the last sent judge + 1 ns ago.
	silent := func(i int) func(*hedgeSvcState) {
		return func(st *hedgeSvcState) { st.RepUnanswered[i], st.RepJudgeFromNs[i] = 3, now0-judge-1 }
	}
	// out: replica i ejected until now0 + 1 s, level 1.
	out := func(i int) func(*hedgeSvcState) {
		return func(st *hedgeSvcState) {
			st.RepOutUntilNs[i], st.RepLevel[i], st.RepEjections[i] = now0+uint64(time.Second), 1, 1
		}
	}
	both := func(a, b func(*hedgeSvcState)) func(*hedgeSvcState) {
		return func(st *hedgeSvcState) { a(st); b(st) }
	}
	// judged checks replica i's judgement state after the case.
	judged := func(i int, until uint64, level uint32, ejections uint64, unanswered uint32) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, _ bpftest.Result) {
			tb.Helper()
			st := f.state(tb, sRR)
			if st.RepOutUntilNs[i] != until || st.RepLevel[i] != level || st.RepEjections[i] != ejections || st.RepUnanswered[i] != unanswered {
				tb.Errorf("replica %d: out until %d level %d ejections %d unanswered %d; want %d, %d, %d, %d", i,
					st.RepOutUntilNs[i], st.RepLevel[i], st.RepEjections[i], st.RepUnanswered[i], until, level, ejections, unanswered)
			}
		}
	}
	hedge := bpftest.Counters{"rr.HedgesSent": 1}
	runCases(t, f, f.objs.HedgeRescue, []bpftest.Case{
		{Name: "replica 1 silent for 3 hedges: ejected for the base back-off, the hedge goes to replica 2", In: req,
			Setup: bpftest.Seq(state(silent(1)), due), WantRet: redirect, WantOut: datagram(client4, repRR2, p),
			WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge,
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqHedged},
				judged(1, now0+uint64(time.Second), 1, 1, DefaultEjectAfter-1), judged(2, 0, 0, 0, 1))},
		{Name: "3 unanswered, the last within the judge's wait: still in (round robin at 0: replica 1)", In: req,
			Setup:   bpftest.Seq(state(func(st *hedgeSvcState) { st.RepUnanswered[1], st.RepJudgeFromNs[1] = 3, now0-judge+1 }), due),
			WantRet: redirect, WantOut: datagram(client4, repRR1, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge,
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqHedged}, judged(1, 0, 0, 0, 4))},
		{Name: "2 unanswered long ago: below eject_after, in", In: req,
			Setup:   bpftest.Seq(state(func(st *hedgeSvcState) { st.RepUnanswered[1] = 2 }), due),
			WantRet: redirect, WantOut: datagram(client4, repRR1, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge,
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqHedged}, judged(1, 0, 0, 0, 3))},
		{Name: "every replica out: not sent, counted, the request left to its response", In: req,
			Setup: bpftest.Seq(state(both(out(1), out(2))), due), WantRet: shot,
			WantCounters: bpftest.Counters{"rr.ReplicasOut": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqNoHedge}, judged(1, now0+uint64(time.Second), 1, 1, 0))},
		{Name: "one out, the other silent: ejected too, then every replica is out", In: req,
			Setup: bpftest.Seq(state(both(out(1), silent(2))), due), WantRet: shot,
			WantCounters: bpftest.Counters{"rr.ReplicasOut": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqNoHedge}, judged(2, now0+uint64(time.Second), 1, 1, DefaultEjectAfter-1))},
		{Name: "back-off over, on probation and silent again: out for twice as long", In: req,
			Setup: bpftest.Seq(state(func(st *hedgeSvcState) {
				st.RepOutUntilNs[1], st.RepLevel[1], st.RepEjections[1] = now0-judge-1, 1, 1
				st.RepUnanswered[1], st.RepJudgeFromNs[1] = DefaultEjectAfter, now0-judge-1
			}), due),
			WantRet: redirect, WantOut: datagram(client4, repRR2, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge,
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqHedged}, judged(1, now0+2*uint64(time.Second), 2, 2, DefaultEjectAfter-1))},
		{Name: "back-off over: picked again (round robin at 0), one more unanswered hedge", In: req,
			Setup: bpftest.Seq(state(func(st *hedgeSvcState) {
				st.RepOutUntilNs[1], st.RepLevel[1], st.RepEjections[1], st.RepUnanswered[1] = now0, 1, 1, DefaultEjectAfter-1
			}), due),
			WantRet: redirect, WantOut: datagram(client4, repRR1, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge,
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqHedged}, judged(1, now0, 1, 1, DefaultEjectAfter))},
		{Name: "the longest back-off is eject_max_ns", In: req,
			Setup:   bpftest.Seq(state(func(st *hedgeSvcState) { silent(1)(st); st.RepLevel[1] = 40 }), due),
			WantRet: redirect, WantOut: datagram(client4, repRR2, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge,
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqHedged},
				judged(1, now0+uint64(DefaultEjectMaxBackoff), uint32(hedgeHedgeLimitsEJECT_LEVEL_MAX)+1, 1, DefaultEjectAfter-1))},
	})

	// The response path: a response makes a replica good again; a median far above the
	// others' (and the delay) ejects it.
	runCases(t, f, f.objs.HedgeResp, []bpftest.Case{
		{Name: "replica 1 answers its hedge: unanswered and the back-off's doubling reset", In: datagram(repRR1, client4, p),
			Setup:   bpftest.Seq(state(func(st *hedgeSvcState) { st.RepUnanswered[1], st.RepLevel[1], st.RepEjections[1] = 2, 3, 3 }), f.at(hedgedBy(k, 1))),
			WantRet: unspec, WantOut: datagram(svcRR, client4, p),
			WantCounters: bpftest.Counters{"rr.Responses": 1, "rr.HedgesWon": 1, "rr.ResponsesRewritten": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqAnsweredHedge}, judged(1, 0, 0, 3, 0))},
		{Name: "replica 2's median 100x replica 1's and above the delay: ejected by its response", In: datagram(repRR2, client4, p),
			Setup: bpftest.Seq(state(func(st *hedgeSvcState) {
				st.RepP50Ns[1], st.RepP50Ns[2] = uint64(100*time.Microsecond), uint64(time.Second)
			}), f.at(hedgedBy(k, 2))),
			WantRet: unspec, WantOut: datagram(svcRR, client4, p),
			WantCounters: bpftest.Counters{"rr.Responses": 1, "rr.HedgesWon": 1, "rr.ResponsesRewritten": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqAnsweredHedge}, judged(2, now0+uint64(time.Second), 1, 1, DefaultEjectAfter-1))},
		{Name: "replica 2's median 10000x the service address's, replica 1 without one: in (the service address is no yardstick)",
			In: datagram(repRR2, client4, p),
			Setup: bpftest.Seq(state(func(st *hedgeSvcState) {
				st.RepP50Ns[0], st.RepP50Ns[1], st.RepP50Ns[2] = uint64(40*time.Microsecond), 0, uint64(time.Second)
			}), f.at(hedgedBy(k, 2))),
			WantRet: unspec, WantOut: datagram(svcRR, client4, p),
			WantCounters: bpftest.Counters{"rr.Responses": 1, "rr.HedgesWon": 1, "rr.ResponsesRewritten": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqAnsweredHedge}, judged(2, 0, 0, 0, 0))},
		{Name: "replica 2's median 5x replica 1's: in (the factor is 10)", In: datagram(repRR2, client4, p),
			Setup: bpftest.Seq(state(func(st *hedgeSvcState) {
				st.RepP50Ns[1], st.RepP50Ns[2] = uint64(20*time.Millisecond), uint64(100*time.Millisecond)
			}), f.at(hedgedBy(k, 2))),
			WantRet: unspec, WantOut: datagram(svcRR, client4, p),
			WantCounters: bpftest.Counters{"rr.Responses": 1, "rr.HedgesWon": 1, "rr.ResponsesRewritten": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqAnsweredHedge}, judged(2, 0, 0, 0, 0))},
	})
}

// TestEjectionDefaults checks the judgement's defaults and that off stays off.
func TestEjectionDefaults(t *testing.T) {
	c, err := loadYAML(t, `
interface: eth0
services:
  - address: 198.18.0.12:9999
    delay: 20ms
  - address: 198.18.0.13:9999
    ejection: off
  - address: 198.18.0.14:9999
    delay: 1ms
    ejection: {after: 1, backoff: 2m}
`)
	if err != nil {
		t.Fatal(err)
	}
	want := EjectionSpec{After: DefaultEjectAfter, SlowFactor: DefaultSlowFactor, Backoff: DefaultEjectBackoff, MaxBackoff: DefaultEjectMaxBackoff}
	if got := c.Services[0].Ejection; got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	if got := c.Services[0].judgeWait(); got != 40*time.Millisecond {
		t.Errorf("judge wait %v, want twice the delay", got)
	}
	if !c.Services[1].Ejection.Off {
		t.Error("ejection: off was not kept")
	}
	s := c.Services[2]
	if s.Ejection.MaxBackoff != 2*time.Minute || s.judgeWait() != minJudge {
		t.Errorf("after 1, backoff 2m: %+v, judge %v", s.Ejection, s.judgeWait())
	}
}

// TestEjectionConfigErrors: bad judgement settings are refused with what to write instead.
func TestEjectionConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"word", "ejection: never", `ejection "never": use off`},
		{"after", "ejection: {after: 2000}", "ejection.after 2000: use 1..1000"},
		{"backoff", "ejection: {backoff: 1ms}", "ejection.backoff 1ms: use 10ms..1h"},
		{"max", "ejection: {backoff: 2s, max_backoff: 1s}", "ejection.max_backoff 1s: use backoff (2s)..24h"},
		{"factor", "ejection: {slow_factor: 1}", "ejection.slow_factor 1: use 2..1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadYAML(t, "interface: eth0\nservices:\n  - name: s\n    address: 198.18.0.12:9999\n    "+tc.yaml+"\n")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
