package bench

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

func TestReadCPU(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 5 50 1000 7 3 20 2 0 0\ncpu0 50 2 25 500 3 1 10 1 0 0\nintr 1 2 3\n"
	if err := os.WriteFile(path, []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := readCPUFrom(path)
	if err != nil {
		t.Fatal(err)
	}
	// busy = user+nice+system+irq+softirq+steal = 180 ticks of 10 ms.
	if c.Busy != 1800*time.Millisecond || c.Softirq != 200*time.Millisecond {
		t.Errorf("busy %v softirq %v, want 1.8s and 200ms", c.Busy, c.Softirq)
	}
	per, err := readPerCPUFrom(path)
	if err != nil || len(per) != 1 || per[0].Busy != 890*time.Millisecond || per[0].Softirq != 100*time.Millisecond {
		t.Errorf("per-CPU %+v, %v: want cpu0 busy 890ms softirq 100ms", per, err)
	}
	if err := os.WriteFile(path, []byte("cpu  1 2 x 4 5 6 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readCPUFrom(path); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("malformed line: error %v", err)
	}
	if _, err := readCPUFrom(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing file: no error")
	}
	// The real file parses and counts forward.
	a, err := ReadCPU()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ReadCPU()
	if d := b.Sub(a); d.Busy < 0 || d.Wall <= 0 {
		t.Errorf("/proc/stat went backwards: %+v", d)
	}
}

// TestProcessHarness runs real processes in a lab host: a failing client's stderr reaches
// the error, a cancelled run is killed, and a started server stops on SIGTERM.
func TestProcessHarness(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	l, err := lab.Up(lab.Spec{Name: "harness", Fabric: lab.Bridge, Hosts: []string{"h"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	h := l.Host("h")

	var out strings.Builder
	if err := RunProcess(context.Background(), h, &out, "/bin/sh", "-c", "echo $KEDGE_HOST; ip -o link show eth0"); err != nil ||
		!strings.Contains(out.String(), "eth0") {
		t.Errorf("RunProcess in %s: %v, output %q", h.Name, err, out.String())
	}
	err = RunProcess(context.Background(), h, io.Discard, "/bin/sh", "-c", "echo broken >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exit status 3: broken") {
		t.Errorf("failing process: %v, want its status and stderr", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunProcess(ctx, h, io.Discard, "sleep", "60") }()
	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Errorf("cancelled run: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled run not killed")
	}

	stop, err := StartProcess(h, "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second): // SIGTERM ends sleep at once; SIGKILL follows after 5 s
		t.Fatal("stop did not end the process")
	}
}

func TestProcCPU(t *testing.T) {
	// The name may hold spaces and parentheses; utime 250 + stime 50 ticks = 3 s.
	line := "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 10 0 0\n"
	if d, err := parseProcStatCPU(line); err != nil || d != 3*time.Second {
		t.Errorf("parse: %v, %v; want 3s", d, err)
	}
	for _, bad := range []string{"42 no name", "42 (a) S 1 2", "42 (a) S 1 42 42 0 -1 4194560 100 0 0 0 x 50 0"} {
		if _, err := parseProcStatCPU(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if _, err := ProcCPU(os.Getpid()); err != nil {
		t.Error(err)
	}
	if d, err := SelfCPU(); err != nil || d <= 0 {
		t.Errorf("own CPU %v, %v", d, err)
	}
	if pids, err := KsoftirqdPIDs(); err != nil || len(pids) == 0 {
		t.Errorf("ksoftirqd: %v, %v", pids, err)
	}
}

// TestReadSteal: steal is the cpu line's eighth field, in USER_HZ ticks; a line without it
// is refused.
func TestReadSteal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	if err := os.WriteFile(path, []byte("cpu  2424309 641116 1354740 2355031 32182 0 299467 137936 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d, err := readStealFrom(path); err != nil || d != 1379360*time.Millisecond {
		t.Errorf("steal %v, %v: want 1379.36s", d, err)
	}
	if err := os.WriteFile(path, []byte("cpu  1 2 3 4 5 6 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readStealFrom(path); err == nil {
		t.Error("a cpu line of seven fields read")
	}
	if _, err := ReadSteal(); err != nil { // this machine's
		t.Error(err)
	}
}
