package raftlab

import (
	"context"
	"fmt"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// Wedged is one wedged-leader trial: the leader's process stopped (SIGSTOP: alive, sockets
// open, nothing renewed), the time until another node leads in a higher term, then the time
// until the resumed old leader has stepped down.
type Wedged struct {
	OldLeader int           `json:"old_leader"`
	OldTerm   uint64        `json:"old_term"`
	NewLeader int           `json:"new_leader"`
	NewTerm   uint64        `json:"new_term"`
	Replaced  time.Duration `json:"replaced_ns"`  // SIGSTOP -> a new leader answers /v1/status
	StepDown  time.Duration `json:"step_down_ns"` // SIGCONT -> the old leader no longer leads
	Polls     int           `json:"polls"`        // status rounds while waiting
}

// WaitKernelHeartbeats waits until node id, as leader, has left heartbeats to the kernel
// (kedge_raft_heartbeats_kernel_total moved: its lease is running and its followers are
// handed over). A wedged-leader trial on nodes with --kernel-heartbeats starts after it;
// otherwise the leader may be stopped before its first renewal.
func (c *Cluster) WaitKernelHeartbeats(ctx context.Context, id int) error {
	for {
		v, err := c.status.Metric(ctx, c.Node(id).ClientAddr.String(), "kedge_raft_heartbeats_kernel_total")
		if err == nil && v > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d sends no heartbeats from the kernel (is it leader, with --kernel-heartbeats?): %w", id, ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the node's metrics
		}
	}
}

// WedgedLeader runs one trial: it stops the current leader, polls the other nodes every
// poll (default 5ms) until one leads in a higher term (or ctx ends), resumes the old leader
// and waits until it steps down. With kernel heartbeats on, the replacement takes the
// lease plus an election timeout; without, an election timeout. The caller gets a cluster
// with a leader again (the old one resumed as a follower).
func (c *Cluster) WedgedLeader(ctx context.Context, poll time.Duration) (Wedged, error) {
	if poll <= 0 {
		poll = 5 * time.Millisecond
	}
	var w Wedged
	id, term := c.Leader(ctx, nil)
	if id == 0 {
		return w, fmt.Errorf("wedged leader: no leader to stop")
	}
	w.OldLeader, w.OldTerm = id, term
	pid := c.PID(id)
	if pid == 0 {
		return w, fmt.Errorf("wedged leader: node %d is not running", id)
	}
	var others []int
	for _, n := range c.Nodes {
		if n.ID != id {
			others = append(others, n.ID)
		}
	}
	start := time.Now()
	if err := lab.Pause(pid); err != nil {
		return w, err
	}
	resumed := false
	resume := func() error {
		if resumed {
			return nil
		}
		resumed = true
		return lab.Resume(pid)
	}
	defer resume()
	for {
		w.Polls++
		if nid, nterm := c.Leader(ctx, others); nid != 0 && nterm > term {
			w.Replaced = time.Since(start)
			w.NewLeader, w.NewTerm = nid, nterm
			break
		}
		select {
		case <-ctx.Done():
			return w, fmt.Errorf("wedged leader %d: no other node led within %v: %w", id, time.Since(start).Round(time.Millisecond), ctx.Err())
		case <-time.After(poll): // polling the nodes' state
		}
	}
	resumedAt := time.Now()
	if err := resume(); err != nil {
		return w, err
	}
	for {
		st, err := c.Status(ctx, id)
		if err == nil && (st.State != "leader" || st.Term > term) {
			w.StepDown = time.Since(resumedAt)
			return w, nil
		}
		select {
		case <-ctx.Done():
			return w, fmt.Errorf("wedged leader %d resumed but still leads term %d: %w", id, term, ctx.Err())
		case <-time.After(poll): // polling the node's state
		}
	}
}
