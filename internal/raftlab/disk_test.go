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
	bpftest.RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices here: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := Spec{Name: "rldisk", Nodes: 3, Binary: nodeBinary(t), NodeDisks: true, Dir: t.TempDir()}
	c, err := Up(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			c.Close() //nolint:errcheck // the test failed already
		}
	})
	devs := map[string]bool{}
	for _, n := range c.Nodes {
		var st unix.Stat_t
		dir := filepath.Join(fmt.Sprintf("/proc/%d/root", c.PID(n.ID)), c.dataDir(n.ID))
		if err := unix.Stat(dir, &st); err != nil {
			t.Fatalf("node %d's data directory, as it sees it: %v", n.ID, err)
		}
		dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
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
	closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("disk file %s left after Close (%v)", f, err)
		}
	}
}
