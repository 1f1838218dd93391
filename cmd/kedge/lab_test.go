package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/lab"
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
		{"exec unknown lab", "", []string{"lab", "exec", "nolab" + name, "a", "--", "true"}, exitError, ""},
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

	if code, _, stderr := runCLI(t, "", "lab", "down", name); code != 0 {
		t.Fatalf("lab down: exit %d: %s", code, stderr)
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
	if code, _, _ := runCLI(t, "", "lab", "down", name); code != exitError {
		t.Errorf("second lab down: exit %d, want %d", code, exitError)
	}
}

func TestCleanupCLI(t *testing.T) {
	requireRoot(t)
	dead := fmt.Sprintf("%s-99999999-clitest%d", lab.Prefix, os.Getpid())
	ns, err := lab.NewNetns(dead)
	if err != nil {
		t.Fatalf("create %s: %v", dead, err)
	}
	ns.Handle.Close()
	t.Cleanup(func() { _ = os.Remove(filepath.Join(lab.NetnsDir, dead)) })

	code, stdout, stderr := runCLI(t, "", "cleanup", "-o", "json")
	if code != 0 {
		t.Fatalf("cleanup: exit %d: %s", code, stderr)
	}
	var res struct{ Namespaces, Filters, PinDirs, Labs []string }
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Namespaces == nil || res.Labs == nil {
		t.Fatalf("cleanup -o json: %v (every list must be present, [] when empty)\n%s", err, stdout)
	}
	// Whether this run or a concurrent cleaner (another test package) removed it, it must be gone.
	if _, err := os.Stat(filepath.Join(lab.NetnsDir, dead)); !os.IsNotExist(err) {
		t.Errorf("%s still present after cleanup (stat: %v); output %s", dead, err, stdout)
	}
	if code, stdout, _ := runCLI(t, "", "cleanup", "--quiet"); code != 0 || stdout != "" {
		t.Errorf("cleanup --quiet: exit %d, output %q; want 0 and nothing", code, stdout)
	}
}
