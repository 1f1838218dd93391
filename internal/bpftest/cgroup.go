package bpftest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// Cgroup is a cgroup2 directory a test creates for its own processes, so that a cgroup
// program (sock_ops, cgroup_skb) the test attaches to it sees those processes and no
// others. Never the hierarchy's root: a program there runs for every process of the host.
type Cgroup struct {
	Path string
	dir  *os.File
}

var cgroupSeq atomic.Uint64

// cgroupPrefix names the test cgroups: kedge-test-<pid>-<n>, so that a run killed before its
// cleanup leaves directories the next run recognises by their dead pid and removes.
const cgroupPrefix = "kedge-test-"

// NewCgroup creates an empty cgroup under the cgroup2 root, removed (with any process
// still in it killed) when the test ends. It skips the test where no cgroup2 hierarchy is
// mounted and fails it when one is but the directory cannot be made.
func NewCgroup(tb testing.TB) *Cgroup {
	tb.Helper()
	RequireRoot(tb)
	root, err := bpfx.Cgroup2Root()
	if errors.Is(err, bpfx.ErrNoCgroup2) {
		tb.Skip("no cgroup2 hierarchy mounted: cgroup programs cannot be attached")
	}
	if err != nil {
		tb.Fatal(err)
	}
	removeStaleCgroups(root)
	path := filepath.Join(root, fmt.Sprintf("%s%d-%d", cgroupPrefix, os.Getpid(), cgroupSeq.Add(1)))
	if err := os.Mkdir(path, 0o755); err != nil {
		tb.Fatalf("create test cgroup: %v", err)
	}
	dir, err := os.Open(path)
	if err != nil {
		os.Remove(path)
		tb.Fatalf("open test cgroup: %v", err)
	}
	cg := &Cgroup{Path: path, dir: dir}
	tb.Cleanup(func() {
		dir.Close()
		if err := removeCgroup(path); err != nil {
			tb.Errorf("remove test cgroup: %v", err)
		}
	})
	return cg
}

// Place makes cmd start inside the cgroup (clone3 with CLONE_INTO_CGROUP, 5.7): the child
// is in it from its first instruction, so every socket it opens belongs to it.
func (c *Cgroup) Place(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(c.dir.Fd())
	return cmd
}

// Procs lists the pids in the cgroup.
func (c *Cgroup) Procs() ([]int, error) {
	return cgroupProcs(c.Path)
}

func cgroupProcs(path string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// removeCgroup kills what is left in the cgroup (only the test's own processes can be:
// it created the directory and put only its children there) and removes it.
func removeCgroup(path string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := unix.Rmdir(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("rmdir %s: %w", path, err)
		}
		// cgroup.kill (5.14) kills every process in it; before, each pid by hand.
		if werr := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0); werr != nil {
			pids, _ := cgroupProcs(path)
			for _, pid := range pids {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond) // the killed processes leave the cgroup as they exit
	}
}

// removeStaleCgroups removes the empty test cgroups of test processes that no longer run (a
// test killed before its cleanup). One that still holds a process is left alone: the
// process is not this test's to end.
func removeStaleCgroups(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, cgroupPrefix) {
			continue
		}
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(name, cgroupPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) == nil {
			continue
		}
		_ = unix.Rmdir(filepath.Join(root, name)) // EBUSY while a process is in it
	}
}
