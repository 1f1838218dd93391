package sg

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/netnsx"
	isg "github.com/kedge-dev/kedge/internal/sg"
)

// nsSeq numbers this process's test namespaces: names are netnsx.OwnedName's (kedge-<owner>-...),
// unique per run, and `kedge cleanup` removes them once their owner is dead (SIGKILL).
var nsSeq atomic.Uint64

// loopbackGroup runs n reference workers (the last `dead` of them not started) on
// loopback in a fresh namespace and opens a group on lo.
func loopbackGroup(t *testing.T, n, dead int, cfg Config, wcfg isg.WorkerConfig) *Group {
	t.Helper()
	bpftest.RequireRoot(t)
	ns, err := netnsx.New(netnsx.OwnedName(fmt.Sprintf("sglo%d", nsSeq.Add(1))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := ns.LoopbackUp(); err != nil {
		t.Fatal(err)
	}
	var workers []netip.AddrPort
	for i := range n {
		workers = append(workers, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(19000+i)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	ready := make(chan struct{})
	wcfg.Listen = workers[:n-dead]
	go func() { errc <- ns.Do(func() error { return isg.RunWorkers(ctx, wcfg, nil, ready) }) }()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-errc })
	cfg.Interface, cfg.Netns, cfg.Workers = "lo", ns.Path(), workers
	g, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// scatterConcurrently sends each requests from each of goroutines goroutines and checks
// every result: complete, with the sum of the values each of the n workers sent.
func scatterConcurrently(t *testing.T, g *Group, n, elems, goroutines, each int) {
	t.Helper()
	var wg sync.WaitGroup
	for gr := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				res, err := g.Scatter(context.Background(), []byte{byte(gr), byte(k)})
				if err != nil {
					t.Errorf("scatter: %v", err)
					return
				}
				if res.Status != OK || res.Count != n || len(res.Answered) != n {
					t.Errorf("request %#x: status %v count %d", res.ID, res.Status, res.Count)
					continue
				}
				for j := range elems {
					var want int64
					for w := range n {
						want += isg.ValueFor(uint16(w), res.ID, j)
					}
					if res.Values[j] != want {
						t.Errorf("request %#x element %d: %d, want %d", res.ID, j, res.Values[j], want)
					}
				}
			}
		}()
	}
	wg.Wait()
}

// TestManyGoroutines checks every aggregate against the values each worker sent, with 64
// requests outstanding from 16 goroutines.
func TestManyGoroutines(t *testing.T) {
	const n, elems = 16, 3
	g := loopbackGroup(t, n, 0, Config{Reduction: Sum, Type: Int32, Elems: elems, Timeout: time.Second, InFlight: 64},
		isg.WorkerConfig{Type: isg.TypeI32, Elems: elems})
	scatterConcurrently(t, g, n, elems, 16, 40)
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Completed != 640 || st.Replies != 640*n || st.Copies != 640*n || st.Timeouts != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestManyGoroutinesResend: TestManyGoroutines with every worker losing 5% of the
// requests (seeded) and re-sends on (Resend 5 ms, up to 8 rounds): 64 requests outstanding
// from 16 goroutines, slots recycled under the stored requests' rounds, and every result
// complete with the sum of the values each worker sent; the losses are recovered by retries.
func TestManyGoroutinesResend(t *testing.T) {
	const n, elems, goroutines, each = 16, 3, 16, 40
	g := loopbackGroup(t, n, 0, Config{Reduction: Sum, Type: Int32, Elems: elems, Timeout: 2 * time.Second, InFlight: 64,
		Resend: 5 * time.Millisecond, MaxResends: 8, ResendBudget: ResendBudget{Ratio: 1, Burst: 4 * n}},
		isg.WorkerConfig{Type: isg.TypeI32, Elems: elems, Loss: 0.05, Seed: 11})
	scatterConcurrently(t, g, n, elems, goroutines, each)
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests: retries %d late replies %d refused %d errors %d", goroutines*each, st.Retries, st.LateReplies, st.ResendRefused, st.ResendErrors)
	if st.Completed != goroutines*each || st.Timeouts != 0 || st.Retries == 0 || st.Hedges != 0 || st.ResendErrors != 0 {
		t.Errorf("stats %+v", st)
	}
	// Every retry went out in a round, at most 8 rounds per request; no sample above an
	// estimate without a quantile.
	if st.ResendRounds == 0 || st.ResendRounds > st.Retries || st.ResendRounds > 8*goroutines*each || st.ResendCensored != 0 {
		t.Errorf("rounds %d censored %d for %d retries", st.ResendRounds, st.ResendCensored, st.Retries)
	}
	// No quantile: the delay is Resend; the bucket holds at most the burst plus one
	// request's deposit (1 x 16 copies).
	rs, err := g.ResendState()
	if err != nil {
		t.Fatal(err)
	}
	if rs.Delay != 5*time.Millisecond || rs.Estimate != 0 || rs.Budget < 0 || rs.Budget > 4*n+n {
		t.Errorf("re-send state %+v, want delay 5ms, no estimate, 0..%d copies", rs, 5*n)
	}
}

// TestResendStateEstimate: with a quantile the kernel's estimate follows the replies, and
// ResendState's delay is it clamped to [ResendMin, Resend], as resend_delay computes it.
func TestResendStateEstimate(t *testing.T) {
	const n, elems = 8, 1
	g := loopbackGroup(t, n, 0, Config{Reduction: Sum, Type: Int32, Elems: elems, Timeout: time.Second, InFlight: 8,
		Resend: 50 * time.Millisecond, ResendQuantile: 0.9, ResendMin: 10 * time.Millisecond},
		isg.WorkerConfig{Type: isg.TypeI32, Elems: elems, Seed: 3})
	scatterConcurrently(t, g, n, elems, 4, 10)
	rs, err := g.ResendState()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("re-send state %+v", rs)
	want := min(max(rs.Estimate, 10*time.Millisecond), 50*time.Millisecond)
	if rs.Estimate <= 0 || rs.Estimate > time.Second || rs.Delay != want {
		t.Errorf("re-send state %+v: want an estimate of the loopback replies and the delay %v", rs, want)
	}
}

// TestWakePaths: with WakeSocket every completed result is delivered by the reader that the
// passed completing reply woke on the coordinator socket (the ring does not wake anyone for
// it), by default by the ring's reader, with BusyPoll by the spinning reader; a timeout
// (no packet) is delivered by the ring's reader in both epoll modes. Nothing reaches the
// guard timer's fallback.
func TestWakePaths(t *testing.T) {
	const n, requests = 4, 50
	for _, c := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"socket", Config{WakeSocket: true}, bySocket},
		{"ring", Config{}, byRing},
		{"busypoll", Config{BusyPoll: true}, bySpin},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.Reduction, cfg.Type, cfg.Elems, cfg.Timeout, cfg.InFlight = Sum, Int64, 1, time.Second, 8
			g := loopbackGroup(t, n+1, 1, cfg, isg.WorkerConfig{Type: isg.TypeI64, Elems: 1})
			for range requests {
				res, err := g.ScatterWith(context.Background(), nil, RequestOptions{Need: n})
				if err != nil {
					t.Fatal(err)
				}
				if res.Status != OK || res.Count != n || res.Reader != readerNames[c.want] {
					t.Fatalf("request %#x: status %v, %d answered, reader %q", res.ID, res.Status, res.Count, res.Reader)
				}
			}
			// Every worker but the dead one: times out in the kernel, no packet. 500 ms for
			// the live ones to answer: with 20 ms an emulated matrix guest (5.10, busy host)
			// had 2 of 4 answered, and a busy host once failed here too.
			res, err := g.ScatterWith(context.Background(), nil, RequestOptions{Timeout: 500 * time.Millisecond})
			if err != nil || res.Status != Timeout || res.Count != n {
				t.Fatalf("timeout request: %+v, %v", res, err)
			}
			var got [wakeKinds]uint64
			for i := range got {
				got[i] = g.delivered[i].Load()
			}
			want := [wakeKinds]uint64{}
			want[c.want] = requests
			if c.want == bySpin {
				want[bySpin]++
			} else {
				want[byRing]++
			}
			if got != want {
				t.Errorf("delivered by socket/ring/spin/recover %v, want %v", got, want)
			}
		})
	}
}

// TestDeadWorkerTimesOut: the all-policy request expires in the kernel with the bitmap of
// the workers that answered and their partial aggregate; any-policy completes.
func TestDeadWorkerTimesOut(t *testing.T) {
	const n = 5
	g := loopbackGroup(t, n, 1, Config{Reduction: Max, Type: Int64, Elems: 2, Timeout: time.Second},
		isg.WorkerConfig{Type: isg.TypeI64, Elems: 2})
	res, err := g.Scatter(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != Timeout || res.Count != n-1 || len(res.Answered) != n-1 || res.Answered[n-2] != n-2 {
		t.Fatalf("result %+v", res)
	}
	if want := isg.ValueFor(n-2, res.ID, 1); res.Values[1] != want {
		t.Errorf("partial max %d, want %d", res.Values[1], want)
	}
	res, err = g.ScatterWith(context.Background(), nil, RequestOptions{Need: 1})
	if err != nil || res.Status != OK || res.Count != 1 {
		t.Fatalf("any: %+v %v", res, err)
	}
}

// TestGroupNeed: Config.Need is the group's policy for every request that does not set
// its own: 4 of 5 workers alive and Need 4 completes without waiting for the deadline;
// a request's own Need overrides it.
func TestGroupNeed(t *testing.T) {
	const n = 5
	g := loopbackGroup(t, n, 1, Config{Reduction: Sum, Type: Int64, Elems: 1, Need: n - 1, Timeout: 5 * time.Second},
		isg.WorkerConfig{Type: isg.TypeI64, Elems: 1})
	res, err := g.Scatter(context.Background(), nil)
	if err != nil || res.Status != OK || res.Count != n-1 || res.Need != n-1 {
		t.Fatalf("group need %d: %+v %v", n-1, res, err)
	}
	res, err = g.ScatterWith(context.Background(), nil, RequestOptions{Need: n, Timeout: 50 * time.Millisecond})
	if err != nil || res.Status != Timeout || res.Need != n {
		t.Fatalf("request need %d: %+v %v", n, res, err)
	}
}

// TestLossyDuplicatingWorkers: duplicates are dropped in the kernel, lost requests time out.
func TestLossyDuplicatingWorkers(t *testing.T) {
	const n = 8
	g := loopbackGroup(t, n, 0, Config{Reduction: Sum, Type: Int64, Elems: 1, Timeout: 200 * time.Millisecond},
		isg.WorkerConfig{Type: isg.TypeI64, Elems: 1, Loss: 0.05, Dup: 0.5, Seed: 1})
	var ok, timeouts int
	for range 60 {
		res, err := g.Scatter(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		for _, w := range res.Answered {
			want += isg.ValueFor(uint16(w), res.ID, 0)
		}
		if res.Values[0] != want {
			t.Errorf("request %#x: sum %d of %v, want %d", res.ID, res.Values[0], res.Answered, want)
		}
		if res.Status == OK {
			ok++
		} else {
			timeouts++
		}
	}
	st, _ := g.Stats()
	t.Logf("ok %d timeouts %d duplicates dropped %d late %d", ok, timeouts, st.Duplicates, st.Late)
	if st.Duplicates == 0 || timeouts == 0 || ok == 0 {
		t.Errorf("want duplicates dropped, some timeouts and some completions: %+v", st)
	}
}

// TestInFlightFail: with one slot and OnFull: Fail, concurrent requests fail at once with
// ErrInFlight while one is in flight (each holds the slot until its 300 ms timeout).
func TestInFlightFail(t *testing.T) {
	g := loopbackGroup(t, 2, 1, Config{Reduction: Count, Timeout: 300 * time.Millisecond, InFlight: 1, OnFull: Fail},
		isg.WorkerConfig{})
	var mu sync.Mutex
	var ok, full int
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				res, err := g.Scatter(context.Background(), nil)
				mu.Lock()
				switch {
				case errors.Is(err, ErrInFlight):
					full++
				case err == nil && res.Status == Timeout && res.Count == 1:
					ok++
				default:
					t.Errorf("result %+v err %v", res, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok == 0 || full == 0 {
		t.Fatalf("%d completed, %d refused: want both", ok, full)
	}
}

// TestRingFull: when the result ring buffer is full (the reader fell behind), a completed
// request's result is not lost: it stays in its slot (counted ringbuf_full) and Scatter
// reads it from there when its guard timer fires, with the right aggregate. Afterwards
// the reader catches up and results flow through the ring again.
func TestRingFull(t *testing.T) {
	const n, elems = 2, 2
	g := loopbackGroup(t, n, 0, Config{Reduction: Sum, Type: Int64, Elems: elems, Timeout: 50 * time.Millisecond, InFlight: 4},
		isg.WorkerConfig{Type: isg.TypeI64, Elems: elems})
	check := func(res Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != OK || res.Count != n {
			t.Fatalf("result %+v", res)
		}
		for j := range elems {
			want := isg.ValueFor(0, res.ID, j) + isg.ValueFor(1, res.ID, j)
			if res.Values[j] != want {
				t.Fatalf("request %#x element %d: %d, want %d", res.ID, j, res.Values[j], want)
			}
		}
	}
	// The reader parks after delivering this one.
	g.holdReads.Store(true)
	check(g.Scatter(context.Background(), []byte("before")))

	// Fill the ring: expire slots the group does not use, again and again, through
	// sg_sweep (each expiry emits a 2.4 KiB result; the group owns slots 0-3).
	for round := 0; ; round++ {
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.RingbufFull > 0 {
			break
		}
		if round == 10 {
			t.Fatalf("ring never full: %+v", st)
		}
		for slot := uint32(4); slot < isg.Slots; slot++ {
			var s isg.SlotRec
			s.State = isg.SlotPending
			s.Res.ReqId = uint64(round+1)<<10 | uint64(slot)
			s.Res.Slot = uint16(slot)
			s.Res.Group = g.cfg.Group
			if err := g.objs.Slots.Put(slot, &s); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := g.objs.RunSweep(); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := g.Stats()
	start := time.Now()
	res, err := g.Scatter(context.Background(), []byte("full"))
	check(res, err)
	after, _ := g.Stats()
	if after.RingbufFull <= before.RingbufFull || after.Completed != before.Completed+1 {
		t.Errorf("ringbuf_full %d -> %d, completed %d -> %d: want the completion counted as not emitted",
			before.RingbufFull, after.RingbufFull, before.Completed, after.Completed)
	}
	t.Logf("result read from its slot after %v (guard: timeout x 1.5 + 50 ms)", time.Since(start).Round(time.Millisecond))

	// The reader catches up (the strays are dropped) and the ring delivers again.
	g.holdReads.Store(false)
	for deadline := time.Now().Add(10 * time.Second); g.ring.Available() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reader did not drain the ring: %d bytes left", g.ring.Available())
		}
	}
	for range 3 {
		res, err := g.Scatter(context.Background(), []byte("after"))
		check(res, err)
	}
	if st, _ := g.Stats(); st.RingbufFull != after.RingbufFull {
		t.Errorf("ringbuf_full grew after the reader caught up: %d -> %d", after.RingbufFull, st.RingbufFull)
	}
}

// TestLoopbackBatches: a fan-out above the scatter's batch on lo (generic XDP, the
// loopback's own backlog) is handed on through lo's egress (a packet redirected to lo's
// ingress loses its route, and 127.0.0.1 without one is martian on input) and completes
// with every worker.
func TestLoopbackBatches(t *testing.T) {
	const n = 150
	g := loopbackGroup(t, n, 0, Config{Reduction: Sum, Type: Int64, Elems: 1, Timeout: time.Second, InFlight: 4},
		isg.WorkerConfig{Type: isg.TypeI64, Elems: 1})
	for range 10 {
		res, err := g.Scatter(context.Background(), []byte("lo"))
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		for w := range n {
			want += isg.ValueFor(uint16(w), res.ID, 0)
		}
		if res.Status != OK || res.Count != n || res.Values[0] != want {
			st, _ := g.Stats()
			t.Fatalf("request %#x: status %v, %d of %d answered, sum %v want %d; counters %+v", res.ID, res.Status, res.Count, n, res.Values, want, st)
		}
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(10 * (isg.BatchRuns(n, isg.DefaultFirstBatch, isg.DefaultBatch) - 1)); st.Continued != want || st.Copies != 10*n {
		t.Errorf("continued %d copies %d, want %d and %d", st.Continued, st.Copies, want, 10*n)
	}
}

// TestGuardWaitsForClaimedResult: a reader that claimed a result and is starved before it
// hands it over (issue 11: TestLabMultiPacket lost a result on a machine at load 7-12)
// must not make the waiting Scatter's guard call the result lost: the result is in flight
// to it. The reader is held between claim and hand-over until the guard has fired and
// either given up (the bug: ErrLost) or chosen to wait for the reader.
func TestGuardWaitsForClaimedResult(t *testing.T) {
	const n, elems = 2, 2
	g := loopbackGroup(t, n, 0, Config{Reduction: Sum, Type: Int64, Elems: elems, Timeout: 20 * time.Millisecond},
		isg.WorkerConfig{Type: isg.TypeI64, Elems: elems})
	type out struct {
		res Result
		err error
	}
	done := make(chan out, 1)
	held, returned := make(chan struct{}), make(chan struct{})
	var once sync.Once
	g.afterClaim = func() {
		once.Do(func() {
			close(held)
			for g.inFlightWaits.Load() == 0 {
				select {
				case <-returned:
					return
				case <-time.After(time.Millisecond):
				}
			}
		})
	}
	go func() {
		res, err := g.Scatter(context.Background(), []byte("starved"))
		close(returned)
		done <- out{res, err}
	}()
	<-held
	o := <-done
	if o.err != nil {
		t.Fatalf("result claimed by a starved reader reported as %v", o.err)
	}
	// Completed or timed out (a loaded machine): either way the aggregate of who answered.
	if g.inFlightWaits.Load() != 1 || o.res.Count != len(o.res.Answered) {
		t.Fatalf("result %+v, in-flight waits %d", o.res, g.inFlightWaits.Load())
	}
	for j := range elems {
		var want int64
		for _, w := range o.res.Answered {
			want += isg.ValueFor(uint16(w), o.res.ID, j)
		}
		if o.res.Values[j] != want {
			t.Fatalf("element %d: %d, want %d (answered %v)", j, o.res.Values[j], want, o.res.Answered)
		}
	}
	if _, err := g.Scatter(context.Background(), []byte("after")); err != nil { // the slot was freed
		t.Fatalf("next request: %v", err)
	}
}
