package raftlab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestNodeDisks: with Spec.NodeDisks every node's data directory is on a loop device of
// its own, seen only from the node's mount namespace; a node killed and started again finds
// its log there; the disk-stall fault throttles the stalled node's device; Close leaves no
// backing file.
func TestNodeDisks(t *testing.T) {
	ctx := requireLoop(t)
	spec := Spec{Name: "rldisk", Nodes: 3, Binary: nodeBinary(t), NodeDisks: true, Dir: t.TempDir()}
	c, closed := upDisks(ctx, t, spec)
	devs := map[string]bool{}
	for _, n := range c.Nodes {
		_, dev := dataDev(t, c, n.ID)
		if d := c.Disk(n.ID); d == nil || dev != d.Dev || devs[dev] {
			t.Fatalf("node %d's data on device %s, want its own disk (%+v)", n.ID, dev, d)
		}
		devs[dev] = true
	}
	if entries, err := os.ReadDir(c.disksDir()); err != nil || len(entries) != 0 {
		t.Fatalf("the harness sees %v in %s (%v): want it empty, the disks are mounted in the nodes' namespaces only", entries, c.disksDir(), err)
	}
	w, err := c.NewWriter([]int{1, 2, 3}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 20 {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := w.Put(pctx, fmt.Sprintf("k%d", i), "v")
		pcancel()
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	leader, _ := c.Leader(ctx, nil)
	fol := leader%3 + 1
	before, err := c.Status(ctx, fol)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(fol); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(fol); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, fol); err != nil {
		t.Fatal(err)
	}
	// Restarted from its log, the node knows the term it had (a fresh one starts at 0 and
	// learns the term from the leader only with the log it is sent).
	after, err := c.Status(ctx, fol)
	if err != nil {
		t.Fatal(err)
	}
	if after.Term < before.Term || after.Applied < before.Applied && after.Term == 0 {
		t.Fatalf("node %d after a restart: term %d applied %d, before term %d applied %d", fol, after.Term, after.Applied, before.Term, before.Applied)
	}
	log, _ := os.ReadFile(c.LogPath(fol))
	if !strings.Contains(string(log), "raft: restarting") {
		t.Fatalf("node %d did not restart from its data directory:\n%s", fol, log)
	}
	s, err := c.StallDisk(fol, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Device != c.Disk(fol).Dev {
		t.Errorf("the stall of node %d throttles %s, want its disk %s", fol, s.Device, c.Disk(fol).Dev)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, n := range c.Nodes {
		files = append(files, c.Disk(n.ID).File)
	}
	*closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("disk file %s left after Close (%v)", f, err)
		}
	}
}

// TestDiskNodes: with Spec.DiskNodes only the nodes named have a disk of their own; the
// others' data directories are on the filesystem of Spec.Dir, and the stall of a node with a
// disk throttles its disk. A node outside the cluster is refused before anything is made.
func TestDiskNodes(t *testing.T) {
	ctx := requireLoop(t)
	if _, err := Up(ctx, Spec{Name: "rldn", Nodes: 3, Binary: nodeBinary(t), DiskNodes: []int{4}, Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "disk of node 4") {
		t.Fatalf("DiskNodes [4] in a 3-node cluster: %v, want it refused", err)
	}
	spec := Spec{Name: "rldn", Nodes: 3, Binary: nodeBinary(t), DiskNodes: []int{3}, Dir: t.TempDir()}
	c, closed := upDisks(ctx, t, spec)
	var dirSt unix.Stat_t
	if err := unix.Stat(spec.Dir, &dirSt); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		st, dev := dataDev(t, c, n.ID)
		switch d := c.Disk(n.ID); {
		case n.ID == 3 && (d == nil || dev != d.Dev):
			t.Fatalf("node 3's data on device %s, want its own disk (%+v)", dev, d)
		case n.ID != 3 && (d != nil || st.Dev != dirSt.Dev):
			t.Fatalf("node %d's data on device %s with disk %+v, want the lab directory's", n.ID, dev, d)
		}
	}
	s, err := c.StallDisk(3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Device != c.Disk(3).Dev {
		t.Errorf("the stall of node 3 throttles %s, want its disk %s", s.Device, c.Disk(3).Dev)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	file := c.Disk(3).File
	*closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("disk file %s left after Close (%v)", file, err)
	}
}

// requireLoop skips a test without root or loop devices; its context ends with the test or
// after a minute.
func requireLoop(t *testing.T) context.Context {
	t.Helper()
	bpftest.RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices here: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// upDisks brings spec's cluster up; it is closed at the test's end unless the test set
// *closed (it closed it itself, to check what Close leaves).
func upDisks(ctx context.Context, t *testing.T, spec Spec) (*Cluster, *bool) {
	t.Helper()
	c, err := Up(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	closed := new(bool)
	t.Cleanup(func() {
		if !*closed {
			c.Close() //nolint:errcheck // the test failed already
		}
	})
	return c, closed
}

// dataDev is the device of node id's data directory as the node sees it ("major:minor").
func dataDev(t *testing.T, c *Cluster, id int) (unix.Stat_t, string) {
	t.Helper()
	var st unix.Stat_t
	dir := filepath.Join(fmt.Sprintf("/proc/%d/root", c.PID(id)), c.dataDir(id))
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatalf("node %d's data directory, as it sees it: %v", id, err)
	}
	return st, fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
}
