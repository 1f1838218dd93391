package raftlab

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/offload"
)

// TestStalledFollowerStopsAnswering: a follower whose disk stalls (the lab's disk-stall
// fault: its fsyncs take hundreds of milliseconds) stops answering heartbeats for itself
// in XDP within the alive bound of its persist/apply loop's last pass (docs/raft.md, Kernel
// paths: follower): the leader, which keeps hearing it while the loop runs, hears nothing
// from it from the alive bound after a stuck save began until the save returns. Each such
// save is in the follower's election record (api.EventSlowSave: its start and length).
func TestStalledFollowerStopsAnswering(t *testing.T) {
	if err := offload.Probe(); err != nil {
		t.Skipf("the follower kernel path does not run on this kernel: %v", err)
	}
	c := upCluster(t, "stall", 3, false)
	requireOffload(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.WaitLeader(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	fol := leader%3 + 1
	const (
		alive = offload.MinBound // the lab's nodes: 10 ms ticks, 100 ms election timeout
		// slack covers the leader's receipt of the last answer and this test's reading of
		// the leader's record (an HTTP round trip through the lab's fabric).
		slack = 30 * time.Millisecond
		iops  = 5 // each stalled fsync: two writes or more, 200 ms apart
	)
	// Writers keep every node fsyncing: the stalled follower's loop is held in its save.
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
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
	defer func() { stopWriters(); wg.Wait() }()

	// The leader's record of the follower, polled: when it last heard from it (CLOCK_MONOTONIC,
	// as late as the poll's answer allows).
	type sample struct{ req, resp, heard time.Duration }
	poll := func(d time.Duration) []sample {
		var out []sample
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			req := offload.Monotonic()
			st, err := c.Status(ctx, leader)
			resp := offload.Monotonic()
			if err != nil || st.State != "leader" {
				t.Fatalf("leader %d: %+v, %v (the stall of a follower must not move the leader)", leader, st.State, err)
			}
			for _, p := range st.Peers {
				if int(p.ID) == fol && p.LastHeardMs != nil {
					out = append(out, sample{req, resp, resp - time.Duration(*p.LastHeardMs*float64(time.Millisecond))})
				}
			}
		}
		return out
	}
	before := poll(500 * time.Millisecond)
	if len(before) == 0 {
		t.Fatalf("leader %d has no record of follower %d", leader, fol)
	}
	for _, s := range before {
		if age := s.resp - s.heard; age > alive {
			t.Fatalf("before the stall the leader last heard from follower %d %v before asking (want under the alive bound %v)", fol, age, alive)
		}
	}
	stallAt := offload.Monotonic()
	st, err := c.StallDisk(fol, iops)
	if err != nil {
		t.Fatal(err)
	}
	during := poll(3 * time.Second)
	if err := st.Stop(); err != nil {
		t.Fatal(err)
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
	for _, e := range saves {
		start, end := time.Duration(e.AtNs), time.Duration(e.AtNs+e.SaveNs)
		bound := start + alive + slack
		if end-bound < 20*time.Millisecond {
			continue
		}
		var last, at time.Duration
		for _, s := range during {
			if s.req >= bound && s.resp <= end && s.heard > last {
				last, at = s.heard, s.resp
			}
		}
		if last == 0 {
			continue // no poll in the window
		}
		stops = append(stops, float64(last-start)/1e6)
		if last > bound {
			t.Errorf("follower %d's save took %v; %v after it began the leader had last heard from it %v after it began (the alive bound is %v)",
				fol, time.Duration(e.SaveNs), at-start, last-start, alive)
		}
	}
	var took []string
	for _, e := range saves {
		took = append(took, time.Duration(e.SaveNs).Round(time.Millisecond).String())
	}
	t.Logf("follower %d stalled at %d writes/s: %d slow saves (%v); the leader's last word from it, ms after a stuck save began: %v (alive bound %v)",
		fol, iops, len(saves), took, stops, alive)
	if len(stops) < 2 {
		t.Fatalf("%d stuck saves long enough to judge (want at least 2): the stall did not hold the follower's loop (slow saves %v)", len(stops), took)
	}
}
