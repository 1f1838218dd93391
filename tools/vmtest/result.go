package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// kernelResult is what one guest run produced, built line by line from its console.
type kernelResult struct {
	Kernel      string
	Package     string // exact Debian package, name=version
	Pkgs        []*pkgResult
	Booted      bool
	BootTime    time.Duration // qemu start to VMTEST-BOOTED
	Done        bool          // VMTEST-DONE seen: every binary ran
	SetupFailed []string      // mounts or module loads that failed
	Modprobe    []string      // modules the kernel tried to autoload
	KernelBugs  []string      // oops, BUG, panic lines
	KernelWarns []string      // WARNING lines
	TimedOut    bool
	RunErr      error    // qemu could not run, or exited abnormally
	BootPanics  []string // first bug line of each earlier boot that panicked before the tests started (retried)
	Duration    time.Duration

	start time.Time
	cur   *pkgResult
}

// pkgResult is one test binary's outcome, parsed from its go test -v output.
type pkgResult struct {
	Pkg              string
	Pass, Fail, Skip int
	Failed           []string
	Skips            []skipNote
	Panic            string // first "panic:" line, with the tests running then
	Ended            bool   // VMTEST-END seen
	RC               int
	Duration         time.Duration

	start   time.Time
	running bool                // inside a panic's "running tests:" list
	current string              // test the following log lines belong to
	logs    map[string][]string // test -> log entries (continuation lines joined)
}

// skipNote is one skipped test and the reason it logged.
type skipNote struct {
	Test   string
	Reason string
}

// noReason stands in for a skip that logged nothing (t.SkipNow): house style wants a
// stated reason for every skip, so this shows up in the summary.
const noReason = "(no reason given)"

var (
	ansiRe     = regexp.MustCompile(`\x1b(\[[0-9;?]*[A-Za-z]|[()][0-9A-Za-z]|[A-Za-z])`)
	testLineRe = regexp.MustCompile(`^(\s*)--- (PASS|FAIL|SKIP): (\S+) \(`)
	testNameRe = regexp.MustCompile(`^=== (RUN|CONT|NAME|PAUSE)\s+(\S+)`)
	markerRe   = regexp.MustCompile(`VMTEST-(BOOTED|SETUP-FAILED|MODPROBE|BEGIN|END|DONE)\b`)
	kmsgRe     = regexp.MustCompile(`^\[\s*\d+\.\d+\] `) // printk with its timestamp
	bugRe      = regexp.MustCompile(`Kernel panic|BUG:|Oops:|general protection fault|Attempted to kill init`)
	warnRe     = regexp.MustCompile(`WARNING: CPU:`)
)

// cleanLine removes carriage returns and terminal escapes (the firmware clears the screen).
func cleanLine(s string) string {
	return ansiRe.ReplaceAllString(strings.ReplaceAll(s, "\r", ""), "")
}

func newKernelResult(kernel, pkg string, start time.Time) *kernelResult {
	return &kernelResult{Kernel: kernel, Package: pkg, start: start}
}

// feed processes one console line received at now.
func (r *kernelResult) feed(line string, now time.Time) {
	switch {
	case markerRe.MatchString(line):
		// Firmware or kernel output may precede a marker on its line.
		r.marker(line[markerRe.FindStringIndex(line)[0]:], now)
	case kmsgRe.MatchString(line):
		if strings.Contains(line, "Initramfs unpacking failed") {
			// The archive did not fit: the binaries past the cut are missing from the guest.
			r.SetupFailed = append(r.SetupFailed, "initramfs: "+strings.TrimSpace(line[kmsgRe.FindStringIndex(line)[1]:])+
				" (the guest's memory is too small for the test binaries; see guestMemory)")
		} else if bugRe.MatchString(line) {
			r.KernelBugs = append(r.KernelBugs, strings.TrimSpace(line))
		} else if warnRe.MatchString(line) {
			r.KernelWarns = append(r.KernelWarns, strings.TrimSpace(line))
		}
	case r.cur != nil:
		r.cur.feed(line)
	}
}

func (r *kernelResult) marker(line string, now time.Time) {
	word, rest, _ := strings.Cut(line, " ")
	switch word {
	case "VMTEST-BOOTED":
		r.Booted = true
		r.BootTime = now.Sub(r.start)
	case "VMTEST-SETUP-FAILED":
		r.SetupFailed = append(r.SetupFailed, rest)
	case "VMTEST-MODPROBE":
		r.Modprobe = append(r.Modprobe, rest)
	case "VMTEST-BEGIN":
		r.cur = &pkgResult{Pkg: rest, start: now, logs: map[string][]string{}}
		r.Pkgs = append(r.Pkgs, r.cur)
	case "VMTEST-END":
		pkg, rc, _ := strings.Cut(rest, " rc=")
		if r.cur == nil || r.cur.Pkg != pkg {
			return
		}
		n, err := strconv.Atoi(rc)
		if err != nil {
			n = -1
		}
		r.cur.end(n, now)
		r.cur = nil
	case "VMTEST-DONE":
		r.Done = true
	}
}

// feed processes one line of go test -v output.
func (p *pkgResult) feed(line string) {
	if p.panicLine(line) {
		return
	}
	if m := testNameRe.FindStringSubmatch(line); m != nil {
		p.current = m[2]
		return
	}
	if m := testLineRe.FindStringSubmatch(line); m != nil {
		name := m[3]
		switch m[2] {
		case "PASS":
			p.Pass++
		case "FAIL":
			p.Fail++
			p.Failed = append(p.Failed, name)
		case "SKIP":
			p.Skip++
			p.Skips = append(p.Skips, skipNote{Test: name})
		}
		// Logs printed after the result line (not streamed) belong to that test.
		p.current = name
		return
	}
	if p.current == "" {
		return
	}
	switch {
	case strings.HasPrefix(line, "        "): // continuation of a multi-line entry
		if l := p.logs[p.current]; len(l) > 0 {
			l[len(l)-1] += " " + strings.TrimSpace(line)
		}
	case strings.HasPrefix(line, "    "):
		p.logs[p.current] = append(p.logs[p.current], strings.TrimSpace(line))
	}
}

// panicLine records a test binary's panic and, for -test.timeout, the tests that were
// running ("running tests:" then one tab-indented line per test).
func (p *pkgResult) panicLine(line string) bool {
	switch {
	case p.Panic == "" && strings.HasPrefix(line, "panic: "):
		p.Panic = line
	case p.Panic != "" && strings.TrimSpace(line) == "running tests:":
		p.running = true
	case p.running && strings.HasPrefix(line, "\t\t"):
		p.Panic += "; running " + strings.TrimSpace(line)
	default:
		p.running = false
		return false
	}
	return true
}

// end records the exit status and fills in skip reasons: a skip's reason is the last
// entry its test logged (t.Skip logs its arguments just before skipping).
func (p *pkgResult) end(rc int, now time.Time) {
	p.Ended, p.RC, p.Duration = true, rc, now.Sub(p.start)
	for i := range p.Skips {
		p.Skips[i].Reason = noReason
		if l := p.logs[p.Skips[i].Test]; len(l) > 0 {
			p.Skips[i].Reason = l[len(l)-1]
		}
	}
	p.logs = nil
}

// finish closes the run: a binary without VMTEST-END crashed the guest or hung.
func (r *kernelResult) finish(now time.Time, timedOut bool, runErr error) {
	r.Duration, r.TimedOut, r.RunErr = now.Sub(r.start), timedOut, runErr
	if r.cur != nil {
		r.cur.end(-1, now)
		r.cur.Ended = false
		r.cur = nil
	}
}

// panickedBeforeTests reports a boot that died in the kernel before the guest's init
// started any test (no VMTEST-BOOTED marker, a bug line on the console, qemu exited by
// itself). Under TCG a stock kernel occasionally hits an int3 left by its own code patching
// during SMP bring-up (seen: 6.12.117, "Oops: int3" in sched_clock_cpu on the secondary
// CPU); no test ran, so the boot is worth repeating. A panic after boot is never retried.
func (r *kernelResult) panickedBeforeTests() bool {
	return !r.Booted && !r.TimedOut && r.RunErr == nil && len(r.KernelBugs) > 0 && len(r.Pkgs) == 0
}

// Status is a one-word verdict for the summary.
func (r *kernelResult) Status() string {
	switch {
	case r.TimedOut:
		return "TIMEOUT"
	case r.RunErr != nil:
		return "ERROR"
	case len(r.KernelBugs) > 0:
		return "KERNEL-BUG"
	case !r.Booted || !r.Done:
		return "CRASH"
	case len(r.SetupFailed) > 0:
		return "SETUP-FAILED"
	}
	for _, p := range r.Pkgs {
		if p.Status() != "ok" {
			return "FAIL"
		}
	}
	return "ok"
}

// Failed reports whether the run should make vmtest exit non-zero.
func (r *kernelResult) Failed() bool { return r.Status() != "ok" }

// Status is a one-word verdict for one package.
func (p *pkgResult) Status() string {
	switch {
	case !p.Ended:
		return "CRASH"
	case p.Fail > 0:
		return "FAIL"
	case p.RC != 0:
		return fmt.Sprintf("EXIT-%d", p.RC)
	}
	return "ok"
}
