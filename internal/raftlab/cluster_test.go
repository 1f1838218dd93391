package raftlab

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raft/offload"
)

var long = flag.Bool("raftlab.long", false, "longer fault runs (minutes)")

// nodeBinary is the kedge binary the lab's nodes run: KEDGE_RAFT_BINARY or this tree's.
func nodeBinary(t *testing.T) string {
	if b := os.Getenv("KEDGE_RAFT_BINARY"); b != "" {
		return b
	}
	return bpftest.KedgeBinary(t)
}

func upCluster(t *testing.T, name string, nodes int, unsafe bool) *Cluster {
	t.Helper()
	bpftest.RequireRoot(t)
	return upSpec(t, Spec{Name: name, Nodes: nodes, Binary: nodeBinary(t), UnsafeLocalReads: unsafe})
}

// upSpec brings spec's cluster up in a temporary directory; the test's end closes it (with
// the nodes' logs when the test failed).
func upSpec(t *testing.T, spec Spec) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec.Dir = t.TempDir()
	c, err := Up(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("cluster close: %v", err)
		}
		if t.Failed() {
			for _, n := range c.Nodes {
				if b, err := os.ReadFile(c.LogPath(n.ID)); err == nil {
					t.Logf("node %d log (last 2000 bytes):\n%s", n.ID, tail(b, 2000))
				}
			}
		}
	})
	return c
}

// requireOffload checks that every node runs the follower kernel path (docs/raft.md section
// 14, on by default) where this kernel has it: the fault runs then check it too.
func requireOffload(t *testing.T, c *Cluster) {
	t.Helper()
	if err := offload.Probe(); err != nil {
		t.Logf("nodes run without the kernel paths: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var modes []string
	for _, n := range c.Nodes {
		s, err := c.Status(ctx, n.ID)
		if err != nil {
			t.Fatal(err)
		}
		if s.Offload == "" {
			t.Fatalf("node %d runs without the follower kernel path (offload is on by default)", n.ID)
		}
		modes = append(modes, s.Offload)
	}
	t.Logf("offload: %v", modes)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// faultRun runs the workload for d with the nemesis injecting kinds, then checks the history.
func faultRun(t *testing.T, c *Cluster, kinds []string, d, period time.Duration, w Workload, name string) (Verdict, []FaultEvent, []Op, error) {
	t.Helper()
	h := NewHistory()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	evc := make(chan []FaultEvent, 1)
	errc := make(chan error, 1)
	go func() {
		ev, err := c.Nemesis(ctx, kinds, period, h)
		evc <- ev
		errc <- err
	}()
	c.Run(ctx, w, h)
	events, nerr := <-evc, <-errc
	if nerr != nil {
		t.Fatalf("nemesis: %v", nerr)
	}
	ops := h.Ops()
	dir := filepath.Join(os.Getenv("KEDGE_RAFTLAB_OUT"))
	if dir == "" {
		dir = t.TempDir()
	}
	v, err := Check(ops, 2*time.Minute, dir, name)
	return v, events, ops, err
}

func summary(ops []Op) (reads, writes, unknown int) {
	for _, o := range ops {
		switch {
		case o.Out.Unknown:
			unknown++
		case o.Kind == Get:
			reads++
		default:
			writes++
		}
	}
	return
}

func TestLinearizableUnderFaults(t *testing.T) {
	c := upCluster(t, "lz", 3, false)
	requireOffload(t, c)
	d, period := 6*time.Second, 800*time.Millisecond
	if *long {
		d, period = 60*time.Second, 2*time.Second
	}
	for _, run := range []struct {
		name  string
		kinds []string
	}{
		{"partitions", []string{"partition", "partition-leader", "oneway-leader"}},
		{"processes", []string{"kill", "kill-leader", "pause", "starve"}},
		{"network", []string{"net"}},
	} {
		t.Run(run.name, func(t *testing.T) {
			v, events, ops, err := faultRun(t, c, run.kinds, d, period, Workload{Clients: 4, Keys: 3, Timeout: 500 * time.Millisecond, KeyPrefix: run.name + "/"}, run.name)
			reads, writes, unknown := summary(ops)
			t.Logf("%s: %d ops (%d reads, %d writes acknowledged, %d unknown), %d faults %v, check %s in %v",
				run.name, len(ops), reads, writes, unknown, len(events), events, v.Result, v.Took)
			if err != nil {
				t.Fatal(err)
			}
			if reads < 20 || writes < 20 {
				t.Errorf("too little completed for the check to mean anything: %d reads, %d writes", reads, writes)
			}
			if len(events) == 0 {
				t.Error("no fault was injected")
			}
		})
	}
}

// The checker must catch the node's deliberately broken mode: reads served from local state
// without ReadIndex. A node cut off from the majority keeps answering reads with what it
// had, while the majority moves on.
func TestCheckerCatchesUnsafeLocalReads(t *testing.T) {
	for _, unsafe := range []bool{true, false} {
		name := map[bool]string{true: "unsafe", false: "safe"}[unsafe]
		t.Run(name, func(t *testing.T) {
			c := upCluster(t, "ul"+name[:1], 3, unsafe)
			st, err := c.Status(context.Background(), 1)
			if err != nil || st.UnsafeLocalReads != unsafe {
				t.Fatalf("node 1 status %+v (%v): want unsafe_local_reads %v", st, err, unsafe)
			}
			v, events, ops, err := faultRun(t, c, []string{"partition", "partition-leader"}, 6*time.Second, time.Second,
				Workload{Clients: 6, Keys: 2, Timeout: 500 * time.Millisecond}, "unsafe-reads")
			reads, writes, unknown := summary(ops)
			t.Logf("%d ops (%d reads, %d writes, %d unknown), faults %v: %s", len(ops), reads, writes, unknown, events, v.Result)
			if unsafe {
				if !errors.Is(err, ErrNotLinearizable) {
					t.Fatalf("broken reads not caught: %v", err)
				}
				if _, serr := os.Stat(v.HTML); serr != nil {
					t.Errorf("no visualization written: %v", serr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
