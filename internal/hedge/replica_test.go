package hedge

import (
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pacer"
)

// Replica choice (bpf/hedge/replica.h) through the programs that use it: the rescuer picks
// the hedge's replica, the response path keeps each replica's latency estimate. Service
// "rr" has three replicas: 0 its own address (the one clients use), 1 repRR1, 2 repRR2.

// setChoice sets service svc's replica choice and its replicas' estimates (ns; 0: cold).
func setChoice(tb testing.TB, f *fixture, svc int, choice uint8, rr uint32, p50 ...uint64) {
	tb.Helper()
	c := f.svcCfg(tb, svc)
	c.ReplicaChoice = choice
	if err := f.objs.SvcCfgs.Put(uint32(svc), c); err != nil {
		tb.Fatal(err)
	}
	st := f.state(tb, svc)
	st.Rr = rr
	st.RepP50Ns = [replicaMax]uint64{}
	copy(st.RepP50Ns[:], p50)
	if err := f.objs.SvcStates.Put(uint32(svc), st); err != nil {
		tb.Fatal(err)
	}
}

// rescueDue runs the rescuer on a due request id of service svc (its own address to) and
// returns the run and the entry afterwards. The entry is due just before the run (its
// far-overdue cutoff a second away).
func rescueDue(tb testing.TB, f *fixture, svc int, to netip.AddrPort, id uint32) (bpftest.Result, hedgeHreq) {
	tb.Helper()
	k := key(svc, client4, uint64(id))
	r, err := f.runAt(f.objs.HedgeRescue, datagram(client4, to, idPayload(id, 32)), 0, func(now uint64) error {
		return f.objs.Scoreboard.Put(k, dueEntry(now))
	})
	if err != nil {
		tb.Fatal(err)
	}
	e, _ := f.entry(tb, k)
	return r, e
}

// hedgeOnce runs the rescuer on a due request of service rr and returns the replica its
// hedge went to.
func hedgeOnce(tb testing.TB, f *fixture, id uint32) uint8 {
	tb.Helper()
	r, e := rescueDue(tb, f, sRR, svcRR, id)
	if r.Ret != redirect || e.State != reqHedged {
		tb.Fatalf("request %d: verdict %s, state %s; want a hedge", id, verdict(r.Ret), stateNames[e.State])
	}
	return e.HedgeReplica
}

// TestPickReplica: round robin spreads hedges evenly over the replicas other than the one
// the client used; p50 takes the untried replica with the lowest estimate, a cold one
// first, ties to the first from a rotating start; the client's own replica is never picked, however fast.
func TestPickReplica(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.reset(t)
	rrP, p50 := uint8(hedgeReplicaChoiceREPLICA_RR), uint8(hedgeReplicaChoiceREPLICA_P50)
	ms := uint64(time.Millisecond)

	setChoice(t, f, sRR, rrP, 0)
	var got []uint8
	for id := uint32(1); id <= 6; id++ {
		got = append(got, hedgeOnce(t, f, id))
	}
	if want := []uint8{1, 2, 1, 2, 1, 2}; string(got) != string(want) {
		t.Errorf("round robin: hedges went to %v, want %v", got, want)
	}

	cases := []struct {
		name string
		rr   uint32
		p50  []uint64
		want uint8
	}{
		{"lowest estimate wins", 0, []uint64{1 * ms, 5 * ms, 2 * ms}, 2},
		{"lowest estimate wins, other order", 1, []uint64{1 * ms, 2 * ms, 5 * ms}, 1},
		{"the client's replica is never a hedge target, however fast", 0, []uint64{ms / 10, 3 * ms, 4 * ms}, 1},
		{"a cold replica (no estimate) is tried first", 0, []uint64{1 * ms, 1 * ms, 0}, 2},
		{"a cold replica (no estimate) is tried first, other order", 1, []uint64{1 * ms, 0, 1 * ms}, 1},
		{"ties: the first from a rotating start (rr 0)", 0, []uint64{1 * ms, 2 * ms, 2 * ms}, 1},
		{"ties: the first from a rotating start (rr 2)", 2, []uint64{1 * ms, 2 * ms, 2 * ms}, 2},
	}
	for i, c := range cases {
		setChoice(t, f, sRR, p50, c.rr, c.p50...)
		if g := hedgeOnce(t, f, uint32(100+i)); g != c.want {
			t.Errorf("p50, %s: estimates %v, rr %d: hedge to replica %d, want %d", c.name, c.p50, c.rr, g, c.want)
		}
	}
}

// respondFrom runs the response path on a response of service rr from replica src (0, 1 or
// 2) to request id.
func respondFrom(tb testing.TB, f *fixture, id uint32, src int) bpftest.Result {
	tb.Helper()
	from := []netip.AddrPort{svcRR, repRR1, repRR2}[src]
	r, err := f.run(f.objs.HedgeResp, datagram(from, client4, idPayload(id, 32)), 0)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// TestReplicaLatencyAttribution: a response's latency goes to the replica it came FROM,
// measured from when the copy sent to that replica left (the hedge's time for the hedge's
// replica); the dropped duplicate's latency counts for its replica too; and at a hedged
// request's first response the other copy, still out, raises its replica's estimate (a
// lower bound above the estimate).
func TestReplicaLatencyAttribution(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.reset(t)
	setChoice(t, f, sRR, uint8(hedgeReplicaChoiceREPLICA_P50), 0)
	ms := time.Millisecond
	const id = 0x5005
	k := key(sRR, client4, id)
	now := f.now
	e := pending(now-uint64(40*ms), now-uint64(30*ms)) // sent 40 ms ago to replica 0
	e.State, e.HedgeReplica, e.HedgedNs = reqHedged, 2, now-uint64(10*ms)
	f.put(t, k, e)

	// The hedge's response from replica 2: 10 ms after the hedge left, not 40.
	r := respondFrom(t, f, id, 2)
	st := f.state(t, sRR)
	within := func(what string, got time.Duration, lo, hi time.Duration) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s: %v, want %v..%v", what, got, lo, hi)
		}
	}
	slack := time.Duration(r.Now - now)
	within("replica 2's estimate (first sample: its latency)", time.Duration(st.RepP50Ns[2]), 10*ms, 10*ms+slack)
	// Replica 0 has not answered the copy sent 40 ms ago: cold, it starts there.
	within("replica 0's estimate (overdue 40 ms, cold)", time.Duration(st.RepP50Ns[0]), 40*ms, 40*ms+slack)
	if st.RepP50Ns[1] != 0 || st.RepSamples[2] != 1 || st.RepSamples[0] != 0 {
		t.Errorf("replica 1 estimate %d (want 0: not involved), samples %v (want replica 2: 1, an overdue copy is no sample)",
			st.RepP50Ns[1], st.RepSamples)
	}

	// The duplicate from replica 0, a millisecond later (41 ms after its copy left): a
	// sample above its estimate, one step (1/32) up, and a sample.
	f.now += uint64(ms)
	r = respondFrom(t, f, id, 0)
	if r.Ret != shot {
		t.Fatalf("duplicate: verdict %s, want dropped", verdict(r.Ret))
	}
	before := st.RepP50Ns[0]
	st = f.state(t, sRR)
	if want := before + before>>5 + 1; st.RepP50Ns[0] != want || st.RepSamples[0] != 1 {
		t.Errorf("replica 0 after its late duplicate: estimate %d samples %d, want %d (one step up) and 1",
			st.RepP50Ns[0], st.RepSamples[0], want)
	}
}

// TestReplicaMedianConverges feeds replica 1's responses with latencies uniform in
// 10..90 ms (median 50 ms, a fixed seed) to an estimate starting at 200 ms: after 500
// samples it is near the median. (Simulated over 2000 seeds: 32.8..69.5 ms.)
func TestReplicaMedianConverges(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.reset(t)
	setChoice(t, f, sRR, uint8(hedgeReplicaChoiceREPLICA_P50), 0, 0, uint64(200*time.Millisecond), 0)
	rng := rand.New(rand.NewPCG(14, 3))
	var est []time.Duration
	for i := range 500 {
		id := uint32(0x6000 + i)
		lat := time.Duration(10+rng.IntN(81)) * time.Millisecond
		// Sent lat before the run (written in its thread right before it).
		_, err := f.runAt(f.objs.HedgeResp, datagram(repRR1, client4, idPayload(id, 32)), 0, func(now uint64) error {
			e := pending(now-uint64(lat), now+uint64(time.Second))
			e.State, e.OrigReplica = reqPending, 1 // replica 1's own request: its latency from sent_ns
			return f.objs.Scoreboard.Put(key(sRR, client4, uint64(id)), e)
		})
		if err != nil {
			t.Fatal(err)
		}
		if i%100 == 99 {
			est = append(est, time.Duration(f.state(t, sRR).RepP50Ns[1]))
		}
	}
	t.Logf("replica 1's estimate after 100, 200, ... samples: %v", est)
	if got := est[len(est)-1]; got < 30*time.Millisecond || got > 72*time.Millisecond {
		t.Errorf("estimate after 500 samples %v, want near the median 50ms (30..72ms)", got)
	}
}

// TestReplicaChoiceLab: the service's own server (srv1) answers every request 30 ms late,
// so every request is hedged after 5 ms; of its two replicas, srv2:9998 answers after
// 10 ms and srv2:9999 at once. Round robin splits the hedges between them; p50 tries each
// once (both cold), then sends nearly all to the fast one, because the slow one's
// responses - and the service's own duplicates - are attributed to where they came from.
//
// In two phases. Warm-up: batches of requests until the estimates rank the fast replica
// below half the slow one's (p50 has tried the slow one while it was cold by then). A single
// slow first sample of the fast replica (an emulated guest's stall of tens of milliseconds)
// makes p50 avoid it until the timer's ageing (2 s ticks here) brings it back: the warm-up
// waits for that, polled, instead of counting it against the choice. Then the measured run:
// 240 requests, whose hedges' split is checked.
func TestReplicaChoiceLab(t *testing.T) {
	requireRoot(t)
	for _, choice := range []string{ReplicaRR, ReplicaP50} {
		t.Run(choice, func(t *testing.T) {
			l := hedgeLab(t, "hr")
			srv1, srv2, client := l.Host("srv1"), l.Host("srv2"), l.Host("client")
			svc := netip.AddrPortFrom(srv1.IPv4, 9999)
			slowAt, fastAt := netip.AddrPortFrom(srv2.IPv4, 9998), netip.AddrPortFrom(srv2.IPv4, 9999)
			startRecServer(t, srv1, svc, 30*time.Millisecond)
			slow := startRecServer(t, srv2, slowAt, 10*time.Millisecond)
			fast := startRecServer(t, srv2, fastAt, 0)
			// Neighbour entries and the servers' first-time work before any latency counts:
			// one request to each, directly, before the hedger is attached (ids below 70000,
			// not counted below).
			for i, to := range []netip.AddrPort{svc, slowAt, fastAt} {
				if res := runWorkers(t, client, to, 1, 1, 60000+uint32(i), 2*time.Second); len(res.answered) != 1 {
					t.Fatalf("warm-up request to %s unanswered", to)
				}
			}
			h := startHedger(t, l, &Config{
				Interface: "eth0", Tick: Duration(2 * time.Second),
				Services: []ServiceConfig{{Name: "choice", Address: svc.String(), Replicas: []string{slowAt.String(), fastAt.String()},
					Delay: DelaySpec{Fixed: 5 * time.Millisecond}, ReplicaChoice: choice,
					// Judgement off: the slow replica (100x the fast one) would be ejected,
					// and this test is about what each choice does with both in.
					Ejection: EjectionSpec{Off: true},
					Budget:   BudgetSpec{Mode: BudgetWindow, Ratio: 1, Burst: 100}}},
			}, budgetTestBackend())
			const workers = 4
			settled := func(sent uint64) map[string]uint64 {
				return waitCounters(t, h, 2*time.Second, func(c map[string]uint64) bool {
					return c["hedges_sent"]+c["budget_exhausted"] >= sent
				})
			}
			estimates := func() []ReplicaStats {
				snap, err := h.Stats()
				if err != nil {
					t.Fatal(err)
				}
				return snap.Services[0].Replicas
			}
			// Warm-up: 40 requests a batch until the fast replica's estimate is below half
			// the slow one's.
			base, sent := uint32(70000), uint64(0)
			deadline := time.Now().Add(30 * time.Second)
			var batches int
			for {
				runWorkers(t, client, svc, workers, 10, base, time.Second)
				base, sent, batches = base+workers*10, sent+workers*10, batches+1
				settled(sent)
				if r := estimates(); len(r) == 3 && r[2].P50 > 0 && r[2].P50 < r[1].P50/2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("estimates %+v after %d warm-up requests: the fast replica never ranked below half the 10 ms one", estimates(), sent)
				}
			}
			warmSlow := countIDs(slow.ids(), 70000, base)
			t.Logf("%s: warm-up of %d batches; %d of its hedges at the 10 ms replica, %d at the fast one; estimates %+v",
				choice, batches, warmSlow, countIDs(fast.ids(), 70000, base), estimates())
			if choice == ReplicaP50 && warmSlow < 1 {
				t.Errorf("p50 never tried the 10 ms replica; want it tried while it had no estimate (cold)")
			}

			// The measured run.
			before := settled(sent)["hedges_sent"]
			const perWk = 60
			res := runWorkers(t, client, svc, workers, perWk, base, time.Second)
			c := settled(sent + workers*perWk)
			hedges := c["hedges_sent"] - before
			ns, nf := countIDs(slow.ids(), base, base+workers*perWk), countIDs(fast.ids(), base, base+workers*perWk)
			r := estimates()
			t.Logf("%s: measured run: %d requests, %d hedges, answered %d; hedges to the 10 ms replica %d, to the fast one %d; estimates %+v",
				choice, workers*perWk, hedges, len(res.answered), ns, nf, r)
			if len(res.answered) != workers*perWk || res.extra != 0 {
				t.Errorf("answered %d of %d, %d unexpected datagrams", len(res.answered), workers*perWk, res.extra)
			}
			if uint64(ns+nf) != hedges || hedges < workers*perWk*9/10 {
				t.Fatalf("hedges_sent %d, replicas got %d + %d: want (nearly) every request hedged, each hedge at a replica", hedges, ns, nf)
			}
			total := float64(ns + nf)
			switch choice {
			case ReplicaRR:
				if share := float64(nf) / total; share < 0.4 || share > 0.6 {
					t.Errorf("round robin sent %.0f%% of hedges to the fast replica, want about half", share*100)
				}
			case ReplicaP50:
				if float64(ns) > 0.05*total {
					t.Errorf("p50 sent %d of %.0f hedges to the 10 ms replica: want it avoided (<= 5%%)", ns, total)
				}
				// Relative, not absolute: in an emulated guest every latency is milliseconds more.
				// The fast replica ranked below half the 10 ms one when the warm-up ended; since
				// then the 10 ms replica got (nearly) no samples, so its estimate halved at every
				// tick, by design (replica_age): after a run of several ticks (an emulated
				// guest's) it says nothing about the choice, which the split above checks. The
				// service's own estimate is sampled throughout.
				if len(r) != 3 || r[2].P50 >= r[0].P50/2 {
					t.Errorf("estimates %+v: want the fast replica's well below the service's own (30 ms)", r)
				}
			}
		})
	}
}

// countIDs counts the ids in [from, to) of seen.
func countIDs(seen map[uint32]int, from, to uint32) int {
	n := 0
	for id, k := range seen {
		if id >= from && id < to {
			n += k
		}
	}
	return n
}

// TestReplicaEstimatesAge: the bpf_timer halves, every tick, the estimate of a replica that
// answered nothing since the last tick, and leaves one that did alone; so a replica avoided
// for being slow comes back as a candidate. The service has three replicas, none with
// traffic: replica 0 is the test's tick counter (it starts at 2^40 and answers nothing, so
// after k ticks it is 2^(40-k)), replica 1 answers nothing and must be quiet >> k at every
// poll, replica 2 is given one response through the response program (BPF_PROG_TEST_RUN,
// so the test never writes the state the timer changes) whenever its last one was consumed:
// the tick after its response leaves it as it was, each later tick without one halves it.
// Exact at any load: the ticks are counted, not assumed from the poll interval (two 400 ms
// ticks have passed between two 10 ms polls on the loaded machine).
func TestReplicaEstimatesAge(t *testing.T) {
	requireRoot(t)
	l := hedgeLab(t, "ha")
	srv1, srv2 := l.Host("srv1"), l.Host("srv2")
	svc, alt := netip.AddrPortFrom(srv1.IPv4, 9999), netip.AddrPortFrom(srv2.IPv4, 9999)
	answering := netip.AddrPortFrom(srv2.IPv4, 9998) // replica 2: its responses are test runs
	h := startHedger(t, l, &Config{
		Interface: "eth0", Tick: Duration(400 * time.Millisecond),
		Services: []ServiceConfig{{Name: "age", Address: svc.String(), Replicas: []string{alt.String(), answering.String()},
			Delay: DelaySpec{Fixed: 5 * time.Millisecond}, ReplicaChoice: ReplicaP50,
			// Judgement off: alt never answers, and this test is about the estimates' ageing
			// bringing it back, not about ejecting it.
			Ejection: EjectionSpec{Off: true}}},
	}, budgetTestBackend())
	const (
		clockBits = 40
		quiet     = uint64(1 << 4) // 0 after 5 ticks
		start     = uint64(64 * time.Millisecond)
	)
	read := func() hedgeSvcState {
		var st hedgeSvcState
		if err := h.objs.SvcStates.Lookup(uint32(0), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	ticks := func(st hedgeSvcState) int { return clockBits - (bits.Len64(st.RepP50Ns[0]) - 1) }
	// until reads until ok holds (a read can catch the timer between two replicas: read again).
	until := func(ok func(hedgeSvcState) bool) (hedgeSvcState, bool) {
		st := read()
		for try := 0; try < 3 && !ok(st); try++ {
			time.Sleep(time.Millisecond)
			st = read()
		}
		return st, ok(st)
	}
	st := read()
	st.RepP50Ns[0], st.RepP50Ns[1], st.RepP50Ns[2] = 1<<clockBits, quiet, start
	if err := h.objs.SvcStates.Put(uint32(0), st); err != nil {
		t.Fatal(err)
	}
	// respond gives replica 2 one response, later than its estimate (a step up).
	id := uint32(0x9000)
	respond := func(est uint64) {
		id++
		k := key(0, client4, uint64(id))
		err := l.Host("client").Do(func() error {
			now := uint64(pacer.Now()) // a running hedger: the kernel's clock
			if err := h.objs.Scoreboard.Put(k, pending(now-est, now+uint64(time.Second))); err != nil {
				return err
			}
			in := datagram(answering, client4, idPayload(id, 32))
			_, err := h.objs.HedgeResp.Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+bpftest.OutPad), Context: skBuff{}})
			return err
		})
		if err != nil {
			t.Fatalf("response from replica 2: %v", err)
		}
	}
	var (
		armed   bool   // replica 2's response went in before tick fed+1
		fed     int    // ticks when it went in
		base    uint64 // replica 2's estimate right after it
		checked int    // ticks whose effect on replica 2 was checked
		seen    []uint64
	)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		st = read()
		k := ticks(st)
		if st, ok := until(func(st hedgeSvcState) bool { return st.RepP50Ns[1] == quiet>>ticks(st) }); !ok {
			t.Fatalf("after %d ticks replica 1's estimate is %d, want %d (halved per tick without a response)", ticks(st), st.RepP50Ns[1], quiet>>ticks(st))
		}
		if len(seen) == 0 || st.RepP50Ns[1] != seen[len(seen)-1] {
			seen = append(seen, st.RepP50Ns[1])
		}
		if armed && k > fed {
			want := func(st hedgeSvcState) uint64 { return base >> (ticks(st) - fed - 1) }
			st, ok := until(func(st hedgeSvcState) bool { return st.RepP50Ns[2] == want(st) })
			if !ok {
				t.Fatalf("replica 2: %d after its response, %d after %d more tick(s); want %d (kept by the tick after the response, halved by each later one)",
					base, st.RepP50Ns[2], ticks(st)-fed, want(st))
			}
			checked++
			armed = false
		}
		if st.RepP50Ns[1] == 0 && checked >= 3 {
			break
		}
		if !armed && st.RepSamples[2] == 0 {
			respond(st.RepP50Ns[2])
			after := read()
			// Checkable only when no tick came between the poll and the response.
			if ticks(after) == k && after.RepSamples[2] > 0 {
				armed, fed, base = true, k, after.RepP50Ns[2]
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the timer's effect
	}
	t.Logf("replica 1's estimate, tick after tick: %v; replica 2's kept over %d checked ticks; %d ticks counted", seen, checked, ticks(read()))
	if st.RepP50Ns[1] != 0 || checked < 3 {
		t.Fatalf("after 20 s of 400 ms ticks: replica 1's estimate %d (want 0), replica 2 checked over %d ticks (want 3)", st.RepP50Ns[1], checked)
	}
}
