package runstate

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A helper process (this test binary, re-run) that creates an owner, prints its ID and
// waits to be killed: a run that ends without cleaning up.
const helperEnv = "KEDGE_RUNSTATE_TEST_OWNER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		Dir = dir
		o, err := Self()
		if err != nil {
			os.Stderr.WriteString("helper: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString(o.ID + "\n")
		// Wait to be killed. Not select {}: with no timer or other goroutine pending, the
		// runtime calls that a deadlock and exits (seen in CI); a sleep holds a timer.
		for {
			time.Sleep(time.Hour)
		}
	}
	os.Exit(m.Run())
}

func useDir(t *testing.T) {
	t.Helper()
	old := Dir
	Dir = t.TempDir()
	t.Cleanup(func() { Dir = old })
}

func TestParseID(t *testing.T) {
	for _, tc := range []struct {
		id             string
		pid            int
		legacy, wantOK bool
	}{
		{"4242_9f3a1c", 4242, false, true},
		{"1_000000", 1, false, true},
		{"4242", 4242, true, true},
		{"", 0, false, false},
		{"0_9f3a1c", 0, false, false},
		{"4242_9F3A1C", 0, false, false},
		{"4242_9f3a1", 0, false, false},
		{"4242_9f3a1c_x", 0, false, false},
		{"-1", 0, false, false},
		{"lab", 0, false, false},
		{"12345678901_9f3a1c", 0, false, false},
	} {
		pid, legacy, ok := ParseID(tc.id)
		if ok != tc.wantOK || (ok && (pid != tc.pid || legacy != tc.legacy)) {
			t.Errorf("ParseID(%q) = %d, %v, %v; want %d, %v, %v", tc.id, pid, legacy, ok, tc.pid, tc.legacy, tc.wantOK)
		}
	}
}

func TestOwnerLifecycle(t *testing.T) {
	useDir(t)
	o, err := NewOwner()
	if err != nil {
		t.Fatal(err)
	}
	if _, legacy, ok := ParseID(o.ID); !ok || legacy {
		t.Fatalf("owner id %q does not parse as a runstate id", o.ID)
	}
	rec, err := ReadRecord(o.ID)
	if err != nil || rec.PID != os.Getpid() || rec.StartTicks == 0 || !strings.HasPrefix(rec.PIDNS, "pid:[") {
		t.Errorf("record %+v, %v", rec, err)
	}
	// Judged through a second open file: flock conflicts between open files, even in one process.
	if v := Judge(o.ID); v.State != Alive {
		t.Errorf("live owner judged %v: %s", v.State, v.Reason)
	}
	if ok, err := RemoveRecord(o.ID); ok || err != nil {
		t.Errorf("RemoveRecord of a live owner = %v, %v; want refused", ok, err)
	}
	ids, err := Records()
	if err != nil || !slices.Contains(ids, o.ID) {
		t.Errorf("Records = %v, %v; want it to contain %s", ids, err, o.ID)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if v := Judge(o.ID); v.State != Unknown {
		t.Errorf("closed owner (record gone) judged %v, want unknown: %s", v.State, v.Reason)
	}
	if entries, _ := os.ReadDir(ownersDir()); len(entries) != 0 {
		t.Errorf("owner directory not empty after Close: %v", entries)
	}
}

// A run killed with SIGKILL cannot clean up: its record stays, but its lock goes with it.
func TestKilledOwnerIsDead(t *testing.T) {
	useDir(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	id := strings.TrimSpace(line)
	if v := Judge(id); v.State != Alive {
		t.Errorf("running helper judged %v: %s", v.State, v.Reason)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	v := Judge(id)
	if v.State != Dead {
		t.Fatalf("killed helper judged %v: %s", v.State, v.Reason)
	}
	t.Logf("verdict: %s", v.Reason)
	if ok, err := RemoveRecord(id); !ok || err != nil {
		t.Errorf("RemoveRecord of a dead owner = %v, %v", ok, err)
	}
}

func TestLegacyIDsUseThePIDRule(t *testing.T) {
	if v := Judge("99999999"); v.State != Dead {
		t.Errorf("legacy id of no process judged %v", v.State)
	}
	if v := Judge("1"); v.State != Alive {
		t.Errorf("legacy id of pid 1 judged %v", v.State)
	}
}

func TestStatusFiles(t *testing.T) {
	useDir(t)
	o, err := NewOwner()
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := WriteStatus("", "hedge", o.ID, map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if err := WriteStatus("", "Bad.Name", o.ID, 1); err == nil {
		t.Error("WriteStatus accepted capability name Bad.Name")
	}
	for _, name := range []string{"hedge.4242.json", ".hedge.4242.123456.tmp", ".sg.4242_9f3a1c.99.tmp", "notes.txt", "hedge.x.json"} {
		if err := os.WriteFile(filepath.Join(Dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, err := Statuses("", "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, f.Capability+" "+f.Owner+" "+map[bool]string{true: "tmp", false: "file"}[f.Temp])
	}
	slices.Sort(got)
	want := []string{"hedge " + o.ID + " file", "hedge 4242 file", "hedge 4242 tmp", "sg 4242_9f3a1c tmp"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Statuses = %v, want %v", got, want)
	}
	if hedge, _ := Statuses("", "sg"); len(hedge) != 1 {
		t.Errorf("Statuses of sg = %v, want one", hedge)
	}
	if err := RemoveStatus("", "hedge", o.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(StatusPath("", "hedge", o.ID)); !os.IsNotExist(err) {
		t.Errorf("status file still there after RemoveStatus: %v", err)
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering the status-file kind again did not panic")
		}
	}()
	Register(Cleaner{Kind: KindStatus, List: func(Scope) ([]Leftover, error) { return nil, nil }})
}

// TestLockDecidesNotThePID is the fault the owner lock fixes: a run in another PID
// namespace (another container's kedge, a DaemonSet) records a pid that means nothing here,
// so "kill(pid, 0) fails" must not make it dead. While its lock is held it is alive whatever
// its pid says; once the lock is free it is dead.
func TestLockDecidesNotThePID(t *testing.T) {
	useDir(t)
	const foreignPID = 4194303 // above any pid_max: no such process in this PID namespace
	if v := judgePID(foreignPID); v.State != Dead {
		t.Fatalf("old pid rule judged pid %d %v, want dead (the test relies on it)", foreignPID, v.State)
	}
	rec := Record{ID: "4194303_c0ffee", PID: foreignPID, PIDNS: "pid:[1]", Started: time.Now().UTC()}
	if err := os.MkdirAll(ownersDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(recordPath(rec.ID), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// The "other container's run": a separate open file description holding the lock.
	f, err := os.Open(recordPath(rec.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if v := Judge(rec.ID); v.State != Alive {
		t.Fatalf("locked record of a foreign pid judged %v (%s), want alive", v.State, v.Reason)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if v := Judge(rec.ID); v.State != Dead {
		t.Fatalf("unlocked record judged %v (%s), want dead", v.State, v.Reason)
	}
}
