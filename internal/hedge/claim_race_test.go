package hedge

// The scoreboard entry's state is claimed by 32-bit compare-and-exchange (bpf/include/hedge.h,
// struct hreq): the rescuer (PENDING -> HEDGED, before its hedge leaves) and the response
// path (PENDING -> ANSWERED, HEDGED -> ANSWERED_HEDGED) race for the same entry on two
// CPUs. TestClaimRace runs them at the same moment, round after round, from two threads
// pinned to the two CPUs, on BPF_PROG_TEST_RUN, and checks that every entry was claimed
// once: either its hedge was sent and the response came as a hedged request's first, or the
// response claimed it and the rescuer sent nothing.

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"golang.org/x/sys/unix"
)

// pinned runs fn on a thread locked to cpu inside the fixture's namespace, with the thread's
// CPU mask restored before it is released.
func (f *fixture) pinned(cpu int, fn func() error) error {
	return f.ns.Do(func() error {
		var orig, set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &orig); err != nil {
			return err
		}
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return err
		}
		defer func() { _ = unix.SchedSetaffinity(0, &orig) }()
		return fn()
	})
}

// raceRound is one round's outcome.
type raceRound struct {
	rescue, resp uint32 // verdicts
	state        uint32 // the entry afterwards (0: deleted)
}

// spin busy-waits about n loop iterations (a random start offset between the two threads,
// so that over the rounds their runs overlap at every phase).
func spin(n int) {
	x := 0
	for i := 0; i < n; i++ {
		x += i
	}
	runtime.KeepAlive(x)
}

// raceRounds runs rounds rounds: setup(i) prepares round i's entry and returns the two
// programs' inputs; then the rescuer input runs on CPU 0 and the response on CPU 1, both
// released at once (a spin barrier), each after a random spin.
func raceRounds(t *testing.T, f *fixture, rounds int, a, b *ebpf.Program, setup func(i int) (inA, inB []byte),
	after func(i int) uint32) []raceRound {
	t.Helper()
	f.setClock(t)
	out := make([]raceRound, rounds)
	var ready, round atomic.Int64 // ready: threads waiting at the barrier; round: released round + 1
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	inputs := make([][2][]byte, 1)
	// The rescuer's claim window (from reading the state to its compare-and-exchange) opens
	// after its lookups; the response is quicker to reach its claim. So the rescuer's start
	// varies over a wider range, and every phase of the two runs is covered.
	spinMax := [2]int{3000, 1000}
	runOne := func(cpu int, prog *ebpf.Program, verdict func(i int) *uint32) {
		defer wg.Done()
		errs <- f.pinned(cpu, func() error {
			rng := rand.New(rand.NewPCG(uint64(cpu), 14))
			for i := range rounds {
				if cpu == 0 {
					inA, inB := setup(i)
					inputs[0] = [2][]byte{inA, inB}
					for ready.Load() != 1 { // the other thread is at the barrier
						runtime.Gosched()
					}
					ready.Store(0)
					round.Store(int64(i) + 1) // release both
				} else {
					ready.Store(1)
					for round.Load() != int64(i)+1 {
						runtime.Gosched()
					}
				}
				in := inputs[0][cpu]
				spin(rng.IntN(spinMax[cpu]))
				ret, err := prog.Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+bpftest.OutPad), Context: skBuff{}})
				if err != nil {
					return err
				}
				*verdict(i) = ret
				if cpu == 0 {
					for round.Load() != -int64(i)-1 { // the other thread's run is done
						runtime.Gosched()
					}
				} else {
					round.Store(-int64(i) - 1)
				}
			}
			return nil
		})
	}
	wg.Add(2)
	go runOne(0, a, func(i int) *uint32 { return &out[i].rescue })
	go runOne(1, b, func(i int) *uint32 { return &out[i].resp })
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range out {
		out[i].state = after(i)
	}
	return out
}

// TestClaimRace: the rescuer of each path against the response path, on the same entry at
// the same moment, rounds times. The one outcome the compare-and-exchange rules out is both
// claiming: the response passing as an unhedged request's answer (PENDING -> ANSWERED) and
// the rescuer sending the hedge anyway, which leaves the entry HEDGED with its answer gone.
// Entries must end ANSWERED_HEDGED exactly when the hedge was sent, and ANSWERED or deleted
// when it was not; the counters must add up to the same. Two responses racing each other:
// TestResponseClaimRace (resp_race_test.go), which starts both runs on the clock.
func TestClaimRace(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs to race on")
	}
	f := newFixture(t, fixtureOpts{})
	// 4000 rounds take 2-4 s here; an emulated (TCG) matrix guest runs each program
	// run about 40 times slower (150 s for 4000 in the 6.12 guest), so it runs fewer.
	rounds := 4000
	if inGuest() {
		rounds = 800
	}
	// Hedges due at once: a 1 us delay (written to the map: configs take 200us and up), and
	// a budget that never refuses (1 hedge per request).
	fast := func(svc int) {
		c := f.svcCfg(t, svc)
		c.DelayNs, c.BudgetRatioMilli = 1000, 1000
		if err := f.objs.SvcCfgs.Put(uint32(svc), c); err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{pathClone, pathStored} {
		t.Run(path, func(t *testing.T) {
			f.reset(t)
			svc, to := sWin, svcWin
			if path == pathStored {
				svc, to = sSt4, svcSt4
			}
			fast(svc)
			base := uint32(0x100000)
			req := func(i int) []byte { return datagram(client4, to, idPayload(base+uint32(i), 32)) }
			resp := func(i int) []byte { return datagram(to, client4, idPayload(base+uint32(i), 32)) }
			entry := func(i int) uint32 {
				e, ok := f.entry(t, key(svc, client4, uint64(base)+uint64(i)))
				if !ok {
					return 0
				}
				return e.State
			}
			var res []raceRound
			delta, err := bpftest.Delta(f.counters, func() error {
				res = raceRounds(t, f, rounds, f.objs.HedgeRescue, f.objs.HedgeResp, func(i int) ([]byte, []byte) {
					// The splitter records (and clones or stores) the request, due 1 us later
					// (this thread is in the fixture's namespace already).
					in := req(i)
					ret, err := f.objs.HedgeSplit.Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+bpftest.OutPad), Context: skBuff{}})
					if err != nil || ret != unspec {
						t.Errorf("round %d: splitter %v %s", i, err, verdict(ret))
					}
					if path == pathStored {
						return f.armedTick(t), resp(i)
					}
					return req(i), resp(i)
				}, entry)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			name := f.h.Config.Services[svc].Name
			var sent, unsent, contested int
			for i, r := range res {
				switch {
				case r.rescue == redirect && r.state == reqAnsweredHedge:
					sent++
				case r.rescue == shot && r.state == 0:
					unsent++ // the response claimed it first; the rescuer saw ANSWERED and deleted it
				case r.rescue == shot && r.state == reqAnswered:
					unsent++
					contested++ // the rescuer read PENDING and lost the claim to the response
				default:
					t.Errorf("round %d: rescuer %s, response %s, entry %s: claimed twice (or not at all)",
						i, verdict(r.rescue), verdict(r.resp), stateNames[r.state])
				}
				if r.resp != unspec {
					t.Errorf("round %d: response %s, want passed (the first response of its request)", i, verdict(r.resp))
				}
			}
			answered := name + ".ClonesAnswered"
			if path == pathStored {
				answered = name + ".StoredAnswered"
			}
			t.Logf("%d rounds: %d hedged first, %d answered first (%d of them after the rescuer had read PENDING); counters %v",
				rounds, sent, unsent, contested, movedOnly(delta))
			// A round the machine held up past the far-overdue cutoff (50 ms) is dropped as
			// overdue, unsent as well.
			overdue := delta[name+".OverdueDropped"]
			if delta[name+".HedgesSent"] != int64(sent) || delta[answered]+overdue != int64(unsent) || delta[name+".Responses"] != int64(rounds) {
				t.Errorf("hedges_sent %d, %s %d + overdue_dropped %d, responses %d; want %d, %d, %d",
					delta[name+".HedgesSent"], answered, delta[answered], overdue, delta[name+".Responses"], sent, unsent, rounds)
			}
		})
	}
}

// movedOnly is the counters that moved.
func movedOnly(c bpftest.Counters) bpftest.Counters {
	out := bpftest.Counters{}
	for k, v := range c {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}
