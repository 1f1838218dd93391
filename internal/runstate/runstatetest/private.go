// Package runstatetest runs a test where it cannot disturb the machine's run state: in a
// child process with mount and network namespaces of its own, a fresh /run (as after boot:
// no /run/netns, no /run/kedge) and a fresh BPF filesystem. Tests of cleanup and of
// /run/netns handling use it, so they neither see nor remove what other runs own.
package runstatetest

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const envKey = "KEDGE_PRIVATE_TEST"

// InChild reports whether this process is a Private child.
func InChild() bool { return os.Getenv(envKey) != "" }

// Private re-runs the calling (top-level) test in a child process with its own mount and
// network namespaces, a tmpfs on /run and a new bpffs on /sys/fs/bpf. In the parent it
// waits for the child, fails the test when the child fails, and returns true: the test
// returns at once. In the child it sets the namespaces up and returns false: the test goes on
// there. Needs root (the caller skips otherwise).
//
//	if runstatetest.Private(t) {
//		return
//	}
func Private(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envKey) == t.Name() {
		setup(t)
		return false
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("find the test binary: %v", err)
	}
	cmd := exec.Command(exe, "-test.run", "^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envKey+"="+t.Name())
	// CLONE_NEWNS in Unshareflags also makes / recursively private in the child first, so
	// nothing mounted there propagates back.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("in private mount and network namespaces:\n%s", out)
	if err != nil {
		t.Fatalf("test in private namespaces: %v", err)
	}
	if reason, skipped := childSkip(string(out), t.Name()); skipped {
		t.Skipf("skipped in private namespaces: %s", reason)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("test in private namespaces did not report PASS")
	}
	return true
}

// childSkip reports whether the child's go test -v output skipped the test, and the reason
// it logged last before "--- SKIP" (a matrix guest, for one, has no Go toolchain to build
// what the test runs).
func childSkip(out, name string) (reason string, skipped bool) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "--- SKIP: "+name+" ") {
			continue
		}
		reason = "(no reason given)"
		for j := i - 1; j >= 0; j-- {
			if e := strings.TrimSpace(lines[j]); e != "" && !strings.HasPrefix(e, "===") {
				if _, r, ok := strings.Cut(e, ": "); ok {
					reason = r
				}
				break
			}
		}
		return reason, true
	}
	return "", false
}

func setup(t *testing.T) {
	t.Helper()
	if err := unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("mount a fresh /run: %v", err)
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount a fresh bpffs: %v", err)
	}
}
