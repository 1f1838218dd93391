// Package bpftest runs kedge BPF programs through BPF_PROG_TEST_RUN in Go tests: no
// attachment, just a packet in and a verdict, a packet and program state out.
//
// Every BPF fixture in kedge is written in one style, katran's: a table of Cases, each a
// description, an input packet built with internal/pktbuild, the expected verdict, the
// expected output bytes and the expected effects on maps and counters. A Runner runs the
// table, one subtest per case:
//
//	func TestSplit(t *testing.T) {
//		bpftest.RequireRoot(t)
//		spec, err := loadHedge()
//		...
//		bpftest.FixClock(spec) // the programs read the time the cases give (clock.h)
//		var objs hedgeObjects
//		if err := spec.LoadAndAssign(&objs, nil); err != nil {
//			t.Fatalf("load objects: %v", err)
//		}
//		t.Cleanup(func() { objs.Close() })
//		r := bpftest.Runner{
//			Prog:     objs.HedgeSplit,
//			Counters: func() (bpftest.Counters, error) { return bpftest.SumPerCPU[hedgeStats](objs.Stats) },
//			Reset:    func(tb testing.TB) { clearScoreboard(tb, &objs) },
//			Clock:    objs.KedgeClockNs,
//		}
//		const now = bpftest.ClockStart
//		r.Run(t, []bpftest.Case{{
//			Name:         "due request is hedged to the other replica",
//			Setup:        func(tb testing.TB) { putEntry(tb, &objs, key, pending(now-5*ms, now-ms)) },
//			In:           pktbuild.New().IPv4(pktbuild.IPv4{}).UDP(pktbuild.UDP{Dst: 53}).Build(),
//			Now:          now,
//			WantRet:      bpftest.TCActRedirect,
//			WantOut:      rewritten,
//			WantMark:     bpftest.Mark(hedgeMark),
//			WantCounters: bpftest.Counters{"Hedged": 1},
//			WantMaps:     []bpftest.MapWant{{Map: objs.Scoreboard, Want: map[hedgeHreqKey]hedgeHreq{key: hedged(now)}}},
//		}})
//	}
//
// What a case can say, and where each of the older dialects went:
//   - packet, verdict, bytes: In, WantRet, WantOut (or WantSame: the packet is not changed);
//   - program state before the run: Setup, after the Runner's Reset (state is shared between
//     cases when the Runner has no Reset);
//   - skb context: Skb in, WantMark and Result.Skb out (TC programs);
//   - time: a program that reads the clock through kedge_now() (bpf/include/clock.h), loaded
//     after FixClock, sees exactly Case.Now: deadlines and RTTs are exact, so no case depends
//     on how fast the machine runs it;
//   - effects: WantCounters (every counter not named must stay), WantMaps (whole map
//     contents), Check for anything else (ring-buffer events, derived values);
//   - several packets on one state (a handshake, a request and its reply, packets through
//     two hooks): Steps, each a case with its own Prog, Now and expectations;
//   - network namespace: Runner.Within, for programs that redirect to devices.
//
// Runner.Bench runs the same table as benchmarks (the kernel's mean run time per packet).
//
// The package's TestMain checks that no file descriptor (program, map, link) leaks:
//
//	func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }
package bpftest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// Verdicts as BPF_PROG_TEST_RUN reports them (the program's return value as a uint32).
const (
	TCActUnspec   = ^uint32(0) // TC_ACT_UNSPEC (-1), also TCX_NEXT
	TCActOK       = 0
	TCActShot     = 2
	TCActRedirect = 7
	XDPAborted    = 0
	XDPDrop       = 1
	XDPPass       = 2
	XDPTx         = 3
	XDPRedirect   = 4
)

// OutPad is how many bytes the output buffer has beyond the input: programs may grow a
// packet (bpf_xdp_adjust_head, bpf_skb_change_tail, encapsulation), and the kernel fails the
// run with ENOSPC when the result does not fit.
const OutPad = 64 << 10

// progName names prog in an error message without a syscall (a table may refuse thousands
// of packets on purpose).
func progName(prog *ebpf.Program) string { return "program " + prog.String() }

// DiffBytes describes how got differs from want: lengths, the first differing offset and
// both packets in hex.
func DiffBytes(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("%d bytes, want %d; first difference at offset %d\n got %x\nwant %x",
		len(got), len(want), i, got, want)
}

var (
	bpfOnce   sync.Once
	bpfReason string // why BPF_PROG_TEST_RUN is unusable; "" if usable
)

// RequireRoot skips tb, with the reason, unless the test runs as root and can load and
// test-run a BPF program. It also removes the RLIMIT_MEMLOCK limit where the kernel still
// charges BPF memory to it (< 5.11); on newer kernels (memcg accounting) nothing is needed,
// and a refusal (EPERM without CAP_SYS_RESOURCE) is ignored.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("skipping: needs root to load BPF programs (run the tests as root, e.g. sudo go test)")
	}
	bpfOnce.Do(func() { bpfReason = probeTestRun() })
	if bpfReason != "" {
		tb.Skip("skipping: " + bpfReason)
	}
}

// probeTestRun loads a two-instruction XDP program and test-runs it.
func probeTestRun() string {
	if err := rlimit.RemoveMemlock(); err != nil && !errors.Is(err, unix.EPERM) {
		return fmt.Sprintf("remove memlock rlimit: %v", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, XDPPass), asm.Return()},
		License:      "Dual BSD/GPL",
	})
	if err != nil {
		return fmt.Sprintf("BPF unavailable (load XDP program: %v)", err)
	}
	defer prog.Close()
	if _, err := Run(prog, make([]byte, 14)); err != nil {
		return fmt.Sprintf("BPF_PROG_TEST_RUN unavailable (%v)", err)
	}
	return ""
}

// CheckFDLeaks runs the tests and then fails (exit code 1) if file descriptors opened during
// them are still open: BPF programs, maps, links, BTF, files. It returns the exit code for
// os.Exit:
//
//	func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }
//
// Descriptors the Go runtime opens once on first use (the netpoller's) are opened before
// the baseline is taken.
func CheckFDLeaks(m *testing.M) int {
	warmUpRuntime()
	before, err := openFDs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bpftest: %v\n", err)
		return 1
	}
	code := m.Run()
	after, err := openFDs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bpftest: %v\n", err)
		return 1
	}
	if leaks := leaked(before, after); len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "bpftest: %d file descriptors leaked by the tests (close every "+
			"program, map, link and file, e.g. with t.Cleanup):\n  %s\n", len(leaks), strings.Join(leaks, "\n  "))
		return 1
	}
	return code
}

// warmUpRuntime makes the runtime open its lazily created descriptors (the netpoller's epoll
// and wakeup fds) so they are part of the baseline.
func warmUpRuntime() {
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
}

// openFDs maps each open descriptor of the process to what it refers to.
func openFDs() (map[string]string, error) {
	const dir = "/proc/self/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list open file descriptors: %w", err)
	}
	fds := make(map[string]string, len(entries))
	for _, e := range entries {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // the descriptor ReadDir itself used, closed by now
		}
		fds[e.Name()] = target
	}
	return fds, nil
}

// leaked lists the descriptors open in after that were not open (to the same thing) before.
// The process's runstate owner record is no leak: its lock is held for the process's life.
func leaked(before, after map[string]string) []string {
	var out []string
	owners := filepath.Join(runstate.Dir, "owners") + "/"
	for fd, target := range after {
		if before[fd] != target && !strings.HasPrefix(target, owners) {
			out = append(out, fmt.Sprintf("fd %s -> %s", fd, target))
		}
	}
	slices.Sort(out)
	return out
}
