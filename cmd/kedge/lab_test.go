package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate/runstatetest"
)

// runCLI runs the kedge command tree in-process, as main does, and returns the exit code,
// stdout and stderr (the command's own and run's "kedge: ..." line).
func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	root := newRootCmd()
	for _, fn := range subcmdFns {
		root.AddCommand(fn())
	}
	var out, errb bytes.Buffer
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errb)

	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stderr
	os.Stderr = f
	code = run(root, args)
	os.Stderr = saved
	runErr, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String() + string(runErr)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
}

// TestHelpHasExamples checks that every command documents examples.
func TestHelpHasExamples(t *testing.T) {
	root := newRootCmd()
	for _, fn := range subcmdFns {
		root.AddCommand(fn())
	}
	mine := map[string]bool{"probe": true, "cleanup": true, "lab": true, "demo": true, "sg": true}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			top := strings.Fields(sub.CommandPath())[1]
			if mine[top] && !sub.Hidden && sub.Example == "" {
				t.Errorf("%s --help has no examples", sub.CommandPath())
			}
			walk(sub)
		}
	}
	walk(root)
}

func TestLabCLI(t *testing.T) {
	requireRoot(t)
	name := fmt.Sprintf("cli%d", os.Getpid())
	t.Cleanup(func() { _, _ = lab.Down(name) })

	code, stdout, stderr := runCLI(t, "", "lab", "up", "--name", name, "--hosts", "a,b", "--fabric", "router", "-o", "json")
	if code != 0 {
		t.Fatalf("lab up: exit %d: %s", code, stderr)
	}
	var v labView
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("lab up -o json: %v\n%s", err, stdout)
	}
	if v.Fabric != "router" || len(v.Hosts) != 2 || v.Hosts[1].IPv4 != "198.18.2.2" || v.Hosts[1].Gateway4 != "198.18.2.1" {
		t.Errorf("lab up -o json = %+v", v)
	}

	for _, tc := range []struct {
		name     string
		stdin    string
		args     []string
		code     int
		contains string
	}{
		{"exec", "", []string{"lab", "exec", name, "a", "--", "/bin/sh", "-c", "cat /proc/net/dev"}, 0, "eth0:"},
		{"exec without dash", "", []string{"lab", "exec", name, "b", "/bin/sh", "-c", "echo $0", "x"}, 0, "x"},
		{"exec exit status", "", []string{"lab", "exec", name, "a", "--", "/bin/sh", "-c", "exit 7"}, 7, ""},
		{"exec unknown host", "", []string{"lab", "exec", name, "zz", "--", "true"}, exitUsage, ""},
		{"exec unknown lab", "", []string{"lab", "exec", "nolab" + name, "a", "--", "true"}, exitUsage, ""},
		{"shell", "echo host=$KEDGE_HOST; exit\n", []string{"lab", "shell", name, "b"}, 0, "host=b"},
		{"list", "", []string{"lab", "list"}, 0, "198.18.1.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SHELL", "/bin/sh")
			code, stdout, stderr := runCLI(t, tc.stdin, tc.args...)
			if code != tc.code || !strings.Contains(stdout, tc.contains) {
				t.Errorf("kedge %s: exit %d (want %d), stdout %q (want %q), stderr %q",
					strings.Join(tc.args, " "), code, tc.code, stdout, tc.contains, stderr)
			}
		})
	}

	// SIGTERM to 'kedge lab exec' reaches the command: kedge waits for it and exits with it,
	// leaving nothing running in the lab.
	t.Run("exec passes SIGTERM on", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "pid")
		c := exec.Command(bpftest.KedgeBinary(t), "lab", "exec", name, "b", "--", "/bin/sh", "-c", "echo $$ > "+pidFile+"; exec sleep 60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		child := 0
		for deadline := time.Now().Add(10 * time.Second); child == 0; time.Sleep(20 * time.Millisecond) { // the command has started
			b, _ := os.ReadFile(pidFile)
			child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			if time.Now().After(deadline) {
				_ = c.Process.Kill()
				t.Fatal("the command in the lab did not start")
			}
		}
		if err := c.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- c.Wait() }()
		select {
		case err := <-waited:
			if c.ProcessState.ExitCode() != exitError {
				t.Errorf("kedge lab exec after SIGTERM: %v, want exit %d (its command killed by the signal)", err, exitError)
			}
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Fatal("kedge lab exec still runs 10 s after SIGTERM")
		}
		if err := syscall.Kill(child, 0); err == nil {
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Errorf("the command (pid %d) outlived kedge lab exec's SIGTERM", child)
		}
	})

	// A process still running in the lab: down names it and removes nothing; --kill stops it.
	l, err := lab.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	sleeper := l.Host("b").Command("sleep", "60")
	if err := l.Host("b").Start(sleeper); err != nil {
		t.Fatal(err)
	}
	l.Release()
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()
	code, _, stderr = runCLI(t, "", "lab", "down", name)
	if want := fmt.Sprintf("pid %d in %s: sleep 60", sleeper.Process.Pid, lab.PersistentPrefix+name+"-b"); code != exitError || !strings.Contains(stderr, want) {
		t.Errorf("lab down with a process in it: exit %d, stderr %q; want exit 1 naming %q", code, stderr, want)
	}
	if _, err := lab.Open(name); err != nil {
		t.Fatalf("the lab went although a process ran in it: %v", err)
	}
	code, stdout, stderr = runCLI(t, "", "lab", "down", name, "--kill")
	if code != 0 || !strings.Contains(stdout, fmt.Sprintf("stopping pid %d (sleep)", sleeper.Process.Pid)) {
		t.Fatalf("lab down --kill: exit %d: %s%s", code, stdout, stderr)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Errorf("the process in the lab still runs after lab down --kill")
	}
	_, stdout, _ = runCLI(t, "", "lab", "list", "-o", "json")
	var labs []labView
	if err := json.Unmarshal([]byte(stdout), &labs); err != nil {
		t.Fatalf("lab list -o json: %v\n%s", err, stdout)
	}
	for _, l := range labs {
		if l.Name == name {
			t.Errorf("lab %s still listed after down", name)
		}
	}
	if code, _, _ := runCLI(t, "", "lab", "down", name); code != exitUsage {
		t.Errorf("second lab down: exit %d, want %d (no such lab)", code, exitUsage)
	}
}

// TestCleanupCLI: --dry-run lists and keeps, a run removes what a dead owner left, and what
// cannot be removed is reported: exit 1, or with --quiet on stderr and exit 0 (make demo
// goes on). In private namespaces: it sees and removes nothing of other runs.
func TestCleanupCLI(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	dead := "kedge-99999999-clitest"
	ns, err := netnsx.New(dead)
	if err != nil {
		t.Fatalf("create %s: %v", dead, err)
	}
	ns.Handle.Close()
	deadPath := filepath.Join(netnsx.Dir, dead)

	code, stdout, stderr := runCLI(t, "", "cleanup", "--dry-run")
	if code != exitOK || !strings.Contains(stdout, "would remove netns "+dead+" (legacy name: no pid 99999999") {
		t.Errorf("cleanup --dry-run: exit %d, output %q %s", code, stdout, stderr)
	}
	if _, err := os.Stat(deadPath); err != nil {
		t.Fatalf("--dry-run removed %s: %v", dead, err)
	}

	code, stdout, stderr = runCLI(t, "", "cleanup", "-o", "json")
	if code != exitOK {
		t.Fatalf("cleanup: exit %d: %s", code, stderr)
	}
	var res struct {
		Namespaces, Filters, PinDirs, Labs []string
		Items                              []struct{ Kind, Name, Action, Reason string }
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Namespaces == nil || res.Labs == nil || res.Items == nil {
		t.Fatalf("cleanup -o json: %v (every list must be present, [] when empty)\n%s", err, stdout)
	}
	if !slices.Contains(res.Namespaces, dead) {
		t.Errorf("namespaces = %v, want %s", res.Namespaces, dead)
	}
	if _, err := os.Stat(deadPath); !os.IsNotExist(err) {
		t.Errorf("%s still present after cleanup (stat: %v)", dead, err)
	}
	if code, stdout, _ := runCLI(t, "", "cleanup", "--quiet"); code != exitOK || stdout != "" {
		t.Errorf("cleanup --quiet: exit %d, output %q; want 0 and nothing", code, stdout)
	}

	// A dead owner's pin directory with something mounted on it cannot be removed (EBUSY).
	stuck := filepath.Join(bpfx.PinRoot, "stuck-99999999")
	if err := os.MkdirAll(stuck, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", stuck, "tmpfs", 0, ""); err != nil {
		t.Fatalf("mount on %s: %v", stuck, err)
	}
	code, stdout, stderr = runCLI(t, "", "cleanup")
	if code != exitError || !strings.Contains(stdout, "cannot remove pin dir "+stuck+": ") || !strings.Contains(stderr, "1 leftover(s) could not be removed") {
		t.Errorf("cleanup with an unremovable leftover: exit %d, stdout %q, stderr %q; want exit %d naming it", code, stdout, stderr, exitError)
	}
	code, stdout, stderr = runCLI(t, "", "cleanup", "--quiet")
	if code != exitOK || stdout != "" || !strings.Contains(stderr, "cannot remove pin dir "+stuck) {
		t.Errorf("cleanup --quiet with an unremovable leftover: exit %d, stdout %q, stderr %q; want exit 0, the reason on stderr", code, stdout, stderr)
	}
	if err := unix.Unmount(stuck, 0); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "", "cleanup"); code != exitOK {
		t.Errorf("cleanup once the mount is gone: exit %d: %s", code, stderr)
	}
}

// The sequence of issue 10's first fault, in both orders, in private mount and network
// namespaces with a fresh /run (where /run/netns does not exist yet, as after boot): kedge's
// labs and iproute2's namespaces side by side, each removable by its own tool, cleanup
// clean afterwards, and ip's namespace usable throughout.
func TestNetnsInteropKedgeFirst(t *testing.T) { testNetnsInterop(t, false) }
func TestNetnsInteropIPFirst(t *testing.T)    { testNetnsInterop(t, true) }

func netnsDirMounts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	// Only those above our fresh /run (the machine's /run/netns lies beneath it).
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 4 && f[4] == "/run":
			out = nil
		case len(f) > 4 && f[4] == netnsx.Dir:
			out = append(out, line)
		}
	}
	return out
}

func testNetnsInterop(t *testing.T, ipFirst bool) {
	requireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	if runstatetest.Private(t) {
		return
	}
	if _, err := os.Stat(netnsx.Dir); !os.IsNotExist(err) {
		t.Fatalf("%s exists in a fresh /run (stat: %v)", netnsx.Dir, err)
	}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	kedge := func(args ...string) {
		t.Helper()
		if code, stdout, stderr := runCLI(t, "", args...); code != exitOK {
			t.Fatalf("kedge %s: exit %d: %s%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	if ipFirst {
		ip("netns", "add", "y")
	}
	kedge("lab", "up", "--name", "x", "--hosts", "a,b")
	if !ipFirst {
		ip("netns", "add", "y")
	}
	ip("netns", "exec", "y", "ip", "link", "set", "lo", "up")
	kedge("lab", "exec", "x", "a", "--", "ip", "-br", "addr", "show", "eth0")
	// Prepared as iproute2 prepares it, whoever came first: one shared mount of /run/netns
	// over itself, never two stacked (the second would hide the first one's namespaces).
	if mounts := netnsDirMounts(t); len(mounts) != 1 || !strings.Contains(mounts[0], " shared:") {
		t.Errorf("mounts at %s: %q; want one, shared", netnsx.Dir, mounts)
	}
	kedge("lab", "down", "x")
	kedge("cleanup")
	kedge("cleanup", "--quiet")
	ip("netns", "exec", "y", "ip", "link", "show", "lo")
	ip("netns", "del", "y")
	entries, err := os.ReadDir(netnsx.Dir)
	if err != nil || len(entries) != 0 {
		t.Errorf("%s after both tools removed theirs: %v, %v", netnsx.Dir, entries, err)
	}
}

// TestLabPrefixAndSubnets: a lab under another name prefix and address plan is made, found,
// used and removed through the same --prefix; bad values are usage errors.
func TestLabPrefixAndSubnets(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	code, stdout, stderr := runCLI(t, "", "lab", "--prefix", "t1-", "up", "--name", "x", "--hosts", "a,b", "--fabric", "router",
		"--subnet", "10.77.0.0/16", "--subnet6", "fd00:77::/48", "-o", "json")
	if code != exitOK {
		t.Fatalf("lab up: exit %d: %s", code, stderr)
	}
	var up labView
	if err := json.Unmarshal([]byte(stdout), &up); err != nil {
		t.Fatalf("lab up -o json: %v\n%s", err, stdout)
	}
	want := []hostView{
		{Host: "a", Namespace: "t1-x-a", IPv4: "10.77.1.2", IPv6: "fd00:77:0:1::2", Gateway4: "10.77.1.1", Gateway6: "fd00:77:0:1::1"},
		{Host: "b", Namespace: "t1-x-b", IPv4: "10.77.2.2", IPv6: "fd00:77:0:2::2", Gateway4: "10.77.2.1", Gateway6: "fd00:77:0:2::1"},
	}
	check := func(what string, got []hostView) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: hosts %+v", what, got)
		}
		for i, h := range got {
			w := want[i]
			if h.Host != w.Host || h.Namespace != w.Namespace || h.IPv4 != w.IPv4 || h.IPv6 != w.IPv6 || h.Gateway4 != w.Gateway4 || h.Gateway6 != w.Gateway6 {
				t.Errorf("%s: host %+v, want %+v", what, h, w)
			}
		}
	}
	check("lab up", up.Hosts)

	code, stdout, stderr = runCLI(t, "", "lab", "--prefix", "t1-", "list", "-o", "json")
	var labs []labView
	if err := json.Unmarshal([]byte(stdout), &labs); code != exitOK || err != nil || len(labs) != 1 {
		t.Fatalf("lab --prefix t1- list: exit %d, %v: %s%s", code, err, stdout, stderr)
	}
	check("lab list", labs[0].Hosts)
	if code, stdout, _ := runCLI(t, "", "lab", "list", "-o", "json"); code != exitOK || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("lab list under the default prefix: exit %d, %s; want no labs", code, stdout)
	}
	if code, stdout, stderr := runCLI(t, "", "lab", "--prefix", "t1-", "exec", "x", "a", "--", "ip", "-br", "addr", "show", "eth0"); code != exitOK || !strings.Contains(stdout, "10.77.1.2/24") {
		t.Errorf("lab exec: exit %d: %s%s", code, stdout, stderr)
	}
	for _, bad := range [][]string{
		{"lab", "up", "--name", "y", "--hosts", "a", "--subnet", "10.0.0.0/8"},
		{"lab", "up", "--name", "y", "--hosts", "a", "--subnet6", "fd00::/64"},
		{"lab", "--prefix", "kedge-123-", "up", "--name", "y", "--hosts", "a"},
		{"lab", "--prefix", "a/b", "list"},
	} {
		if code, _, stderr := runCLI(t, "", bad...); code != exitUsage {
			t.Errorf("kedge %s: exit %d (%s), want %d", strings.Join(bad, " "), code, stderr, exitUsage)
		}
	}
	if code, _, stderr := runCLI(t, "", "lab", "--prefix", "t1-", "down", "x"); code != exitOK {
		t.Fatalf("lab down: exit %d: %s", code, stderr)
	}
	if entries, _ := os.ReadDir(netnsx.Dir); len(entries) != 0 {
		t.Errorf("namespaces left after lab down: %v", entries)
	}
}
