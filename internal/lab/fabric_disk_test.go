package lab

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// fsyncer is a child that writes and fsyncs a 4 KiB block each time it is asked.
type fsyncer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startFsyncer(t *testing.T, dir string) *fsyncer { return startFsyncerOn(t, dir, nil) }

// startFsyncerOn starts an fsyncer with its own disk d mounted over dir (nil: none).
func startFsyncerOn(t *testing.T, dir string, d *Disk) *fsyncer {
	t.Helper()
	cmd := exec.Command("sh", "-c", `while read x; do dd if=/dev/zero of="$1/f" bs=4k count=1 conv=fsync status=none || exit 1; echo done; done`, "sh", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if d != nil {
		d.Mount(cmd, dir)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // it is killed
	return &fsyncer{cmd: cmd, in: in, out: bufio.NewReader(out)}
}

// fsync times one write + fsync of the child.
func (f *fsyncer) fsync(t *testing.T) time.Duration {
	t.Helper()
	t0 := time.Now()
	if _, err := io.WriteString(f.in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if l, err := f.out.ReadString('\n'); err != nil || strings.TrimSpace(l) != "done" {
		t.Fatalf("fsyncer: %q, %v", l, err)
	}
	return time.Since(t0)
}

// TestStallDisk: a process's fsyncs take hundreds of milliseconds while its disk is stalled
// and are fast again after Stop; the stall's cgroup is gone and the process is back in its own.
func TestStallDisk(t *testing.T) {
	bpftest.RequireRoot(t)
	if _, _, err := ioHierarchy(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	if _, err := wholeDisk(dir); err != nil {
		t.Skipf("the test directory is on no disk: %v", err)
	}
	f := startFsyncer(t, dir)
	pid := f.cmd.Process.Pid
	before, err := procCgroupOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	f.fsync(t) // the file exists: later writes are overwrites
	s, err := StallDisk(pid, dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	stalled := []time.Duration{f.fsync(t), f.fsync(t), f.fsync(t)}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	after := f.fsync(t)
	t.Logf("device %s, fsyncs stalled at 5 write IOPS: %v; after: %v", s.Device, stalled, after)
	for _, d := range stalled {
		// 5 write requests a second: a block and its metadata are at least two, 200 ms apart.
		if d < 150*time.Millisecond {
			t.Errorf("stalled fsync took %v, want >= 150ms", d)
		}
	}
	if _, err := os.Stat(s.Cgroup); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still there after Stop (%v)", s.Cgroup, err)
	}
	if now, err := procCgroupOf(pid); err != nil || now != before {
		t.Errorf("after Stop the process is in %q (%v), want %q", now, err, before)
	}
	if _, err := StallDisk(pid, dir, 0); err == nil {
		t.Error("0 write IOPS accepted")
	}
	if _, err := StallDisk(pid, filepath.Join(dir, "nonexistent"), 5); err == nil {
		t.Error("a path that does not exist accepted")
	}
}

func procCgroupOf(pid int) (string, error) {
	_, v2, err := ioHierarchy()
	if err != nil {
		return "", err
	}
	return procCgroup(pid, v2)
}
