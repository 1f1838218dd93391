package offload

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pacer"
	"golang.org/x/sys/unix"
)

// Fixtures of the owner check (leader.bpf.c owner_exiting): leader_tick under
// BPF_PROG_TEST_RUN with the lease's owner set to real processes - this test process, a
// stopped child, a killed child not yet reaped (a zombie: PF_EXITING and SIGNAL_GROUP_EXIT
// set), a reaped child (no task) - and no owner. Where the kernel lacks the task kfuncs
// (before Linux 6.2) every case sends: the lease alone decides, as before the check.

// procState is the state letter of /proc/pid/stat ("" when the process is gone).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}

// waitState polls until pid is in state want ("" = gone).
func waitState(t *testing.T, pid int, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for procState(pid) != want {
		if time.Now().After(deadline) {
			t.Fatalf("process %d in state %q, want %q", pid, procState(pid), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// child starts a process that waits to be killed (reaped at cleanup at the latest).
func child(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "600")
	if err := c.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	t.Cleanup(func() {
		c.Process.Kill()
		c.Wait()
	})
	return c
}

func TestFixturesLeaderOwner(t *testing.T) {
	requireLeader(t)
	if ownerTgid() == 0 {
		t.Skip("test process outside the initial pid namespace: its pids are not the kernel's")
	}
	check := HaveOwnerCheck()
	t.Logf("owner check (bpf_task_from_pid): %v", check)

	f := newLeaderFixture(t, HaveMmapableArray())
	fd := f.capture()
	f.l.Update(true, hbTerm, 5, map[uint64]uint64{2: 5, 3: 5})
	heartbeats(t, fd)

	stopped := child(t)
	if err := stopped.Process.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, stopped.Process.Pid, "T")

	zombie := child(t)
	if err := zombie.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitState(t, zombie.Process.Pid, "Z")

	reaped := child(t)
	if err := reaped.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := reaped.Wait(); err == nil || !errors.As(err, new(*exec.ExitError)) {
		t.Fatalf("reap child: %v", err)
	}
	waitState(t, reaped.Process.Pid, "")

	sent := bpftest.Counters{"Ticks": 1, "TicksSent": 1, "Heartbeats": 2, "Inactive": 1, "Rearmed": 1}
	stops := bpftest.Counters{"Ticks": 1, "TicksOwnerExiting": 1}
	if !check {
		stops = sent
	}
	for _, c := range []struct {
		name  string
		owner int
		want  bpftest.Counters
	}{
		{"self", os.Getpid(), sent},
		{"no owner", 0, sent},
		{"stopped", stopped.Process.Pid, sent}, // alive: only the lease stops a stopped leader
		{"killed, not reaped", zombie.Process.Pid, stops},
		{"reaped", reaped.Process.Pid, stops},
		{"self again", os.Getpid(), sent},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.l.mu.Lock()
			f.l.cur.OwnerTgid = uint32(c.owner)
			err := f.l.writeAll()
			f.l.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			f.l.Update(true, hbTerm, 5, map[uint64]uint64{2: 5, 3: 5}) // a fresh lease
			f.forceDue()
			f.setArmed(0)
			d := delta(f, func() { f.run(tickFrame(uint64(pacer.Now()), tickMagic)) })
			if diff := d.Diff(c.want); diff != "" {
				t.Errorf("owner %d: %s", c.owner, diff)
			}
			got := heartbeats(t, fd)
			if want := int(c.want["Heartbeats"]); len(got) != want {
				t.Errorf("owner %d: %d heartbeats captured, want %d", c.owner, len(got), want)
			}
			if a := f.armedNs(); (a != 0) != (c.want["Rearmed"] != 0) {
				t.Errorf("owner %d: next tick armed %d, want armed %v", c.owner, a, c.want["Rearmed"] != 0)
			}
		})
	}
}
