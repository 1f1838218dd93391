package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// TestRaftLabCLI runs the walkthrough of docs/raft.md with the built binary: up, a write and
// a read from the client host, kill the leader, a new leader, a write through it, down.
func TestRaftLabCLI(t *testing.T) {
	requireRoot(t)
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
	t.Cleanup(func() {
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
	must("raft", "lab", "fault", name, "start", fmt.Sprint(killed))
	must("raft", "lab", "fault", name, "partition", "1", "2,3")
	must("raft", "lab", "fault", name, "heal")
	for _, bad := range [][]string{
		{"raft", "lab", "fault", name, "partition", "1"},
		{"raft", "lab", "fault", name, "kill", "x"},
		{"raft", "lab", "fault", name, "net"},
		{"raft", "lab", "fault", name, "net", "--loss", "2"},
		{"raft", "lab", "up", "--nodes", "4"},
		{"raft", "lab", "up", "--name", "bad-name"},
	} {
		if out, code := kedge(bad...); code != 2 {
			t.Errorf("kedge %s: exit %d, want 2\n%s", strings.Join(bad, " "), code, out)
		}
	}
}
