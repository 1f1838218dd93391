package raftlab

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestEtcdPeer runs the benchmark's peer: an etcd cluster in the same lab as kedge's, its
// status read in kedge's form, written to by etcd's Go client to the leader and spread over
// every node, and a new leader of a higher term taking writes after kill -9 of the old one.
func TestEtcdPeer(t *testing.T) {
	bpftest.RequireRoot(t)
	if err := checkEtcd(); err != nil {
		if bpftest.InGuest() {
			t.Skipf("needs Debian's etcd-server; matrix guests have busybox only (the host runs this test): %v", err)
		}
		t.Fatal(err) // scripts/deps.sh installs it
	}
	// On disks of their own, as the benchmark's stress-disk runs put them (and kedge's).
	c := upSpec(t, Spec{Name: "rletcd", Nodes: 3, Server: ServerEtcd, NodeDisks: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leader, term := c.Leader(ctx, nil)
	if leader == 0 || term == 0 {
		t.Fatalf("no leader after Up: %d, term %d", leader, term)
	}
	for _, n := range c.Nodes {
		st, err := c.Status(ctx, n.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader != uint64(leader) || (st.State == "leader") != (n.ID == leader) {
			t.Fatalf("node %d: state %s, leader %d; want leader %d", n.ID, st.State, st.Leader, leader)
		}
	}
	var all, survivors []int
	for _, n := range c.Nodes {
		all = append(all, n.ID)
		if n.ID != leader {
			survivors = append(survivors, n.ID)
		}
	}
	put := func(w Writer, key string) error {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		_, err := w.Put(pctx, key, "v")
		return err
	}
	for _, ids := range [][]int{{leader}, all} {
		w, err := c.NewWriter(ids, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 6 { // twice round the nodes when spread
			if err := put(w, fmt.Sprintf("k%d", i)); err != nil {
				t.Fatalf("put through %v: %v", ids, err)
			}
		}
		w.Close()
	}
	// The disk-stall fault on a follower (the lab's TestStallDisk times its effect): the
	// node is in its stall cgroup until unstall, and a kill ends the stall too.
	sup := NewSupervisor(c)
	for _, req := range []Request{{Op: "stall", Node: survivors[0]}, {Op: "unstall", Node: survivors[0]}, {Op: "stall", Node: survivors[1], WriteIOPS: 50}} {
		msg, err := sup.do(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", req.Op, err)
		}
		t.Log(msg)
		if got, want := sup.info(ctx, false).Nodes[req.Node-1].Stalled, req.Op == "stall"; got != want {
			t.Fatalf("after %s node %d: stalled %v", req.Op, req.Node, got)
		}
	}
	if _, err := sup.do(ctx, Request{Op: "unstall", Node: survivors[0]}); err == nil {
		t.Fatal("unstall of a node that is not stalled: no error")
	}
	cg := sup.stalled[survivors[1]].Cgroup
	if got, want := sup.stalled[survivors[1]].Device, c.Disk(survivors[1]).Dev; got != want {
		t.Fatalf("node %d's stall throttles %s, want its own disk %s", survivors[1], got, want)
	}
	w, err := c.NewWriter([]int{leader}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := put(w, "stalled"); err != nil {
		t.Fatalf("put with a follower's disk stalled: %v", err)
	}
	w.Close()
	if _, err := sup.do(ctx, Request{Op: "kill", Node: survivors[1]}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Fatalf("stall cgroup %s left after the node was killed (%v)", cg, err)
	}
	if err := c.Start(survivors[1]); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, survivors[1]); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx, leader)
	if err != nil {
		t.Fatal(err)
	}
	if st.Commit < 12 {
		t.Fatalf("leader's commit index %d after 12 writes", st.Commit)
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	w, err = c.NewWriter(survivors, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	deadline := time.Now().Add(20 * time.Second)
	for err = put(w, "after"); err != nil; err = put(w, "after") {
		if time.Now().After(deadline) {
			t.Fatalf("no write acknowledged by the survivors %v: %v", survivors, err)
		}
		time.Sleep(10 * time.Millisecond) // pacing the retries while the survivors elect
	}
	nl, nterm := c.Leader(ctx, survivors)
	if nl == 0 || nl == leader || nterm <= term {
		t.Fatalf("after the kill: leader %d of term %d (before: %d of term %d)", nl, nterm, leader, term)
	}
}
