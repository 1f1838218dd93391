package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kedge-dev/kedge/internal/agent"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// TestAgentCheckWithoutRoot: 'kedge agent check' validates a config as an unprivileged user
// (nobody): 0 for the packaged default, 2 with the typo named for a mistyped key.
func TestAgentCheckWithoutRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the check as another, unprivileged user")
	}
	dir, err := os.MkdirTemp("", "kedge-agent-check-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "kedge")
	for src, dst := range map[string]string{bpftest.KedgeBinary(t): bin, "../../deploy/kedge.yaml": filepath.Join(dir, "kedge.yaml"),
		"testdata/agent-typo.yaml": filepath.Join(dir, "typo.yaml")} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	check := func(file string) (int, string) {
		cmd := exec.Command(bin, "agent", "check", filepath.Join(dir, file))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatalf("run as nobody: %v", err)
		}
		return 0, string(out)
	}
	if code, out := check("kedge.yaml"); code != 0 || !strings.Contains(out, "valid") {
		t.Errorf("check of the packaged config as nobody: exit %d: %s", code, out)
	}
	if code, out := check("typo.yaml"); code != exitUsage || !strings.Contains(out, `did you mean "address"?`) {
		t.Errorf("check of a mistyped config as nobody: exit %d: %s", code, out)
	}
}

// TestHedgeStatusPointsAtAgent: with no 'kedge hedge run' but a live agent running hedgers,
// hedge status and stats say where the agent's hedgers are (exit 0).
func TestHedgeStatusPointsAtAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an owner record under /run/kedge for the agent's status")
	}
	dir := t.TempDir()
	st := agent.Status{PID: os.Getpid(), Listen: "127.0.0.1:9464", Units: []agent.UnitStatus{
		{Kind: "hedge", Interface: "eth0", Attached: true}, {Kind: "pping", Interface: "eth0", Attached: true}}}
	if err := runstate.WriteStatus(dir, "agent", runstate.SelfID(), st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("no 'kedge hedge run' running; kedge agent (pid %d) runs 1 hedger(s): their counters are at http://127.0.0.1:9464/metrics", os.Getpid())
	for _, cmd := range []string{"status", "stats"} {
		if code, stdout, stderr := runCLI(t, "", "hedge", cmd, "--run-dir", dir); code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("hedge %s: exit %d: %s%s\nwant %q", cmd, code, stdout, stderr, want)
		}
	}
}
