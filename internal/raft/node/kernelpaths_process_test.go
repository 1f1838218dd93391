package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
)

// metric sums the samples of the Prometheus metric name whose labels contain every label
// (`key="value"`) on node id.
func (c *pcluster) metric(id uint64, name string, labels ...string) (float64, error) {
	cl := c.client(id)
	resp, err := cl.HTTP.Get("http://" + c.peers[id-1].Client + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("metrics: %s: %s", resp.Status, b)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

func (c *pcluster) inspect(id uint64) (*offload.Inspection, error) {
	return offload.Inspect(c.hosts[id].Handle, c.hosts[id].Iface)
}

// passes sums the counters of heartbeats the program handed to user space.
func passes(in *offload.Inspection) uint64 {
	var n uint64
	for _, k := range []string{"hb_no_state", "hb_not_alive", "hb_stale_term", "hb_new_term", "hb_leader", "hb_leader_addr"} {
		n += in.Counters[k]
	}
	return n
}

// TestLabOffload runs a 3-node cluster in lab namespaces with the follower kernel path on
// (the default) and a cluster key (every packet MAC'd: the kernel's replies are signed on
// its own channel and the leader's user space must accept them), and checks, from outside the processes, what the kernel does:
//   - followers' heartbeats are answered in XDP; user space sees only the ones passed up;
//   - kill -STOP of a follower: its program stops answering within the alive bound (set to
//     the election timeout) and passes heartbeats up instead; SIGCONT resumes answering;
//   - a follower starved of CPU for 2 s: no election, its kernel keeps answering;
//   - kill -9 of the leader: the survivors elect a new leader (the time is printed);
//   - kill -9 of a follower leaves no XDP program on its interface.
func TestLabOffload(t *testing.T) {
	// The alive bound fixed at the election timeout (election_ticks 30 x tick 10ms,
	// newProcCluster): the default adapts to the machine's CPU contention (up to 1 s on a
	// loaded one; pkg/raft/kernelpaths TestAdaptiveBound, raftlab
	// TestStalledFollowerStopsAnswering), and this test times the gate against a known bound.
	const aliveFor = 30 * 10 * time.Millisecond
	c := offloadCluster(t, "roff", "--offload-alive", aliveFor.String())
	lead := c.waitLeader(1, 2, 3)
	fol := lead%3 + 1
	c.put(c.client(lead), "x", "1")

	s, err := c.status(fol)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Offload, "xdp-") {
		t.Fatalf("follower %d reports offload %q, want the XDP path on", fol, s.Offload)
	}
	var in *offload.Inspection
	c.waitFor("50 heartbeats answered in XDP", 20*time.Second, func() bool {
		in, err = c.inspect(fol)
		return err == nil && in.Counters["hb_answered"] >= 50
	})
	seen, err := c.metric(fol, "kedge_raft_transport_received_total", `type="MsgHeartbeat"`)
	if err != nil {
		t.Fatal(err)
	}
	in2, err := c.inspect(fol)
	if err != nil {
		t.Fatal(err)
	}
	refused, err := c.metric(lead, "kedge_raft_transport_dropped_total")
	if err != nil {
		t.Fatal(err)
	}
	if refused != 0 {
		t.Errorf("the leader's transport refused %v packets (the kernel's signed replies?)", refused)
	}
	if p := passes(in2); seen > float64(p) {
		t.Errorf("user space received %v heartbeats, the program passed only %d up", seen, p)
	}
	if in2.Heartbeat.Leader != lead || in2.Leader != lead || in2.Term != in2.Heartbeat.Term {
		t.Errorf("kernel state %+v: want leader %d and the heartbeat's term", in2, lead)
	}
	t.Logf("follower %d: %d heartbeats answered in XDP, %d passed up, user space saw %v", fol, in2.Counters["hb_answered"], passes(in2), seen)

	// LAST-HB is the kernel's record where the kernel answers: with no writes for 3 s, user
	// space hears the leader only now and then (its own record grew to 5-10 s), while
	// heartbeats come every few tens of milliseconds; a second is far from either.
	time.Sleep(3 * time.Second)
	for range 10 {
		fs, err := c.status(fol)
		if err != nil {
			t.Fatal(err)
		}
		if fs.LastHeartbeatMs == nil || *fs.LastHeartbeatMs > 1000 {
			t.Fatalf("follower %d: last_heartbeat_ms %v while its kernel answers the leader's heartbeats (want under 1000)", fol, ptrString(fs.LastHeartbeatMs))
		}
		ls, err := c.status(lead)
		if err != nil {
			t.Fatal(err)
		}
		if ls.LastHeartbeatMs == nil || *ls.LastHeartbeatMs > 1000 {
			t.Fatalf("leader %d: last_heartbeat_ms %v (the oldest follower's; want under 1000), peers %+v", lead, ptrString(ls.LastHeartbeatMs), ls.Peers)
		}
		// Each record apart: the kernel's is the one that keeps up.
		if fs.KernelHeartbeatMs == nil || *fs.KernelHeartbeatMs > 1000 {
			t.Fatalf("follower %d: kernel_heartbeat_ms %v (transport's %v), want under 1000", fol, ptrString(fs.KernelHeartbeatMs), ptrString(fs.TransportHeartbeatMs))
		}
		for _, p := range ls.Peers {
			if p.KernelHeardMs == nil || *p.KernelHeardMs > 1000 {
				t.Fatalf("leader %d: kernel_heard_ms of %d %v (transport's %v), want under 1000", lead, p.ID, ptrString(p.KernelHeardMs), ptrString(p.TransportHeardMs))
			}
		}
		t.Logf("follower %d: last heartbeat %s ms ago by its kernel, %s by its transport", fol, ptrString(fs.KernelHeartbeatMs), ptrString(fs.TransportHeartbeatMs))
		time.Sleep(200 * time.Millisecond)
	}

	// The bounds in force, as status reports them: the alive bound fixed by the flag, the
	// lease adaptive (between its floor, the election timeout, and kernelpaths.MaxAdaptiveBound).
	fs, err := c.status(fol)
	if err != nil {
		t.Fatal(err)
	}
	if fs.AliveBoundMs == nil || *fs.AliveBoundMs != float64(aliveFor.Milliseconds()) {
		t.Errorf("follower %d: alive_bound_ms %v, want %d (--offload-alive)", fol, ptrString(fs.AliveBoundMs), aliveFor.Milliseconds())
	}
	ls, err := c.status(lead)
	if err != nil {
		t.Fatal(err)
	}
	if l := ls.HeartbeatLeaseMs; l == nil || *l < float64(offload.DefaultBound(aliveFor).Milliseconds()) || *l > float64(kernelpaths.MaxAdaptiveBound.Milliseconds()) {
		t.Errorf("leader %d: heartbeat_lease_ms %v, want the adaptive lease within [%v, %v]", lead, ptrString(l), offload.DefaultBound(aliveFor), kernelpaths.MaxAdaptiveBound)
	}

	// kill -STOP: the loop cannot refresh alive-until any more.
	p := c.procs[fol]
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cmd.Process.Signal(syscall.SIGCONT) })
	// The stop takes effect when every thread has been stopped (a thread running on another
	// CPU, or waiting for one under load, may still refresh first): the bound holds from then,
	// and the time taken once all are seen stopped is later than that.
	for deadline := time.Now().Add(10 * time.Second); !allStopped(p.cmd.Process.Pid); {
		if time.Now().After(deadline) {
			t.Fatal("the follower's threads did not all stop within 10s of SIGSTOP")
		}
		time.Sleep(time.Millisecond) // polling the threads' state: the bound starts there
	}
	stopped := offload.Monotonic()
	c.waitFor("heartbeats passed up after the alive deadline", 20*time.Second, func() bool {
		in, err = c.inspect(fol)
		return err == nil && in.Counters["hb_not_alive"] >= in2.Counters["hb_not_alive"]+3
	})
	if in.AliveUntil > stopped+aliveFor {
		t.Errorf("alive deadline %v after SIGSTOP, bound %v", in.AliveUntil-stopped, aliveFor)
	}
	if in.Heartbeat.Answered >= in.AliveUntil {
		t.Errorf("a heartbeat was answered %v after the alive deadline", in.Heartbeat.Answered-in.AliveUntil)
	}
	if in.Heartbeat.Arrival < in.AliveUntil {
		t.Errorf("the heartbeats passed up after the alive deadline did not move the record's arrival")
	}
	again, err := c.inspect(fol)
	if err != nil {
		t.Fatal(err)
	}
	if again.Counters["hb_answered"] != in.Counters["hb_answered"] {
		t.Errorf("the stopped follower's program still answers: %d -> %d", in.Counters["hb_answered"], again.Counters["hb_answered"])
	}
	t.Logf("SIGSTOP: last heartbeat answered %v after the stop, alive deadline %v after it (bound %v)",
		in.Heartbeat.Answered-stopped, in.AliveUntil-stopped, aliveFor)
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.waitFor("answering again after SIGCONT", 20*time.Second, func() bool {
		in, err = c.inspect(fol)
		return err == nil && in.Counters["hb_answered"] > again.Counters["hb_answered"]+10
	})

	// A starved follower (pinned to one CPU with 3 busy threads: about a quarter of a CPU)
	// for 2 s: no election - same leader, same term - while its kernel keeps answering.
	before, err := c.status(lead)
	if err != nil {
		t.Fatal(err)
	}
	inBefore, err := c.inspect(fol)
	if err != nil {
		t.Fatal(err)
	}
	starver, err := lab.Starve(p.cmd.Process.Pid, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the starvation being measured, not a synchronisation
	if err := starver.Stop(); err != nil {
		t.Fatal(err)
	}
	inAfter, err := c.inspect(fol)
	if err != nil {
		t.Fatal(err)
	}
	after, err := c.status(lead)
	if err != nil {
		t.Fatal(err)
	}
	if after.Term != before.Term || after.Leader != before.Leader {
		t.Errorf("an election while follower %d was starved: leader %d term %d -> leader %d term %d",
			fol, before.Leader, before.Term, after.Leader, after.Term)
	}
	t.Logf("follower %d starved 2 s: %d heartbeats answered in XDP, %d passed up (alive deadline missed), term %d unchanged",
		fol, inAfter.Counters["hb_answered"]-inBefore.Counters["hb_answered"], passes(inAfter)-passes(inBefore), after.Term)

	// kill -9 of the leader: a new leader among the survivors.
	var rest []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != lead {
			rest = append(rest, id)
		}
	}
	killed := time.Now()
	c.kill(lead)
	newLead := c.waitLeader(rest...)
	took := time.Since(killed)
	var campaigns float64
	for _, id := range rest {
		v, err := c.metric(id, "kedge_raft_offload_wakeups_total", `result="campaign"`)
		if err != nil {
			t.Fatal(err)
		}
		campaigns += v
	}
	t.Logf("leader %d killed: node %d leads after %v (polled; detect %v + jitter); pre-votes started by the kernel's detector: %v",
		lead, newLead, took.Round(time.Millisecond), aliveFor, campaigns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.client(newLead).Put(ctx, "x", "2"); err != nil {
		t.Fatalf("write after failover: %v", err)
	}

	// kill -9 of a follower: the bpf_link dies with the process, or right after it with the
	// fast-exit helper that holds a duplicate (internal/fastexit).
	other := rest[0]
	if other == newLead {
		other = rest[1]
	}
	c.kill(other)
	c.waitFor("no XDP program on the killed follower's interface", 10*time.Second, func() bool {
		_, err := c.inspect(other)
		return err != nil && strings.Contains(err.Error(), "no XDP program")
	})
}

// allStopped reports whether every thread of pid is in the stopped state (T).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		i := strings.LastIndexByte(string(b), ')')
		if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

func ptrString(v *float64) string {
	if v == nil {
		return "null"
	}
	return strconv.FormatFloat(*v, 'f', 3, 64)
}
