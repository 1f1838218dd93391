package cleanup

import (
	"bufio"
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

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
	"github.com/kedge-dev/kedge/internal/runstate/runstatetest"
)

// runEnv makes this test binary a kedge run: it creates a namespace, a pin directory and a
// status file for its owner, prints "<owner> <namespace> <pin dir> <status file>" and
// waits to be killed.
const runEnv = "KEDGE_CLEANUP_TEST_RUN"

func TestMain(m *testing.M) {
	if os.Getenv(runEnv) != "" {
		if err := fakeRun(); err != nil {
			fmt.Fprintln(os.Stderr, "fake run:", err)
			os.Exit(1)
		}
		// Wait to be killed. Not select {}: with no timer or other goroutine pending, the
		// runtime calls that a deadlock and exits (seen in CI); a sleep holds a timer.
		for {
			time.Sleep(time.Hour)
		}
	}
	os.Exit(m.Run())
}

func fakeRun() error {
	ns, err := netnsx.New(netnsx.OwnedName("pidns"))
	if err != nil {
		return err
	}
	pin, err := bpfx.PinDir("cleanuptest")
	if err != nil {
		return err
	}
	o, err := runstate.Self()
	if err != nil {
		return err
	}
	if err := runstate.WriteStatus("", "test", o.ID, map[string]int{"pid": os.Getpid()}); err != nil {
		return err
	}
	_, err = fmt.Printf("%s %s %s %s\n", o.ID, ns.Name, pin, runstate.StatusPath("", "test", o.ID))
	return err
}

// TestOwnershipAcrossPIDNamespaces: a run in another PID namespace (a container's kedge, as
// `unshare -p -f` makes it) has a pid that means nothing here - pid 1 of its namespace. The
// old rule (kill(pid, 0)) would judge it by this namespace's pid 1. Cleanup must keep its
// namespace, pin directory and status file while it runs, and remove them once it is
// SIGKILLed. In private mount and network namespaces with a fresh /run.
func TestOwnershipAcrossPIDNamespaces(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--pid", "--fork", exe, "-test.run", "^$")
	cmd.Env = append(os.Environ(), runEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start unshare: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the run in another PID namespace did not start: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 4 {
		t.Fatalf("run printed %q", line)
	}
	id, nsName, pin, status := f[0], f[1], f[2], f[3]
	if pid, _, _ := runstate.ParseID(id); pid != 1 {
		t.Fatalf("owner %s: the run is not pid 1 of a PID namespace of its own", id)
	}
	things := []string{filepath.Join(netnsx.Dir, nsName), pin, status}

	res, err := Run(Options{})
	if err != nil {
		t.Fatalf("cleanup while the run lives: %v", err)
	}
	for _, p := range things {
		if !exists(p) {
			t.Errorf("cleanup removed %s of a live run in another PID namespace", p)
		}
	}
	for _, it := range res.Items {
		if it.Owner == id && (it.Action != Kept || it.State != "alive") {
			t.Errorf("item %+v: want kept, owner alive", it)
		}
	}

	// SIGKILL the run itself (the child unshare forked), not unshare.
	runPID := child(t, cmd.Process.Pid)
	if err := syscall.Kill(runPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the run: %v", err)
	}
	_ = cmd.Wait()

	res, err = Run(Options{})
	if err != nil {
		t.Fatalf("cleanup after the run was killed: %v", err)
	}
	for _, p := range things {
		if exists(p) {
			t.Errorf("%s of the killed run is still there", p)
		}
	}
	if !slices.Contains(res.Namespaces, nsName) || !slices.Contains(res.PinDirs, pin) || !slices.Contains(res.StatusFiles, status) {
		t.Errorf("cleanup reported namespaces %v, pin dirs %v, status files %v; want %s, %s, %s",
			res.Namespaces, res.PinDirs, res.StatusFiles, nsName, pin, status)
	}
	if !slices.Contains(res.Owners, id) {
		t.Errorf("owner record of %s not removed: %v", id, res.Owners)
	}
	for _, it := range res.Items {
		if it.Owner == id {
			t.Logf("%s %s: %s", it.Action, it.Name, it.Reason)
		}
	}
}

// child returns the pid of parent's only child (unshare --fork's), polling until it is there.
func child(t *testing.T, parent int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", parent, parent))
		if f := strings.Fields(string(b)); err == nil && len(f) == 1 {
			pid, err := strconv.Atoi(f[0])
			if err == nil {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no child of unshare (pid %d): %v %q", parent, err, b)
		}
		time.Sleep(10 * time.Millisecond) // polling /proc with a deadline
	}
}
