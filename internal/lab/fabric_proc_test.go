package lab

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// spinner starts a busy child process (a shell loop) and returns it; it is killed at the end.
func spinner(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func TestStarve(t *testing.T) {
	cmd := spinner(t)
	pid := cmd.Process.Pid
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &before); err != nil {
		t.Fatal(err)
	}
	cpu := runtime.NumCPU() - 1
	s, err := Starve(pid, cpu, 3)
	if err != nil {
		t.Fatal(err)
	}
	var during unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &during); err != nil {
		t.Fatal(err)
	}
	if during.Count() != 1 || !during.IsSet(cpu) {
		t.Errorf("starved pid on cpus %v, want only %d", during, cpu)
	}
	c0, _ := CPUTime(pid)
	time.Sleep(500 * time.Millisecond) // a measurement window, logged only
	c1, _ := CPUTime(pid)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil { // idempotent
		t.Fatal(err)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("affinity after Stop %v, want %v", after, before)
	}
	t.Logf("starved with 3 spinners: %d ticks in 500ms (one CPU = %d)", c1-c0, 50)

	if _, err := Starve(pid, runtime.NumCPU(), 1); err == nil {
		t.Error("cpu out of range accepted")
	}
	if _, err := Starve(pid, 0, 0); err == nil {
		t.Error("zero spinners accepted")
	}
	if _, err := Starve(1<<30, 0, 1); err == nil {
		t.Error("missing process accepted")
	}
}

func TestPauseResume(t *testing.T) {
	cmd := spinner(t)
	pid := cmd.Process.Pid
	if err := Pause(pid); err != nil {
		t.Fatal(err)
	}
	// Pause returns once the process is stopped, not merely signalled.
	if st, err := procState(pid); err != nil || st != 'T' {
		t.Fatalf("pid %d in state %c (%v) when Pause returned, want T", pid, st, err)
	}
	c0, _ := CPUTime(pid)
	time.Sleep(100 * time.Millisecond) // a window in which a stopped process must use no CPU
	c1, _ := CPUTime(pid)
	if c1 != c0 {
		t.Errorf("paused process used %d ticks", c1-c0)
	}
	if err := Resume(pid); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, 'R')
	if err := Pause(1 << 30); err == nil {
		t.Error("Pause of a missing process returned no error")
	}
}

func waitState(t *testing.T, pid int, want byte) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := procState(pid)
		if err != nil {
			t.Fatal(err)
		}
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d in state %c, want %c", pid, st, want)
		}
		time.Sleep(time.Millisecond)
	}
}
