package bpftest

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// Result is the outcome of one run.
type Result struct {
	Ret uint32 // the program's return value (verdict)
	Out []byte // the packet after the run
	// Skb is the context after the run (mark, priority, tstamp, ...): set when the case
	// passed one (Case.Skb or Case.WantMark).
	Skb SkBuff
	// Now is the time the program read through kedge_now() (Runner.Clock); 0 without one.
	Now uint64
}

// Run runs prog once on the packet in (at least 14 bytes: the kernel wants an Ethernet
// header for TC and XDP programs).
func Run(prog *ebpf.Program, in []byte) (Result, error) {
	return runOpts(prog, &ebpf.RunOptions{Data: in})
}

func runOpts(prog *ebpf.Program, opts *ebpf.RunOptions) (Result, error) {
	opts.DataOut, opts.Repeat = make([]byte, len(opts.Data)+OutPad), 1
	ret, err := prog.Run(opts)
	if err != nil {
		return Result{}, fmt.Errorf("run %s on %d-byte packet: %w", progName(prog), len(opts.Data), err)
	}
	return Result{Ret: ret, Out: opts.DataOut}, nil // Run cut DataOut to the packet's length
}

// Case is one table-driven fixture: a description, a packet in, and what must come out.
// Only Name, In and WantRet are required; every other expectation is checked when set.
type Case struct {
	Name string
	// Setup prepares program state (map entries, configuration) before the run, after the
	// Runner's Reset.
	Setup func(tb testing.TB)

	// Prog runs instead of Runner.Prog (a case of a table over several programs).
	Prog *ebpf.Program
	// In is the packet, usually built with internal/pktbuild.
	In []byte
	// Skb is the __sk_buff context passed in (TC programs): mark, priority, ifindex, cb,
	// tstamp. The kernel refuses other non-zero fields.
	Skb *SkBuff
	// Now is the time in nanoseconds (CLOCK_MONOTONIC, as bpf_ktime_get_ns) that the
	// program's kedge_now() returns during the run; 0 leaves the clock where it is
	// (ClockStart at the start of each case, or the previous step's time). Needs Runner.Clock.
	Now uint64
	// Refused, if set, is an error with which the kernel may refuse the packet before the
	// program runs (for example EINVAL for a frame shorter than the headers its ethertype
	// announces, in the skb runner): such a run skips the case with the reason instead of
	// failing it.
	Refused error

	// Steps, instead of In, runs several packets in order on one state (no Reset between
	// them): a flow's handshake, a request and its reply, packets through two hooks. Each
	// step is a Case without Steps; its Setup runs right before it. The outer case's
	// WantCounters (the change over all steps), WantMaps and Check are checked after the last
	// step; Check gets the last step's Result.
	Steps []Case

	// WantRet is the expected verdict (the program's return value).
	WantRet uint32
	// WantOut is the expected output packet; nil does not compare it.
	WantOut []byte
	// WantSame: the packet must come out as it went in.
	WantSame bool
	// WantMark, if set, is the expected skb->mark after the run (see Mark).
	WantMark *uint32
	// WantCounters, if not nil, is the expected change of every counter over the run: a
	// counter it does not name must not change. Needs Runner.Counters.
	WantCounters Counters
	// WantMaps are expected map contents after the run.
	WantMaps []MapWant
	// Check, if set, inspects the result and anything else the run left (ring-buffer events,
	// values derived from maps).
	Check func(tb testing.TB, r Result)
}

// Seq runs setups in order: a Case.Setup made of several.
func Seq(setups ...func(testing.TB)) func(testing.TB) {
	return func(tb testing.TB) {
		tb.Helper()
		for _, s := range setups {
			s(tb)
		}
	}
}

// Mark returns a pointer to m, for Case.WantMark.
func Mark(m uint32) *uint32 { return &m }

// Runner runs Cases against one program.
type Runner struct {
	Prog *ebpf.Program
	// Counters reads the program's counters (usually a closure around SumPerCPU); nil when
	// the program has none.
	Counters func() (Counters, error)
	// Reset, if set, brings the program's state back to a known one before each case (clear
	// the maps a case writes, drain a ring buffer). Without it, each case starts from the
	// state the previous one left.
	Reset func(tb testing.TB)
	// Clock is the kedge_clock_ns variable of an object loaded after FixClock (bpf2go names
	// it KedgeClockNs): each case starts at ClockStart and each run at its Case.Now.
	Clock *ebpf.Variable
	// Within, if set, wraps every run of the program: for instance to run it inside a
	// network namespace whose devices it redirects to.
	Within func(run func() error) error
}

// Run runs each case as a subtest of t.
func (r Runner) Run(t *testing.T, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Helper()
			if _, err := r.exec(t, c, ""); err != nil {
				var refused refusedError
				if errors.As(err, &refused) {
					t.Skip(err)
				}
				t.Fatal(err)
			}
		})
	}
}

// RunCase runs c in tb itself rather than as a subtest, naming c in every report: for cases
// generated by the thousand (every truncation of a frame, a fuzzer's input). It returns
// false when the kernel refused the packet as c allows (Case.Refused).
func (r Runner) RunCase(tb testing.TB, c Case) bool {
	tb.Helper()
	if _, err := r.exec(tb, c, c.Name+": "); err != nil {
		var refused refusedError
		if errors.As(err, &refused) {
			return false
		}
		tb.Fatalf("%s: %v", c.Name, err)
	}
	return true
}

// refusedError is a run the kernel refused as the case allows (Case.Refused).
type refusedError struct{ err error }

func (e refusedError) Error() string {
	return "the kernel refuses this packet before running the program, as the case allows: " + e.err.Error()
}
func (e refusedError) Unwrap() error { return e.err }

// exec resets the program's state and runs c, reporting every unmet expectation to tb with
// label before it. It returns an error when c cannot run at all.
func (r Runner) exec(tb testing.TB, c Case, label string) (Result, error) {
	tb.Helper()
	if r.Reset != nil {
		r.Reset(tb)
	}
	if r.Clock != nil {
		if err := r.Clock.Set(ClockStart); err != nil {
			return Result{}, fmt.Errorf("set the clock: %w", err)
		}
	}
	if len(c.Steps) == 0 {
		return r.runCase(tb, c, label)
	}
	if c.In != nil {
		return Result{}, fmt.Errorf("case %q has both In and Steps: a case is one packet or a sequence of steps", c.Name)
	}
	if c.Setup != nil {
		c.Setup(tb)
	}
	var last Result
	delta, err := r.delta(c, func() error {
		for i, s := range c.Steps {
			if len(s.Steps) > 0 {
				return fmt.Errorf("step %d of case %q has steps of its own", i, c.Name)
			}
			step := fmt.Sprintf("%sstep %d: ", label, i)
			if s.Name != "" {
				step = fmt.Sprintf("%sstep %d (%s): ", label, i, s.Name)
			}
			var err error
			if last, err = r.runCase(tb, s, step); err != nil {
				return fmt.Errorf("%s%w", step, err)
			}
		}
		return nil
	})
	if err != nil {
		return last, err
	}
	r.judgeState(tb, c, label+"after the last step: ", delta, last)
	return last, nil
}

// runCase runs the one packet of c and judges it; label prefixes its reports (a step's).
func (r Runner) runCase(tb testing.TB, c Case, label string) (Result, error) {
	tb.Helper()
	if c.Setup != nil {
		c.Setup(tb)
	}
	prog := c.Prog
	if prog == nil {
		prog = r.Prog
	}
	if prog == nil {
		return Result{}, fmt.Errorf("case %q: no program (set Runner.Prog or Case.Prog)", c.Name)
	}
	if c.In == nil {
		return Result{}, fmt.Errorf("case %q has no packet (In)", c.Name)
	}
	var res Result
	delta, err := r.delta(c, func() (err error) {
		res, err = r.runPacket(prog, c)
		return err
	})
	if err != nil {
		return res, err
	}
	if res.Ret != c.WantRet {
		tb.Errorf("%sverdict %s, want %s", label, Verdict(prog, res.Ret), Verdict(prog, c.WantRet))
	}
	switch {
	case c.WantSame && c.WantOut != nil:
		return res, fmt.Errorf("case %q sets both WantOut and WantSame", c.Name)
	case c.WantSame && !bytes.Equal(res.Out, c.In):
		tb.Errorf("%sthe program changed the packet: %s", label, DiffBytes(res.Out, c.In))
	case c.WantOut != nil && !bytes.Equal(res.Out, c.WantOut):
		tb.Errorf("%soutput packet differs: %s", label, DiffBytes(res.Out, c.WantOut))
	}
	if c.WantMark != nil && res.Skb.Mark != *c.WantMark {
		tb.Errorf("%sskb mark %#x after the run, want %#x", label, res.Skb.Mark, *c.WantMark)
	}
	r.judgeState(tb, c, label, delta, res)
	return res, nil
}

// delta runs run and returns the counter changes over it when c expects some.
func (r Runner) delta(c Case, run func() error) (Counters, error) {
	switch {
	case c.WantCounters != nil && r.Counters == nil:
		return nil, fmt.Errorf("case %q has WantCounters but the Runner has no Counters reader", c.Name)
	case c.WantCounters != nil:
		return Delta(r.Counters, run)
	}
	return nil, run()
}

// judgeState checks the counter changes, the maps and c.Check.
func (r Runner) judgeState(tb testing.TB, c Case, label string, delta Counters, res Result) {
	tb.Helper()
	if c.WantCounters != nil {
		if d := delta.Diff(c.WantCounters); d != "" {
			tb.Errorf("%scounter changes differ (got, want):\n%s", label, d)
		}
	}
	for _, mw := range c.WantMaps {
		if d, err := mw.diff(); err != nil {
			tb.Errorf("%s%v", label, err)
		} else if d != "" {
			tb.Errorf("%smap %s differs (got, want):\n%s", label, mw.Map, d)
		}
	}
	if c.Check != nil {
		c.Check(tb, res)
	}
}

// runPacket sets the clock and test-runs prog once on c's packet and context.
func (r Runner) runPacket(prog *ebpf.Program, c Case) (Result, error) {
	if c.Now != 0 && r.Clock == nil {
		return Result{}, fmt.Errorf("case %q sets Now but the Runner has no Clock (load the object after FixClock and set Runner.Clock)", c.Name)
	}
	if c.Now != 0 {
		if err := r.Clock.Set(c.Now); err != nil {
			return Result{}, fmt.Errorf("set the clock to %d: %w", c.Now, err)
		}
	}
	opts := ebpf.RunOptions{Data: c.In}
	withSkb := c.Skb != nil || c.WantMark != nil
	if withSkb {
		if prog.Type() == ebpf.XDP {
			return Result{}, fmt.Errorf("case %q passes an skb context (Skb or WantMark) to an XDP program", c.Name)
		}
		in := SkBuff{}
		if c.Skb != nil {
			in = *c.Skb
		}
		opts.Context = in
		opts.ContextOut = new(SkBuff)
	}
	var res Result
	run := func() (err error) {
		res, err = runOpts(prog, &opts)
		return err
	}
	var err error
	if r.Within != nil {
		err = r.Within(run)
	} else {
		err = run()
	}
	if err != nil {
		if c.Refused != nil && errors.Is(err, c.Refused) {
			return res, refusedError{err}
		}
		return res, err
	}
	if withSkb {
		res.Skb = *opts.ContextOut.(*SkBuff)
	}
	if r.Clock != nil {
		if err := r.Clock.Get(&res.Now); err != nil {
			return res, fmt.Errorf("read the clock: %w", err)
		}
	}
	return res, nil
}

// Bench runs each case's packet b.N times as a sub-benchmark (the fixtures double as the
// performance cases, katran's way) and reports the kernel's mean run time per packet as
// ns/op. A case runs after Reset and its Setup, at its Now; its verdict must be WantRet
// after the repeated runs too, so pick cases whose outcome does not depend on how often
// they ran. Cases with Steps or an skb context cannot be benchmarked.
func (r Runner) Bench(b *testing.B, cases []Case) {
	b.Helper()
	for _, c := range cases {
		b.Run(c.Name, func(b *testing.B) {
			if len(c.Steps) > 0 || c.Skb != nil || c.WantMark != nil {
				b.Fatalf("case %q: Bench runs one packet without a context (no Steps, Skb or WantMark)", c.Name)
			}
			prog := c.Prog
			if prog == nil {
				prog = r.Prog
			}
			if r.Reset != nil {
				r.Reset(b)
			}
			now := c.Now
			if now == 0 {
				now = ClockStart
			}
			if r.Clock != nil {
				if err := r.Clock.Set(now); err != nil {
					b.Fatalf("set the clock: %v", err)
				}
			} else if c.Now != 0 {
				b.Fatalf("case %q sets Now but the Runner has no Clock", c.Name)
			}
			if c.Setup != nil {
				c.Setup(b)
			}
			var ret uint32
			var perRun time.Duration
			bench := func() (err error) {
				ret, perRun, err = prog.Benchmark(c.In, b.N, b.ResetTimer)
				return err
			}
			var err error
			if r.Within != nil {
				err = r.Within(bench)
			} else {
				err = bench()
			}
			if err != nil {
				b.Fatalf("benchmark %s: %v", progName(prog), err)
			}
			if ret != c.WantRet {
				b.Fatalf("verdict %s, want %s", Verdict(prog, ret), Verdict(prog, c.WantRet))
			}
			b.ReportMetric(float64(perRun.Nanoseconds()), "ns/op")
		})
	}
}

// Verdict names v as a return value of prog ("XDP_PASS", "TC_ACT_SHOT", ...).
func Verdict(prog *ebpf.Program, v uint32) string {
	var names map[uint32]string
	switch prog.Type() {
	case ebpf.XDP:
		names = map[uint32]string{XDPAborted: "XDP_ABORTED", XDPDrop: "XDP_DROP", XDPPass: "XDP_PASS",
			XDPTx: "XDP_TX", XDPRedirect: "XDP_REDIRECT"}
	case ebpf.SchedCLS, ebpf.SchedACT:
		names = map[uint32]string{TCActUnspec: "TC_ACT_UNSPEC", TCActOK: "TC_ACT_OK", TCActShot: "TC_ACT_SHOT",
			TCActRedirect: "TC_ACT_REDIRECT"}
	}
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf("%d (%#x)", int32(v), v)
}

// MapWant is the expected content of a map after a run. Want is a Go map whose key and
// value types are the BPF map's (as bpf2go generates them; a slice of values for a per-CPU
// map): a hash map must hold exactly these entries; an array map these values at these
// indices and zero values at every other.
type MapWant struct {
	Map  *ebpf.Map
	Want any
}

// diff compares the map with Want, one line per differing key ("" when none).
func (mw MapWant) diff() (string, error) {
	want := reflect.ValueOf(mw.Want)
	if mw.Map == nil || want.Kind() != reflect.Map {
		return "", fmt.Errorf("MapWant needs a map and a Go map of its entries, got %v and %T", mw.Map, mw.Want)
	}
	got, err := entries(mw.Map, want.Type())
	if err != nil {
		return "", err
	}
	array := mw.Map.Type() == ebpf.Array || mw.Map.Type() == ebpf.PerCPUArray
	var lines []string
	iter := got.MapRange()
	for iter.Next() {
		k, g := iter.Key(), iter.Value()
		w := want.MapIndex(k)
		switch {
		case !w.IsValid() && array && g.IsZero():
		case !w.IsValid():
			lines = append(lines, fmt.Sprintf("  %+v: %+v, want absent", k, g))
		case !reflect.DeepEqual(g.Interface(), w.Interface()):
			lines = append(lines, fmt.Sprintf("  %+v: %+v, want %+v", k, g, w))
		}
	}
	iter = want.MapRange()
	for iter.Next() {
		if !got.MapIndex(iter.Key()).IsValid() {
			lines = append(lines, fmt.Sprintf("  %+v: absent, want %+v", iter.Key(), iter.Value()))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}

// entries reads every entry of m into a Go map of type typ (map[K]V).
func entries(m *ebpf.Map, typ reflect.Type) (reflect.Value, error) {
	out := reflect.MakeMap(typ)
	it := m.Iterate()
	for {
		k, v := reflect.New(typ.Key()), reflect.New(typ.Elem())
		if !it.Next(k.Interface(), v.Interface()) {
			break
		}
		out.SetMapIndex(k.Elem(), v.Elem())
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read map %s as %v: %w", m, typ, err)
	}
	return out, nil
}

// Entries reads every entry of m (a map whose keys and values are K and V as bpf2go
// generates them).
func Entries[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	v, err := entries(m, reflect.TypeFor[map[K]V]())
	if err != nil {
		return nil, err
	}
	return v.Interface().(map[K]V), nil
}
