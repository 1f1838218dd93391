// Package bpftest runs kedge BPF programs through BPF_PROG_TEST_RUN in Go tests: no
// attachment, no network namespace, just a packet in and a verdict and packet out.
//
// A test loads its bpf2go objects, then runs table-driven cases:
//
//	func TestHedge(t *testing.T) {
//		bpftest.RequireRoot(t)
//		var objs hedgeObjects
//		if err := loadHedgeObjects(&objs, nil); err != nil {
//			t.Fatalf("load objects: %v", err)
//		}
//		t.Cleanup(func() { objs.Close() })
//		r := bpftest.Runner{
//			Prog:     objs.HedgeTc,
//			Counters: func() (bpftest.Counters, error) { return bpftest.SumPerCPU[hedgeCounters](objs.Counters) },
//		}
//		r.Run(t, []bpftest.Case{{
//			Name:         "udp request is cloned",
//			In:           pktbuild.New().IPv4(pktbuild.IPv4{}).UDP(pktbuild.UDP{Dst: 53}).Build(),
//			WantRet:      bpftest.TCActUnspec,
//			WantCounters: bpftest.Counters{"Cloned": 1},
//		}})
//	}
//
// and the package's TestMain checks that no file descriptor (program, map, link) leaks:
//
//	func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }
package bpftest

import (
	"bytes"
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

// Result is the outcome of one run.
type Result struct {
	Ret uint32 // the program's return value (verdict)
	Out []byte // the packet after the run
}

// Run runs prog once on the packet in (at least 14 bytes: the kernel wants an Ethernet
// header for TC and XDP programs).
func Run(prog *ebpf.Program, in []byte) (Result, error) {
	opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+OutPad), Repeat: 1}
	ret, err := prog.Run(&opts)
	if err != nil {
		return Result{}, fmt.Errorf("run %s on %d-byte packet: %w", progName(prog), len(in), err)
	}
	return Result{Ret: ret, Out: opts.DataOut}, nil // Run cut DataOut to the packet's length
}

func progName(prog *ebpf.Program) string {
	if info, err := prog.Info(); err == nil && info.Name != "" {
		return "program " + info.Name
	}
	return "program"
}

// Case is one table-driven fixture for Runner.Run.
type Case struct {
	Name    string
	In      []byte
	WantRet uint32
	// WantOut is the expected output packet; nil does not compare it.
	WantOut []byte
	// Check, if set, inspects the output packet (for instance with pktbuild.VerifyChecksums).
	Check func(tb testing.TB, out []byte)
	// WantCounters, if not nil, is the expected change of every counter over the run: a
	// counter it does not name must not change. Needs Runner.Counters.
	WantCounters Counters
}

// Runner runs Cases against one program.
type Runner struct {
	Prog *ebpf.Program
	// Counters reads the program's counters (usually a closure around SumPerCPU); nil when
	// the program has none.
	Counters func() (Counters, error)
}

// Run runs each case as a subtest of t.
func (r Runner) Run(t *testing.T, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			res, err := r.runOne(t, c)
			if err != nil {
				t.Fatal(err)
			}
			if c.Check != nil {
				c.Check(t, res.Out)
			}
		})
	}
}

// reporter is the part of testing.TB that runOne reports mismatches through.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// runOne runs c and reports a wrong verdict, output packet or counter change to rep. It
// returns an error when the case cannot run at all.
func (r Runner) runOne(rep reporter, c Case) (Result, error) {
	rep.Helper()
	var res Result
	run := func() (err error) {
		res, err = Run(r.Prog, c.In)
		return err
	}
	var delta Counters
	switch {
	case c.WantCounters != nil && r.Counters == nil:
		return Result{}, fmt.Errorf("run case %q: it has WantCounters but the Runner has no Counters reader", c.Name)
	case c.WantCounters != nil:
		var err error
		if delta, err = Delta(r.Counters, run); err != nil {
			return Result{}, err
		}
	default:
		if err := run(); err != nil {
			return Result{}, err
		}
	}
	if res.Ret != c.WantRet {
		rep.Errorf("verdict %d (%#x), want %d (%#x)", int32(res.Ret), res.Ret, int32(c.WantRet), c.WantRet)
	}
	if c.WantOut != nil && !bytes.Equal(res.Out, c.WantOut) {
		rep.Errorf("output packet differs: %s", DiffBytes(res.Out, c.WantOut))
	}
	if c.WantCounters != nil {
		if d := delta.Diff(c.WantCounters); d != "" {
			rep.Errorf("counter changes differ (got, want):\n%s", d)
		}
	}
	return res, nil
}

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
