package lab

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/runstate"
)

func requireDisks(t *testing.T) {
	t.Helper()
	bpftest.RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices here: %v", err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skipf("no mkfs.ext4 (e2fsprogs): %v", err)
	}
}

// mountedIn reports whether dir is a mount point in the namespace of /proc/<pid>
// ("self": the caller's).
func mountedIn(t *testing.T, pid, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// waitDetached waits until no loop device is attached to file.
func waitDetached(t *testing.T, file string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(loopsOf(file)) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%s still attached to %v", file, loopsOf(file))
		}
		time.Sleep(10 * time.Millisecond) // polling the kernel's detach
	}
}

// TestDiskIsolation: two processes on disks of their own; while one's disk is stalled (its
// fsyncs take hundreds of milliseconds), the other's fsyncs stay fast. Each disk is mounted
// only in its process's namespace, what a process wrote is there for the next one on that
// disk, and Close leaves no loop device or file.
func TestDiskIsolation(t *testing.T) {
	requireDisks(t)
	if _, _, err := ioHierarchy(); err != nil {
		t.Skip(err)
	}
	da, err := NewDisk("tdisk-a", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() }) //nolint:errcheck // closed and checked below
	db, err := NewDisk("tdisk-b", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) //nolint:errcheck // closed and checked below
	if da.Dev == db.Dev || !strings.HasPrefix(da.Dev, "7:") {
		t.Fatalf("disks on devices %s and %s: want two loop devices", da.Dev, db.Dev)
	}
	t.Logf("disks %s (%s, direct I/O %v) and %s (%s, direct I/O %v)", da.Loop, da.Dev, da.DirectIO, db.Loop, db.Dev, db.DirectIO)
	dirA, dirB := t.TempDir(), t.TempDir()
	a, b := startFsyncerOn(t, dirA, da), startFsyncerOn(t, dirB, db)
	a.fsync(t) // mounted, and the file exists: later writes are overwrites
	b.fsync(t)
	pidA := fmt.Sprint(a.cmd.Process.Pid)
	if mountedIn(t, "self", dirA) || mountedIn(t, "self", dirB) {
		t.Fatal("a disk is mounted in the test's own mount namespace")
	}
	if !mountedIn(t, pidA, dirA) || mountedIn(t, pidA, dirB) {
		t.Fatal("process a's namespace does not hold its disk alone")
	}
	if _, err := os.Stat(filepath.Join(dirA, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("process a's file is visible outside its namespace (%v)", err)
	}

	s, err := StallDisk(a.cmd.Process.Pid, filepath.Join("/proc", pidA, "root", dirA), 5)
	if err != nil {
		t.Fatal(err)
	}
	if s.Device != da.Dev {
		t.Errorf("stalled device %s, want a's disk %s", s.Device, da.Dev)
	}
	// b fsyncs without pause while a does three stalled fsyncs.
	var wg sync.WaitGroup
	var other []time.Duration
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				other = append(other, b.fsync(t))
			}
		}
	}()
	stalled := []time.Duration{a.fsync(t), a.fsync(t), a.fsync(t)}
	close(stop)
	wg.Wait()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("a's fsyncs, stalled at 5 write IOPS: %v; b's meanwhile: %v", stalled, other)
	// One 4 KiB overwrite per fsync reaches the throttled device (the journal's commit is
	// jbd2's, not the process's): at 5 a second each waits 200 ms for the one before,
	// except the first of a new throttle slice.
	if total := stalled[0] + stalled[1] + stalled[2]; total < 300*time.Millisecond {
		t.Errorf("a's three stalled fsyncs took %v in all, want >= 300ms", total)
	}
	// b's disk is not the stalled one: its fsyncs take milliseconds, well below the stall.
	// (On one shared filesystem b's fsyncs are held up now and then by a's throttled writes,
	// which its journal's commits wait for: by hundreds of milliseconds here, seconds in
	// the raft lab.)
	slices.Sort(other)
	if med := other[len(other)/2]; med >= 100*time.Millisecond {
		t.Errorf("b's fsyncs while a's disk is stalled: median %v, want < 100ms", med)
	}

	// What a wrote is on its disk for the next process that mounts it.
	a.in.Close()
	a.cmd.Process.Kill() //nolint:errcheck // it is killed
	a.cmd.Wait()         //nolint:errcheck // it is killed
	check := exec.Command("sh", "-c", `test -s "$1/f"`, "sh", dirA)
	da.Mount(check, dirA)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("a's file is not on its disk after a restart: %v %s", err, out)
	}

	b.in.Close()
	b.cmd.Process.Kill() //nolint:errcheck // it is killed
	b.cmd.Wait()         //nolint:errcheck // it is killed
	for _, d := range []*Disk{da, db} {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		waitDetached(t, d.File)
		if _, err := os.Stat(d.File); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after Close (%v)", d.File, err)
		}
	}
}

const diskChildEnv = "KEDGE_DISK_TEST_CHILD"

// TestDiskCleanup: a process that made a disk and mounted it into a child of its own is
// SIGKILLed; the loop device detaches by itself once the child is gone too, and cleanup
// finds the backing file with its dead owner and deletes it.
func TestDiskCleanup(t *testing.T) {
	requireDisks(t)
	if os.Getenv(diskChildEnv) != "" {
		diskChild(t)
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^TestDiskCleanup$", "-test.count=1")
	cmd.Env = append(os.Environ(), diskChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // killed below
	var file, loop string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "disk %s %s", &file, &loop); err == nil {
			break
		}
	}
	if file == "" {
		t.Fatal("the child made no disk")
	}
	t.Cleanup(func() { removeDiskFile(file) }) //nolint:errcheck // the test's own check comes first
	if got := loopsOf(file); !slices.Contains(got, loop) {
		t.Fatalf("the child's disk %s is attached to %v, want %s", file, got, loop)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() //nolint:errcheck // killed
	waitDetached(t, file)

	var found *runstate.Leftover
	for _, c := range runstate.Cleaners() {
		if c.Kind != KindDisk {
			continue
		}
		lo, err := c.List(runstate.Scope{Netns: -1})
		if err != nil {
			t.Fatal(err)
		}
		for i := range lo {
			if lo[i].Name == file {
				found = &lo[i]
			}
		}
	}
	if found == nil {
		t.Fatalf("cleanup does not list %s", file)
	}
	if v := runstate.Judge(found.Owner); v.State != runstate.Dead {
		t.Fatalf("owner %s of %s judged %s (%s), want dead", found.Owner, file, v.State, v.Reason)
	}
	if err := found.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after cleanup (%v)", file, err)
	}
}

// diskChild is TestDiskCleanup's child: it makes a disk, mounts it into a sleeping child of
// its own, says which and waits to be killed.
func diskChild(t *testing.T) {
	d, err := NewDisk("tdisk-c", 0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sleep := exec.Command("sleep", "600")
	sleep.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d.Mount(sleep, dir)
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !mountedIn(t, fmt.Sprint(sleep.Process.Pid), dir); {
		if time.Now().After(deadline) {
			t.Fatal("the disk was not mounted")
		}
		time.Sleep(5 * time.Millisecond) // polling the child's mount
	}
	fmt.Printf("disk %s %s\n", d.File, d.Loop)
	time.Sleep(10 * time.Minute) // killed by the parent
}
