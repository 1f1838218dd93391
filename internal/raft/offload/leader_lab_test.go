package offload

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raftlab"
	"golang.org/x/sys/unix"
)

// Lab tests: real `kedge raft serve` processes in lab namespaces behind the router fabric.
// Timing is generous on purpose (the machine is shared): an election timeout of 300 ms
// (30 ticks of 10 ms; etcd-raft randomises it to 300-600 ms), a lease of 2 s, and the
// leader stopped for 1 s - longer than any follower waits without a heartbeat, shorter
// than the lease. No timing is asserted; replacement times are printed.

const (
	labElectionTicks = 30
	labLease         = 2 * time.Second
	labPause         = time.Second
)

func upLab(t *testing.T, name string, kernel bool) *raftlab.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := raftlab.Spec{Name: name, Nodes: 3, Binary: bpftest.KedgeBinary(t), Dir: t.TempDir(),
		ElectionTicks: labElectionTicks}
	// The control turns the kernel heartbeats off explicitly: they are on by default, with
	// the adaptive lease, which on a loaded machine reaches 1 s and would hold the followers
	// through the control's pause.
	spec.Args = []string{"--kernel-heartbeats=false"}
	if kernel {
		spec.Args = []string{"--kernel-heartbeats", "--heartbeat-lease", labLease.String()}
	}
	c, err := raftlab.Up(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				if b, err := os.ReadFile(c.LogPath(n.ID)); err == nil {
					if len(b) > 3000 {
						b = b[len(b)-3000:]
					}
					t.Logf("node %d log (tail):\n%s", n.ID, b)
				}
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("cluster close: %v", err)
		}
	})
	return c
}

// waitKernelServes waits until the leader leaves its heartbeats to the kernel (its lease
// runs and its followers are handed over).
func waitKernelServes(t *testing.T, c *raftlab.Cluster, leader int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitKernelHeartbeats(ctx, leader); err != nil {
		t.Fatal(err)
	}
}

// pauseLeader stops the leader for d and reports whether any other node led in a higher
// term meanwhile or right after (the followers are polled every 20 ms).
func pauseLeader(t *testing.T, c *raftlab.Cluster, leader int, term uint64, d time.Duration) (elected bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var others []int
	for _, n := range c.Nodes {
		if n.ID != leader {
			others = append(others, n.ID)
		}
	}
	pid := c.PID(leader)
	if err := lab.Pause(pid); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for _, id := range others {
			if st, err := c.Status(ctx, id); err == nil && st.Term > term {
				elected = true
			}
		}
		time.Sleep(20 * time.Millisecond) // polling the followers during the pause
	}
	if err := lab.Resume(pid); err != nil {
		t.Fatal(err)
	}
	return elected
}

func TestLabKernelHeartbeats(t *testing.T) {
	requireLeader(t)
	if bpftest.InGuest() {
		t.Skip("lab cluster: host only (TCG guests are too slow for 300 ms election timeouts)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Control: without kernel heartbeats, a leader stopped for 1 s is replaced.
	ctl := upLab(t, "rlctl", false)
	leader, term := ctl.Leader(ctx, nil)
	if !pauseLeader(t, ctl, leader, term, labPause) {
		t.Fatalf("control: leader %d stopped for %v without kernel heartbeats and nobody was elected: the test below proves nothing", leader, labPause)
	}
	ctl.Close()

	c := upLab(t, "rlkhb", true)
	leader, term = c.Leader(ctx, nil)
	waitKernelServes(t, c, leader)
	// Stopped for less than the lease: the kernel keeps heartbeating, nobody elects.
	if pauseLeader(t, c, leader, term, labPause) {
		t.Fatalf("leader %d stopped for %v (lease %v): a follower elected - the kernel's heartbeats did not hold them", leader, labPause, labLease)
	}
	if id, tm := c.Leader(ctx, nil); id != leader || tm != term {
		t.Fatalf("after the pause: leader %d term %d, want %d term %d", id, tm, leader, term)
	}
	// Stopped for good: the lease lapses, the kernel stops, the followers elect.
	w, err := c.WedgedLeader(ctx, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wedged leader %d (term %d) replaced by %d (term %d) after %v (lease %v + election timeout %d ticks of 10ms); old leader stepped down %v after SIGCONT",
		w.OldLeader, w.OldTerm, w.NewLeader, w.NewTerm, w.Replaced.Round(time.Millisecond), labLease, labElectionTicks, w.StepDown.Round(time.Millisecond))
	if w.Replaced < labLease/2 {
		// Not a timing bound: a replacement much sooner than the lease means the kernel
		// was not heartbeating at all (the check above would have failed too).
		t.Errorf("replaced after %v, well inside the lease %v: kernel heartbeats were not running", w.Replaced, labLease)
	}
}

// BenchmarkWedgedLeader measures the wedged-leader replacement time (SIGSTOP the leader ->
// another node leads) with kernel heartbeats (lease = the election timeout, the adaptive
// bound's floor, fixed here: a loaded machine would raise the default) and
// without, on two clusters of the default timing (tick 10 ms, election timeout 100 ms). Each
// iteration is one trial on each cluster in turn (alternating); the metrics are the medians
// over the trials. Figures only; make test runs one trial each. For figures, ten trials on a
// quiet machine:
//
//	flock -x /tmp/kedge-quiet.lock go test -count=1 -run '^$' -bench WedgedLeader -benchtime=10x -v ./internal/raft/offload
func BenchmarkWedgedLeader(b *testing.B) {
	requireLeader(b)
	if bpftest.InGuest() {
		b.Skip("lab clusters: host only (TCG guests are too slow for 100 ms election timeouts)")
	}
	b.Logf("load average at start %v", bench.LoadAvg())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	up := func(name string, args ...string) *raftlab.Cluster {
		c, err := raftlab.Up(ctx, raftlab.Spec{Name: name, Nodes: 3, Binary: bpftest.KedgeBinary(b), Dir: b.TempDir(), Args: args})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	modes := []struct {
		name, metric string
		c            *raftlab.Cluster
		kernel       bool
		got          []float64 // ms
	}{
		// Kernel heartbeats are the node's default: the user-space cluster turns them off.
		{name: "user-space heartbeats", metric: "ms-replaced-user-heartbeats", c: up("rlwu", "--kernel-heartbeats=false")},
		{name: "kernel heartbeats, lease 100ms", metric: "ms-replaced-kernel-heartbeats", c: up("rlwk", "--kernel-heartbeats", "--heartbeat-lease", "100ms"), kernel: true},
	}
	b.ResetTimer()
	for i := range b.N {
		for m := range modes {
			md := &modes[m]
			id, err := md.c.WaitLeader(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if md.kernel {
				if err := md.c.WaitKernelHeartbeats(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
			w, err := md.c.WedgedLeader(ctx, 2*time.Millisecond)
			if err != nil {
				b.Fatal(err)
			}
			md.got = append(md.got, float64(w.Replaced)/float64(time.Millisecond))
			b.Logf("trial %d, %s: leader %d replaced by %d after %v", i, md.name, w.OldLeader, w.NewLeader, w.Replaced.Round(time.Millisecond))
		}
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op") // an iteration is a trial on each cluster: its wall time means nothing
	for _, md := range modes {
		b.ReportMetric(bench.Median(md.got), md.metric)
		b.Logf("%s: wedged leader replaced after p50 %.0f ms, min %.0f, max %.0f (%d trials)", md.name,
			bench.Median(md.got), slices.Min(md.got), slices.Max(md.got), len(md.got))
	}
	b.Logf("load average at end %v", bench.LoadAvg())
}

// holdBPFLinks duplicates every BPF link descriptor of process pid into this process
// (pidfd_getfd), so that its tick program and the pacer's programs stay attached after the
// process dies - as they do on a loaded machine until its exit reaches exit_files(). The
// descriptors are closed at cleanup.
func holdBPFLinks(t *testing.T, pid int) int {
	t.Helper()
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(pfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || target != "anon_inode:bpf_link" {
			continue
		}
		num, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pfd, num, 0)
		if err != nil {
			t.Fatalf("pidfd_getfd %d/%d: %v", pid, num, err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		n++
	}
	return n
}

// TestLabKilledLeader: a SIGKILLed leader's kernel stops heartbeating at once, not when its
// lease (10 s here) runs out. The leader's BPF links are held open by the test, standing in
// for an exit that has not closed its files yet: without the owner check (leader.bpf.c
// owner_exiting) the heartbeats go on for the lease and nobody is elected for 10 s. Host
// only; about 15 s.
func TestLabKilledLeader(t *testing.T) {
	requireLeader(t)
	if bpftest.InGuest() {
		t.Skip("lab cluster: host only (TCG guests are too slow for 300 ms election timeouts)")
	}
	if !HaveOwnerCheck() {
		t.Skip("no owner check here (kernel without bpf_task_from_pid, or not the initial pid namespace): a killed leader's heartbeats stop when its files close or its lease ends")
	}
	const lease = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := raftlab.Spec{Name: "rlkill", Nodes: 3, Binary: bpftest.KedgeBinary(t), Dir: t.TempDir(),
		ElectionTicks: labElectionTicks, Args: []string{"--kernel-heartbeats", "--heartbeat-lease", lease.String()}}
	c, err := raftlab.Up(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("cluster close: %v", err)
		}
	})
	leader, term := c.Leader(ctx, nil)
	waitKernelServes(t, c, leader)
	pid := c.PID(leader)
	if n := holdBPFLinks(t, pid); n == 0 {
		t.Fatalf("leader %d (pid %d) has no BPF links to hold", leader, pid)
	}
	var others []int
	for _, n := range c.Nodes {
		if n.ID != leader {
			others = append(others, n.ID)
		}
	}
	killed := time.Now()
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for {
		if id, tm := c.Leader(ctx, others); id != 0 && tm > term {
			took := time.Since(killed)
			t.Logf("leader %d (term %d) killed with its links held open; node %d leads term %d after %v (lease %v, election timeout %d ticks of 10ms)",
				leader, term, id, tm, took.Round(time.Millisecond), lease, labElectionTicks)
			if took >= lease/2 {
				// Not a timing bound: an election this late means the killed leader's
				// heartbeats held the followers for its lease.
				t.Errorf("new leader after %v: the killed leader's kernel heartbeated on (lease %v)", took, lease)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no new leader %v after killing leader %d: %v", time.Since(killed).Round(time.Millisecond), leader, ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the followers
		}
	}
}
