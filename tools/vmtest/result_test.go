package main

import (
	"strings"
	"testing"
	"time"
)

// transcript feeds console lines to a fresh result, one millisecond apart.
func transcript(t *testing.T, console string) *kernelResult {
	t.Helper()
	start := time.Unix(0, 0)
	r := newKernelResult("6.1", "linux-image-x=1", start)
	now := start
	for _, line := range strings.Split(strings.TrimPrefix(console, "\n"), "\n") {
		now = now.Add(time.Millisecond)
		r.feed(cleanLine(line), now)
	}
	return r
}

// goTestOutput is real go test -v output (Go 1.26) with parallel subtests, a multi-line
// skip reason and a skip without a reason.
const goTestOutput = `=== RUN   TestA
    x_test.go:3: note a
    x_test.go:3: reason A
--- SKIP: TestA (0.00s)
=== RUN   TestB
=== RUN   TestB/sub1
    x_test.go:5: reason B/sub1
        second line
=== RUN   TestB/sub2
=== PAUSE TestB/sub2
=== RUN   TestB/sub3
=== PAUSE TestB/sub3
=== CONT  TestB/sub2
=== CONT  TestB/sub3
    x_test.go:7: bad
=== NAME  TestB/sub2
    x_test.go:6: reason B/sub2
--- FAIL: TestB (0.00s)
    --- SKIP: TestB/sub1 (0.00s)
    --- FAIL: TestB/sub3 (0.00s)
    --- SKIP: TestB/sub2 (0.00s)
=== RUN   TestC
--- PASS: TestC (0.00s)
=== RUN   TestD
--- SKIP: TestD (0.00s)
FAIL`

func TestParseGoTestOutput(t *testing.T) {
	r := transcript(t, "\x1b[2JBooting from ROM..VMTEST-BOOTED uptime=1.5\nVMTEST-BEGIN internal/x\n"+
		goTestOutput+"\nVMTEST-END internal/x rc=1\nVMTEST-DONE")
	if !r.Booted || !r.Done {
		t.Fatalf("booted=%v done=%v, want both", r.Booted, r.Done)
	}
	if len(r.Pkgs) != 1 {
		t.Fatalf("got %d packages, want 1", len(r.Pkgs))
	}
	p := r.Pkgs[0]
	if p.Pass != 1 || p.Fail != 2 || p.Skip != 4 || p.RC != 1 || !p.Ended {
		t.Errorf("pass/fail/skip/rc/ended = %d/%d/%d/%d/%v, want 1/2/4/1/true", p.Pass, p.Fail, p.Skip, p.RC, p.Ended)
	}
	want := map[string]string{
		"TestA":      "x_test.go:3: reason A",
		"TestB/sub1": "x_test.go:5: reason B/sub1 second line",
		"TestB/sub2": "x_test.go:6: reason B/sub2",
		"TestD":      noReason,
	}
	for _, s := range p.Skips {
		if want[s.Test] != s.Reason {
			t.Errorf("skip %s: reason %q, want %q", s.Test, s.Reason, want[s.Test])
		}
	}
	if got := strings.Join(p.Failed, ","); got != "TestB,TestB/sub3" {
		t.Errorf("failed = %s", got)
	}
	if r.Status() != "FAIL" || p.Status() != "FAIL" {
		t.Errorf("status kernel %s package %s, want FAIL FAIL", r.Status(), p.Status())
	}
}

func TestParsePanic(t *testing.T) {
	r := transcript(t, "VMTEST-BOOTED uptime=1\nVMTEST-BEGIN p\n=== RUN   TestHangs\n"+
		"panic: test timed out after 20s\n\trunning tests:\n\t\tTestHangs (20s)\n\ngoroutine 1 [running]:\nVMTEST-END p rc=2\nVMTEST-DONE")
	p := r.Pkgs[0]
	if want := "panic: test timed out after 20s; running TestHangs (20s)"; p.Panic != want {
		t.Errorf("panic %q, want %q", p.Panic, want)
	}
	if p.Status() != "EXIT-2" {
		t.Errorf("status %s, want EXIT-2", p.Status())
	}
}

func TestResultStatus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		console string
		finish  func(r *kernelResult)
		want    string
	}{
		{"ok", "VMTEST-BOOTED uptime=1\nVMTEST-BEGIN p\n--- PASS: TestX (0.00s)\nPASS\nVMTEST-END p rc=0\nVMTEST-DONE", nil, "ok"},
		{"binary exit without failed test", "VMTEST-BOOTED uptime=1\nVMTEST-BEGIN p\npanic: boom\nVMTEST-END p rc=2\nVMTEST-DONE", nil, "FAIL"},
		{"guest died in a binary", "VMTEST-BOOTED uptime=1\nVMTEST-BEGIN p\n=== RUN   TestX", nil, "CRASH"},
		{"never booted", "SeaBIOS", nil, "CRASH"},
		{"setup failed", "VMTEST-SETUP-FAILED insmod /lib/modules/veth.ko\nVMTEST-BOOTED uptime=1\nVMTEST-DONE", nil, "SETUP-FAILED"},
		{"initramfs cut short", "[    7.929430] Initramfs unpacking failed: write error\nVMTEST-BOOTED uptime=13\nVMTEST-BEGIN p\n/init: cd: line 41: can't cd to /src/p: No such file or directory\nVMTEST-END p rc=2\nVMTEST-DONE", nil, "SETUP-FAILED"},
		{"kernel bug", "VMTEST-BOOTED uptime=1\n[    3.141592] BUG: kernel NULL pointer dereference\nVMTEST-DONE", nil, "KERNEL-BUG"},
		{"kernel warning is no failure", "VMTEST-BOOTED uptime=1\n[    3.1] WARNING: CPU: 0 PID: 1 at x.c:1\nVMTEST-DONE", nil, "ok"},
		{"test log mentioning BUG is no kernel bug", "VMTEST-BOOTED uptime=1\nVMTEST-BEGIN p\n    x_test.go:1: BUG: none\n--- PASS: TestX (0.00s)\nVMTEST-END p rc=0\nVMTEST-DONE", nil, "ok"},
		{"timeout", "VMTEST-BOOTED uptime=1\nVMTEST-BEGIN p", func(r *kernelResult) { r.finish(time.Unix(9, 0), true, nil) }, "TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := transcript(t, tc.console)
			if tc.finish != nil {
				tc.finish(r)
			} else {
				r.finish(time.Unix(1, 0), false, nil)
			}
			if got := r.Status(); got != tc.want {
				t.Errorf("status %s, want %s", got, tc.want)
			}
		})
	}
}

func TestSummaryCountsAndReasons(t *testing.T) {
	r := transcript(t, "VMTEST-BOOTED uptime=1\nVMTEST-BEGIN internal/x\n"+goTestOutput+"\nVMTEST-END internal/x rc=1\n"+
		"VMTEST-MODPROBE -q -- bpf_preload\nVMTEST-MODPROBE -q -- sch_foo\nVMTEST-MODPROBE -q -- bpf_preload\nVMTEST-DONE")
	r.finish(time.Unix(2, 0), false, nil)
	var b strings.Builder
	printSummary(&b, []*kernelResult{r})
	out := b.String()
	for _, want := range []string{
		"vmtest: 1 passed, 2 failed, 4 skipped",
		"internal/x: failed: TestB, TestB/sub3",
		"    1  reason A\n         [6.1] internal/x TestA",
		noReason,
		"Problems:\n  [6.1] kernel asked for a module the guest lacks (modprobe -q -- sch_foo)",
		"not problems):\n  [6.1] modprobe -q -- bpf_preload (2 times): mounting",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// TestGuestMemory: the guest holds the archive and its unpacked copy (rootfs may fill half
// the memory) with room left for the tests; the 5.10 matrix lost its last packages with
// 1 GiB for about 450 MB of test binaries.
func TestGuestMemory(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		initrd int64
		want   string
	}{
		{0, "1024M"},
		{200 * mib, "1024M"},
		{450 * mib, "1536M"},
		{600 * mib, "1792M"},
	} {
		if got := guestMemory(tc.initrd); got != tc.want {
			t.Errorf("guestMemory(%d MiB) = %s, want %s", tc.initrd/mib, got, tc.want)
		}
	}
}

// TestPanickedBeforeTests: only a kernel that died before the guest's init started is booted
// again; a panic once tests ran, a timeout or a clean run never is. The first console is
// the 6.12.117 boot that panicked under TCG (trimmed).
func TestPanickedBeforeTests(t *testing.T) {
	const bootPanic = `SeaBIOS (version 1.16.2-debian-1.16.2-1)
Booting from ROM...
[    2.288912] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[    2.289741] RIP: 0010:sched_clock_cpu+0x9/0x1d0
[    2.294828] Kernel panic - not syncing: Fatal exception in interrupt`
	cases := []struct {
		name     string
		console  string
		timedOut bool
		want     bool
	}{
		{"panic during boot", bootPanic, false, true},
		{"panic during a test", "VMTEST-BOOTED uptime=1.5\nVMTEST-BEGIN internal/x\n=== RUN   TestA\n" +
			"[    9.000000] Kernel panic - not syncing: Fatal exception", false, false},
		{"boot that hung", "Booting from ROM...", true, false},
		{"boot panic then timeout", bootPanic, true, false},
		{"clean run", "VMTEST-BOOTED uptime=1.5\nVMTEST-BEGIN internal/x\n" + goTestOutput +
			"\nVMTEST-END internal/x rc=1\nVMTEST-DONE", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := transcript(t, c.console)
			r.finish(time.Unix(10, 0), c.timedOut, nil)
			if got := r.panickedBeforeTests(); got != c.want {
				t.Fatalf("panickedBeforeTests = %v, want %v (booted=%v bugs=%q pkgs=%d)", got, c.want, r.Booted, r.KernelBugs, len(r.Pkgs))
			}
		})
	}
}
