package raftlab

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
)

// TestStalledFollowerStopsAnswering: a follower whose disk stalls (the lab's disk-stall
// fault: its fsyncs take hundreds of milliseconds) stops answering heartbeats for itself
// in XDP within the alive bound of its persist/apply loop's last pass (docs/raft.md, Kernel
// paths: follower): the leader, which keeps hearing it while the loop runs, hears nothing
// from it from the alive bound after a stuck save began until the save returns. Each such
// save is in the follower's election record (api.EventSlowSave: its start and length, and
// the alive bound in force when it began: the default bound adapts to the CPU wait of the
// node's threads, kernelpaths.MaxAdaptiveBound at most, and is judged as it stood).
func TestStalledFollowerStopsAnswering(t *testing.T) {
	if err := offload.Probe(); err != nil {
		t.Skipf("the follower kernel path does not run on this kernel: %v", err)
	}
	bpftest.RequireRoot(t)
	// Each node on a disk of its own: the stall is the follower's alone.
	c := upSpec(t, Spec{Name: "stall", Nodes: 3, Binary: nodeBinary(t), NodeDisks: true})
	requireOffload(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const (
		alive = offload.MinBound // the lab's nodes: 10 ms ticks, 100 ms election timeout: the adaptive bound's floor
		// slack covers the leader's receipt of the last answer and this test's reading of
		// the leader's record (an HTTP round trip through the lab's fabric).
		slack = 30 * time.Millisecond
		// readSpan: only readings whose request and answer lie at most this far apart are
		// judged. The leader takes the age somewhere in between, so a reading (answer - age)
		// puts the last word late by up to its span: on a loaded machine, with the adaptive
		// bound at 1 s, spans of 50 ms made a word at the bound look 50 ms past it.
		readSpan = 15 * time.Millisecond
		// Each stalled fsync: two writes or more, 1 s apart: past the adaptive bound's
		// ceiling (kernelpaths.MaxAdaptiveBound), to which a busy machine raises it.
		iops = 1
	)
	var (
		fol     int
		stallAt time.Duration
		during  []sample
	)
	// An election of the machine's making (a busy machine can delay a heartbeat past the
	// timeout) is not the stall's: the run is tried again, up to three times.
	for try := 1; ; try++ {
		var err error
		fol, stallAt, during, err = stallRun(ctx, t, c, alive, iops)
		if err == nil {
			break
		}
		if try == 3 {
			t.Fatalf("try %d: %v", try, err)
		}
		t.Logf("try %d: %v; again", try, err)
	}
	evs, err := c.status.Events(ctx, c.Node(fol).ClientAddr.String(), int64(stallAt))
	if err != nil {
		t.Fatal(err)
	}
	var saves []api.Event
	for _, e := range evs.Events {
		if e.Kind == api.EventSlowSave {
			saves = append(saves, e)
		}
	}
	// Each save long enough to see the silence: after its start plus the alive bound (and
	// the slack) until it returned, the leader's last word from the follower is no later
	// than that point.
	var stops []float64
	var bounds []string
	for _, e := range saves {
		inForce := time.Duration(e.BoundNs)
		if inForce < alive || inForce > kernelpaths.MaxAdaptiveBound {
			t.Errorf("a slow save's alive bound in force %v, want from the floor %v to the ceiling %v", inForce, alive, kernelpaths.MaxAdaptiveBound)
			continue
		}
		bounds = append(bounds, inForce.Round(time.Millisecond).String())
		start, end := time.Duration(e.AtNs), time.Duration(e.AtNs+e.SaveNs)
		bound := start + inForce + slack
		if end-bound < 20*time.Millisecond {
			continue
		}
		var last, at time.Duration
		for _, s := range during {
			if s.req >= bound && s.resp <= end && s.resp-s.req <= readSpan && s.heard > last {
				last, at = s.heard, s.resp
			}
		}
		if last == 0 {
			continue // no poll in the window, or none answered within readSpan
		}
		stops = append(stops, float64(last-start)/1e6)
		if last > bound {
			t.Errorf("follower %d's save took %v; %v after it began the leader had last heard from it %v after it began (the alive bound is %v)",
				fol, time.Duration(e.SaveNs), at-start, last-start, inForce)
		}
	}
	var took []string
	for _, e := range saves {
		took = append(took, time.Duration(e.SaveNs).Round(time.Millisecond).String())
	}
	t.Logf("follower %d stalled at %d writes/s: %d slow saves (%v); the leader's last word from it, ms after a stuck save began: %v (alive bound in force %v)",
		fol, iops, len(saves), took, stops, bounds)
	if len(stops) < 2 {
		t.Fatalf("%d stuck saves long enough to judge (want at least 2): the stall did not hold the follower's loop (slow saves %v)", len(stops), took)
	}
}

// sample is the leader's record of a follower, polled: when it last heard from it
// (CLOCK_MONOTONIC, as late as the poll's answer allows).
type sample struct{ req, resp, heard time.Duration }

// stallRun stalls a follower's disk for 9 s while 4 writers put to the leader, polling the
// leader's record of it; an error says the run cannot be judged (the leader changed, or
// did not hear the follower before the stall).
func stallRun(ctx context.Context, t *testing.T, c *Cluster, alive time.Duration, iops int) (fol int, stallAt time.Duration, during []sample, err error) {
	leader, err := c.WaitLeader(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	fol = leader%3 + 1
	// Writers keep every node fsyncing: the stalled follower's loop is held in its save.
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopWriters(); wg.Wait() }()
	for i := range 4 {
		w, err := c.NewWriter([]int{leader}, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Close()
			for j := 0; wctx.Err() == nil; j++ {
				w.Put(wctx, fmt.Sprintf("stall/%d", i), fmt.Sprint(j))
			}
		}()
	}
	poll := func(d time.Duration) ([]sample, error) {
		var out []sample
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			req := offload.Monotonic()
			st, err := c.Status(ctx, leader)
			resp := offload.Monotonic()
			if err != nil || st.State != "leader" {
				return nil, fmt.Errorf("leader %d: %s, %v", leader, st.State, err)
			}
			for _, p := range st.Peers {
				if int(p.ID) == fol && p.LastHeardMs != nil {
					out = append(out, sample{req, resp, resp - time.Duration(*p.LastHeardMs*float64(time.Millisecond))})
				}
			}
		}
		return out, nil
	}
	before, err := poll(500 * time.Millisecond)
	if err != nil {
		return 0, 0, nil, err
	}
	if len(before) == 0 {
		return 0, 0, nil, fmt.Errorf("leader %d has no record of follower %d", leader, fol)
	}
	for _, s := range before {
		if age := s.resp - s.heard; age > alive {
			return 0, 0, nil, fmt.Errorf("before the stall the leader last heard from follower %d %v before asking (want under the alive bound %v)", fol, age, alive)
		}
	}
	stallAt = offload.Monotonic()
	st, err := c.StallDisk(fol, iops)
	if err != nil {
		t.Fatal(err)
	}
	during, err = poll(9 * time.Second)
	if serr := st.Stop(); serr != nil {
		t.Fatal(serr)
	}
	return fol, stallAt, during, err
}
