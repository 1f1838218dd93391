package raftbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// The clusters a benchmark runs on: brought up per mode, a stable leader found, nodes restarted.

func (o *Options) cluster(ctx context.Context, name string, nodes, electionTicks int, mode string) (*raftlab.Cluster, error) {
	name += mode
	dir := filepath.Join(o.Dir, name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	uctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	spec := raftlab.Spec{Name: name, Nodes: nodes, Binary: o.Binary, Dir: dir,
		Tick: o.Tick, ElectionTicks: electionTicks, HeartbeatTicks: o.HeartbeatTicks, Args: o.modeArgs(mode), ClusterKey: o.ClusterKey,
		DiskNodes: o.diskNodes()}
	if mode == ModeEtcd {
		spec.Server, spec.ClusterKey, spec.HeartbeatTicks = raftlab.ServerEtcd, "", 0
	}
	c, err := raftlab.Up(uctx, spec)
	for try := 2; err != nil && try <= startTries && uctx.Err() == nil; try++ {
		// A node that cannot start its kernel paths exits (mode on asks for them explicitly);
		// the pacer's calibration fails now and then on a loaded machine: try again.
		o.logf("cluster %s (offload %s) did not come up (%v); attempt %d of %d", name, mode, err, try, startTries)
		if err = os.RemoveAll(dir); err == nil {
			c, err = raftlab.Up(uctx, spec)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cluster %s (offload %s): %w", name, mode, err)
	}
	for _, n := range c.Nodes {
		st, err := c.Status(uctx, n.ID)
		if err == nil && (st.Offload != "") != kernelPaths(mode) {
			err = fmt.Errorf("node %d reports offload %q", n.ID, st.Offload)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("cluster %s (offload %s): %w", name, mode, err), c.Close())
		}
	}
	if mode == ModeXDPPass {
		if err := attachPass(c); err != nil {
			return nil, errors.Join(fmt.Errorf("cluster %s (offload %s): %w", name, mode, err), c.Close())
		}
	}
	return c, nil
}

// attachPass attaches an XDP_PASS program to every node's interface of c, generic (skb)
// mode as the follower program takes on a veth (internal/raft/offload); detached when c
// closes (or when this process dies: the bench holds the links).
func attachPass(c *raftlab.Cluster) error {
	for _, n := range c.Nodes {
		ifindex, err := bpfx.IfIndex(n.Host.Handle, n.Host.Iface)
		if err != nil {
			return err
		}
		a, err := bpfx.AttachXDPPassMode(n.Host.Handle, ifindex, bpfx.XDPGeneric)
		if err != nil {
			return fmt.Errorf("node %d: %w", n.ID, err)
		}
		c.OnClose(a.Close)
	}
	return nil
}

// stallNode is the node a stress-disk run stalls: the last one, the only one on a disk of
// its own (diskNodes); a run that finds it leading moves the leadership (moveLeader).
func (o *Options) stallNode() int { return o.Nodes }

// diskNodes are the nodes with a disk of their own: in a run with the disk-stall fault among
// its phases, the node it stalls (ext4 on a loop device: its throttled writes hold up no
// other node's fsyncs, as they would through a shared journal). The other nodes' data stay
// on the lab directory's filesystem, each in its own directory, where a loop device's
// kernel threads add no latency under the runs' CPU stress (raftlab.Spec.DiskNodes). Both
// systems get the same placement.
func (o *Options) diskNodes() []int {
	if slices.Contains(o.Scenarios, "false-elections") && slices.Contains(o.FalsePhases, "stress-disk") {
		return []int{o.stallNode()}
	}
	return nil
}

// moveLeader makes a node other than id lead: if id leads, it is killed until another node
// leads and started again (neither system here has a leader transfer the harness can ask
// for, so both get the same treatment). It returns the stable leader.
func (o *Options) moveLeader(ctx context.Context, c *raftlab.Cluster, id int) (int, error) {
	for try := 1; ; try++ {
		leader, err := stableLeader(ctx, c)
		if err != nil || leader != id {
			return leader, err
		}
		if try > startTries {
			return 0, fmt.Errorf("node %d still leads after %d restarts", id, startTries)
		}
		o.logf("node %d (the one to stall) leads: restarting it so that another node leads", id)
		if err := c.Kill(id); err != nil {
			return 0, err
		}
		others := make([]int, 0, len(c.Nodes)-1)
		for _, n := range c.Nodes {
			if n.ID != id {
				others = append(others, n.ID)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err = c.WaitLeader(wctx, others)
		cancel()
		if err != nil {
			return 0, err
		}
		if err := o.restart(ctx, c, id); err != nil {
			return 0, err
		}
	}
}

// clusters starts one cluster per mode; on error the ones already up are closed.
func (o *Options) clusters(ctx context.Context, name string, nodes, electionTicks int) (map[string]*raftlab.Cluster, func() error, error) {
	cs := map[string]*raftlab.Cluster{}
	closeAll := func() error {
		var errs []error
		for _, c := range cs {
			errs = append(errs, c.Close())
		}
		return errors.Join(errs...)
	}
	for _, mode := range o.Modes {
		c, err := o.cluster(ctx, name, nodes, electionTicks, mode)
		if err != nil {
			return nil, nil, errors.Join(err, closeAll())
		}
		cs[mode] = c
	}
	return cs, closeAll, nil
}

// stableLeader waits until every running node names the same leader and has applied
// what the leader committed.
func stableLeader(ctx context.Context, c *raftlab.Cluster) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		var leader int
		var commit uint64
		ok := true
		for _, n := range c.Nodes {
			st, err := c.Status(ctx, n.ID)
			if err != nil {
				ok = false
				break
			}
			if st.State == "leader" {
				leader, commit = int(st.ID), st.Commit
			}
		}
		if ok && leader != 0 {
			for _, n := range c.Nodes {
				st, err := c.Status(ctx, n.ID)
				if err != nil || int(st.Leader) != leader || st.Applied < commit {
					ok = false
				}
			}
			if ok {
				return leader, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("cluster not stable: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the cluster's state
		}
	}
}

// startTries bounds the attempts to start a cluster or restart a node.
const startTries = 3

// restart starts node id again and waits until it answers; a node that exits at start (its
// kernel paths could not start) is started again, up to startTries times in all.
func (o *Options) restart(ctx context.Context, c *raftlab.Cluster, id int) error {
	var err error
	for try := 1; try <= startTries; try++ {
		if err = c.Start(id); err != nil {
			return err
		}
		if err = c.WaitReady(ctx, id); err == nil || ctx.Err() != nil || c.Running(id) {
			return err
		}
		o.logf("node %d exited at start (%v); attempt %d of %d", id, err, try+1, startTries)
		if kerr := c.Kill(id); kerr != nil { // forget the exited process, remove what it left
			return errors.Join(err, kerr)
		}
	}
	return err
}
