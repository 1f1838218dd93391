package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raftlab"
	"github.com/kedge-dev/kedge/internal/runstate/runstatetest"
)

// TestRaftLabCLI runs the walkthrough of docs/raft.md with the built binary: up, a write and
// a read from the client host, kill the leader, a new leader, a write through it, down.
func TestRaftLabCLI(t *testing.T) {
	requireRoot(t)
	// Its own /run: another test binary's cleanup (running beside this one) would judge the
	// killed supervisor's owner record as nobody's leftover and remove it before the
	// dry-run below could list the cluster.
	if runstatetest.Private(t) {
		return
	}
	bin := bpftest.KedgeBinary(t)
	root := t.TempDir()
	name := fmt.Sprintf("rlc%d", os.Getpid()%100000)
	kedge := func(args ...string) (string, int) {
		t.Helper()
		c := exec.Command(bin, args...)
		c.Env = append(os.Environ(), "KEDGE_RAFT_LAB_ROOT="+root)
		out, err := c.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	must := func(args ...string) string {
		t.Helper()
		out, code := kedge(args...)
		if code != 0 {
			t.Fatalf("kedge %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
		return out
	}
	out := must("raft", "lab", "up", "--name", name, "--nodes", "3", "-o", "json")
	downDone := false
	t.Cleanup(func() {
		if downDone {
			return
		}
		if out, code := kedge("raft", "lab", "down", name); code != 0 {
			t.Errorf("down: exit %d: %s", code, out)
		}
	})
	var info raftlab.Info
	if err := json.Unmarshal([]byte(out), &info); err != nil || len(info.Nodes) != 3 {
		t.Fatalf("up -o json: %v\n%s", err, out)
	}
	if _, code := kedge("raft", "lab", "up", "--name", name); code != 2 {
		t.Errorf("second up of the same name: exit %d, want 2", code)
	}
	kv := func(args ...string) string {
		return must(append([]string{"lab", "exec", name, "client", "--", bin, "raft", "kv", "--config", info.Config}, args...)...)
	}
	if out := kv("put", "greeting", "hello"); !strings.Contains(out, "ok") {
		t.Errorf("put: %s", out)
	}
	if out := kv("get", "greeting"); strings.TrimSpace(out) != "hello" {
		t.Errorf("get: %q", out)
	}
	out = must("raft", "lab", "fault", name, "kill", "leader", "-o", "json")
	var resp raftlab.Response
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	var killed int
	fmt.Sscanf(resp.Done, "killed node %d", &killed)
	if killed == 0 {
		t.Fatalf("kill leader: %q", resp.Done)
	}
	// A new leader among the others (polled through the lab's status).
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := must("raft", "lab", "status", name, "-o", "json")
		var in raftlab.Info
		if err := json.Unmarshal([]byte(out), &in); err != nil {
			t.Fatal(err)
		}
		leader := 0
		for _, n := range in.Nodes {
			if n.Status != nil && n.Status.State == "leader" {
				leader = n.ID
			}
		}
		if leader != 0 && leader != killed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader 20s after killing %d:\n%s", killed, out)
		}
		time.Sleep(50 * time.Millisecond) // polling the cluster's state
	}
	kv("put", "greeting", "again")
	if out := kv("get", "greeting"); strings.TrimSpace(out) != "again" {
		t.Errorf("get after failover: %q", out)
	}
	if out := must("raft", "lab", "fault", name, "start", "killed"); !strings.Contains(out, fmt.Sprintf("started node %d", killed)) {
		t.Errorf("start killed after killing node %d: %s", killed, out)
	}
	if out, code := kedge("raft", "lab", "fault", name, "start", "killed"); code != 1 || !strings.Contains(out, "every node is running") {
		t.Errorf("start killed with every node up: exit %d, %s", code, out)
	}
	must("raft", "lab", "fault", name, "partition", "1", "2,3")
	must("raft", "lab", "fault", name, "heal")
	for _, bad := range [][]string{
		{"raft", "lab", "fault", name, "partition", "1"},
		{"raft", "lab", "fault", name, "kill", "x"},
		{"raft", "lab", "fault", name, "start", "leader"},
		{"raft", "lab", "fault", name, "net"},
		{"raft", "lab", "fault", name, "net", "--loss", "2"},
		{"raft", "lab", "up", "--nodes", "4"},
		{"raft", "lab", "up", "--name", "bad-name"},
		{"bench", "raft", "--scenarios", "nope"},
		{"bench", "raft", "--election-ticks", "0"},
		{"bench", "raft", "--tp-nodes", "4"},
		{"bench", "raft", "--trials", "0"},
	} {
		if out, code := kedge(bad...); code != 2 {
			t.Errorf("kedge %s: exit %d, want 2\n%s", strings.Join(bad, " "), code, out)
		}
	}

	// A supervisor killed with -9: cleanup sees its cluster as a dead owner's leftover, and
	// 'down' removes the nodes, namespaces and directory by hand.
	if err := syscall.Kill(info.Supervisor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	running := func(pid int) bool { // a killed orphan may stay a zombie for a while
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		i := strings.LastIndexByte(string(b), ')')
		return err == nil && i > 0 && i+2 < len(b) && b[i+2] != 'Z'
	}
	for deadline := time.Now().Add(5 * time.Second); running(info.Supervisor); {
		if time.Now().After(deadline) {
			t.Fatal("supervisor still alive after SIGKILL")
		}
		time.Sleep(5 * time.Millisecond) // polling the process's end
	}
	// (The lock goes when the last thread of the killed process is gone, which can be a
	// little after its leader shows as a zombie.)
	for deadline := time.Now().Add(10 * time.Second); ; {
		out := must("cleanup", "--dry-run")
		if strings.Contains(out, "would remove raft lab cluster "+info.Dir) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cleanup --dry-run does not list the dead supervisor's cluster:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond) // polling the owner's lock
	}
	out = must("raft", "lab", "down", name)
	downDone = true
	if !strings.Contains(out, "supervisor unreachable") {
		t.Errorf("down without supervisor: %s", out)
	}
	for _, n := range info.Nodes {
		if running(n.PID) {
			if cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n.PID)); strings.Contains(string(cl), info.Config) {
				t.Errorf("node %d (pid %d) still running after down", n.ID, n.PID)
			}
		}
	}
	if _, err := os.Stat(info.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after down (%v)", info.Dir, err)
	}
	if names, _ := lab.ListPersistent(); contains(names, name) {
		t.Errorf("namespaces of %s still there after down", name)
	}
}
