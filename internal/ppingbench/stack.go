package ppingbench

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// The stacked run: four programs on each TC hook of the monitored interface, run one after
// the other on every packet (TCX runs a hook's programs in order; each returns TCX_NEXT),
// each timed by the run-time statistics on its own. All four see the same packets at the
// same spacing, so their figures compare without the run-to-run spread of the ACK spacing
// that moves the egress figures of separate runs. In order:
//   - StackEmptyFirst, an empty program, first on the hook: what a program that does nothing
//     costs when it is the first program a packet meets there (as ePPing's or kedge's program
//     is when it runs alone): the statistics' clock reads and the call, started cold;
//   - StackMinimal, a minimal monitor: bounds-checks the Ethernet, IPv4 and TCP headers at
//     fixed offsets, reads the TCP timestamp option's two words and counts the packet in a
//     per-CPU array (what every timestamp monitor does per packet at least, before any
//     per-flow state);
//   - StackKedge, kedge's program;
//   - StackEmptyLast, an empty program again: the same clock reads and call, warmed by the
//     three programs before it on the same packet.
//
// Beside them the run records the empty program run back to back through
// BPF_PROG_TEST_RUN (WarmEmpty): the statistics' cost with everything in cache.
const (
	StackEmptyFirst = "empty-first"
	StackMinimal    = "minimal"
	StackKedge      = "kedge"
	StackEmptyLast  = "empty-last"
)

// ProgramStack names the stacked run (RunResult.Program).
const ProgramStack = "stack"

// StackCost is one program's figures in the stacked run.
type StackCost struct {
	Program string    `json:"program"`
	Ingress *HookCost `json:"ingress"`
	Egress  *HookCost `json:"egress"`
}

// WarmCost is the empty TC program run back to back by BPF_PROG_TEST_RUN with the
// statistics on: the statistics' figure per run (run_time_ns / run_cnt) and the test run's
// own duration per repeat (which includes it). ClockReadNs is what one read of the
// kernel's clock (bpf_ktime_get_ns()) costs a program here, from a program of clockReads
// reads run the same way (its figure less the empty program's, per read): the statistics
// read the clock twice around every program run.
type WarmCost struct {
	Repeat      int     `json:"repeat"`
	StatsNs     float64 `json:"stats_ns_per_run"`
	TestRunNsOp float64 `json:"test_run_ns_per_run"`
	ClockReadNs float64 `json:"clock_read_ns,omitempty"`
}

// clockReads is the number of clock reads of the clock-read program.
const clockReads = 8

func clockInsns() asm.Instructions {
	var insns asm.Instructions
	for range clockReads {
		insns = append(insns, asm.FnKtimeGetNs.Call())
	}
	return append(insns, asm.Mov.Imm(asm.R0, tcxNext), asm.Return())
}

// stackRun is the programs of a stacked run, attached.
type stackRun struct {
	names  []string
	progs  [][2]*ebpf.Program // per name: ingress, egress
	own    []*ebpf.Program    // loaded here (kedge's are the monitor's)
	attach []bpfx.Attachment
	count  *ebpf.Map // the minimal monitor's per-CPU counter
}

// loadTC loads a TC program of insns.
func loadTC(name string, insns asm.Instructions) (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, License: "Dual BSD/GPL", Instructions: insns})
	if err != nil {
		return nil, fmt.Errorf("load reference program %s: %w", name, err)
	}
	return p, nil
}

const tcxNext = -1 // TC_ACT_UNSPEC: TCX_NEXT

func emptyInsns() asm.Instructions {
	return asm.Instructions{asm.Mov.Imm(asm.R0, tcxNext), asm.Return()}
}

// minimalInsns is the minimal monitor (see StackMinimal): Ethernet, IPv4 without options,
// TCP whose options start NOP, NOP, timestamp (Linux's layout), the packet counted and
// the two timestamp words folded into the per-CPU value so the loads are not dead.
func minimalInsns(count *ebpf.Map) asm.Instructions {
	const (
		skbData, skbDataEnd   = 76, 80 // offsetof(struct __sk_buff, data / data_end)
		ethLen, ipLen, tcpLen = 14, 20, 20
		opts                  = ethLen + ipLen + tcpLen // NOP, NOP, kind 8, len 10, TSval, TSecr
	)
	return asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, skbData, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, opts+12),
		asm.JGT.Reg(asm.R4, asm.R3, "out"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R5, 0x0008, "out"), // ETH_P_IP, network order read on little-endian
		asm.LoadMem(asm.R5, asm.R2, ethLen+9, asm.Byte),
		asm.JNE.Imm(asm.R5, 6, "out"), // IPPROTO_TCP
		asm.LoadMem(asm.R6, asm.R2, opts+4, asm.Word),
		asm.LoadMem(asm.R7, asm.R2, opts+8, asm.Word),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, count.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Xor.Reg(asm.R6, asm.R7),
		asm.StoreMem(asm.R0, 8, asm.R6, asm.DWord),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("out"),
		asm.Return(),
	}
}

// attachStackFront loads the stacked run's reference programs and attaches the two that go
// before kedge's (the empty one, then the minimal monitor) at TC ingress and egress of
// ifindex in ns, through TCX only: a clsact filter list is not ordered the same way.
func attachStackFront(ns netns.NsHandle, ifindex int) (_ *stackRun, err error) {
	r := &stackRun{}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if r.count, err = ebpf.NewMap(&ebpf.MapSpec{Name: "kedge_min_cnt", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 1}); err != nil {
		return r, fmt.Errorf("create minimal monitor's counter: %w", err)
	}
	for _, e := range []struct {
		name  string
		insns asm.Instructions
	}{{StackEmptyFirst, emptyInsns()}, {StackMinimal, minimalInsns(r.count)}} {
		var pair [2]*ebpf.Program
		for i := range pair {
			if pair[i], err = loadTC("kedge_stack", e.insns); err != nil {
				return r, err
			}
			r.own = append(r.own, pair[i])
		}
		if err := r.add(ns, ifindex, e.name, pair); err != nil {
			return r, err
		}
	}
	return r, nil
}

// add attaches a pair of programs (ingress, egress) at the tail of the hooks' lists.
func (r *stackRun) add(ns netns.NsHandle, ifindex int, name string, pair [2]*ebpf.Program) error {
	for i, dir := range []bpfx.Direction{bpfx.Ingress, bpfx.Egress} {
		a, err := bpfx.AttachTC(pair[i], bpfx.TCTarget{Netns: ns, IfIndex: ifindex, Dir: dir, Mode: bpfx.TCX, Name: "ppbench-" + name})
		if err != nil {
			return fmt.Errorf("attach stacked program %s (%s): %w", name, dir, err)
		}
		r.attach = append(r.attach, a)
	}
	r.names = append(r.names, name)
	r.progs = append(r.progs, pair)
	return nil
}

// finish records kedge's attached programs and attaches the last empty pair after them,
// then checks that each hook runs the four in the stated order.
func (r *stackRun) finish(ns netns.NsHandle, ifindex int, kedge [2]*ebpf.Program) error {
	r.names = append(r.names, StackKedge)
	r.progs = append(r.progs, kedge)
	var pair [2]*ebpf.Program
	for i := range pair {
		var err error
		if pair[i], err = loadTC("kedge_stack", emptyInsns()); err != nil {
			return err
		}
		r.own = append(r.own, pair[i])
	}
	if err := r.add(ns, ifindex, StackEmptyLast, pair); err != nil {
		return err
	}
	for i, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		var want []ebpf.ProgramID
		for _, p := range r.progs {
			info, err := p[i].Info()
			if err != nil {
				return fmt.Errorf("read program info: %w", err)
			}
			id, _ := info.ID()
			want = append(want, id)
		}
		var got []ebpf.ProgramID
		err := netnsx.In(ns, func() error {
			q, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
			if err != nil {
				return err
			}
			for _, p := range q.Programs {
				got = append(got, p.ID)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("query tcx programs: %w", err)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("stacked programs run in the order %v at %v, want %v (%v)", got, at, want, r.names)
		}
	}
	return nil
}

// stats reads every stacked program's statistics.
func (r *stackRun) stats() ([][2]*ebpf.ProgramStats, error) {
	out := make([][2]*ebpf.ProgramStats, len(r.progs))
	for i, pair := range r.progs {
		for j, p := range pair {
			var err error
			if out[i][j], err = p.Stats(); err != nil {
				return nil, fmt.Errorf("read program statistics: %w", err)
			}
		}
	}
	return out, nil
}

// costs is each stacked program's figures between two readings.
func (r *stackRun) costs(before, after [][2]*ebpf.ProgramStats) []StackCost {
	out := make([]StackCost, len(r.names))
	for i, name := range r.names {
		out[i] = StackCost{Program: name, Ingress: hookCost(before[i][0], after[i][0]), Egress: hookCost(before[i][1], after[i][1])}
	}
	return out
}

// warmEmpty runs the last empty program back to back through BPF_PROG_TEST_RUN with the
// statistics on (the caller holds them on).
func (r *stackRun) warmEmpty() (*WarmCost, error) {
	const repeat = 200000
	bench := func(p *ebpf.Program) (*HookCost, time.Duration, error) {
		before, err := p.Stats()
		if err != nil {
			return nil, 0, fmt.Errorf("read program statistics: %w", err)
		}
		_, per, err := p.Benchmark(make([]byte, 64), repeat, nil)
		if err != nil {
			return nil, 0, fmt.Errorf("run reference program back to back: %w", err)
		}
		after, err := p.Stats()
		if err != nil {
			return nil, 0, fmt.Errorf("read program statistics: %w", err)
		}
		return hookCost(before, after), per, nil
	}
	c, per, err := bench(r.progs[len(r.progs)-1][0])
	if err != nil {
		return nil, err
	}
	clock, err := loadTC("kedge_stack", clockInsns())
	if err != nil {
		return nil, err
	}
	defer clock.Close()
	cc, _, err := bench(clock)
	if err != nil {
		return nil, err
	}
	return &WarmCost{Repeat: repeat, StatsNs: c.NsPerPacket, TestRunNsOp: float64(per.Nanoseconds()),
		ClockReadNs: (cc.NsPerPacket - c.NsPerPacket) / clockReads}, nil
}

// Close detaches and unloads what the stacked run loaded.
func (r *stackRun) Close() error {
	var errs []error
	for i := len(r.attach) - 1; i >= 0; i-- {
		errs = append(errs, r.attach[i].Close())
	}
	for _, p := range r.own {
		errs = append(errs, p.Close())
	}
	if r.count != nil {
		errs = append(errs, r.count.Close())
	}
	return errors.Join(errs...)
}

// StackSummary is the stacked runs' figures per program, weighted by packets, at each hook.
type StackSummary struct {
	Programs            []string
	IngressNs, EgressNs []float64
	EgressPerACK        float64 // data segments per ACK over the stacked runs
	Warm                WarmCost
}

// SummarizeStack averages the stacked runs (nil: none).
func (r *Result) SummarizeStack() *StackSummary {
	var s *StackSummary
	var in, eg [][2]uint64 // ns, packets
	var warmN float64
	for _, run := range r.Runs {
		if run.Program != ProgramStack {
			continue
		}
		if s == nil {
			s = &StackSummary{}
			for _, c := range run.Stack {
				s.Programs = append(s.Programs, c.Program)
			}
			in, eg = make([][2]uint64, len(s.Programs)), make([][2]uint64, len(s.Programs))
		}
		for i, c := range run.Stack {
			if i < len(in) {
				in[i][0], in[i][1] = in[i][0]+c.Ingress.RunTimeNs, in[i][1]+c.Ingress.Runs
				eg[i][0], eg[i][1] = eg[i][0]+c.Egress.RunTimeNs, eg[i][1]+c.Egress.Runs
			}
		}
		if w := run.WarmEmpty; w != nil {
			s.Warm.StatsNs, s.Warm.TestRunNsOp, s.Warm.Repeat, warmN = s.Warm.StatsNs+w.StatsNs, s.Warm.TestRunNsOp+w.TestRunNsOp, w.Repeat, warmN+1
			s.Warm.ClockReadNs += w.ClockReadNs
		}
	}
	if s == nil {
		return nil
	}
	per := func(v [2]uint64) float64 {
		if v[1] == 0 {
			return 0
		}
		return float64(v[0]) / float64(v[1])
	}
	for i := range s.Programs {
		s.IngressNs, s.EgressNs = append(s.IngressNs, per(in[i])), append(s.EgressNs, per(eg[i]))
	}
	if len(in) > 0 && eg[0][1] > 0 {
		s.EgressPerACK = float64(in[0][1]) / float64(eg[0][1])
	}
	if warmN > 0 {
		s.Warm.StatsNs, s.Warm.TestRunNsOp, s.Warm.ClockReadNs = s.Warm.StatsNs/warmN, s.Warm.TestRunNsOp/warmN, s.Warm.ClockReadNs/warmN
	}
	return s
}

// writeStack prints the stacked runs' summary.
func (r *Result) writeStack(w io.Writer) {
	s := r.SummarizeStack()
	if s == nil {
		return
	}
	fmt.Fprintf(w, "stacked on the same packets (%.0f data segments per ACK), ns per packet, ingress / egress:", s.EgressPerACK)
	for i, p := range s.Programs {
		fmt.Fprintf(w, " %s %.0f / %.0f;", p, s.IngressNs[i], s.EgressNs[i])
	}
	fmt.Fprintf(w, " empty program back to back (BPF_PROG_TEST_RUN): %.0f ns per run in the statistics, %.0f ns per repeat; one clock read %.0f ns\n", s.Warm.StatsNs, s.Warm.TestRunNsOp, s.Warm.ClockReadNs)
}

// stackFigures is the table of the committed floor run's stacked runs (pping-stack): per
// round and hook, each program's figure on the same packets, then the statistics' own cost
// back to back.
func stackFigures(dir string) (string, error) {
	r, err := ReadResult(filepath.Join(dir, floorRun.dir))
	if err != nil {
		return "", err
	}
	s := r.SummarizeStack()
	if s == nil {
		return "", fmt.Errorf("%s: no stacked runs", floorRun.dir)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Run: [%s](results/pping/%s/result.json) (`kedge bench pping %s`): %s, commit %.12s, load %.1f at start. ns per packet (run_time_ns / run_cnt of each program; all four on every packet of the run).\n\n",
		floorRun.dir, floorRun.dir, floorRun.flags, r.Timestamp.Format("2006-01-02 15:04 MST"), r.Commit, load1(r.Envelope))
	b.WriteString("| Round | Hook | data segments per ACK | empty, first | minimal monitor | kedge | empty, last | minimal above empty, last | kedge above empty, last |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	round := 0
	for _, run := range r.Runs {
		if !run.Monitor && !run.Stats {
			round++
		}
		if run.Program != ProgramStack {
			continue
		}
		by := map[string]StackCost{}
		for _, c := range run.Stack {
			by[c.Program] = c
		}
		spacing := "-"
		if e := by[StackEmptyFirst]; e.Egress != nil && e.Egress.Runs > 0 {
			spacing = fmt.Sprintf("%.0f", float64(e.Ingress.Runs)/float64(e.Egress.Runs))
		}
		for _, h := range []struct {
			name string
			get  func(StackCost) *HookCost
		}{{HookTCIngress, func(c StackCost) *HookCost { return c.Ingress }}, {HookTCEgress, func(c StackCost) *HookCost { return c.Egress }}} {
			ns := func(p string) float64 {
				if c, ok := by[p]; ok && h.get(c) != nil {
					return h.get(c).NsPerPacket
				}
				return 0
			}
			sp := "-"
			if h.name == HookTCEgress {
				sp = spacing
			}
			last := ns(StackEmptyLast)
			fmt.Fprintf(&b, "| %d | %s | %s | %.0f | %.0f | %.0f | %.0f | %+.0f | %+.0f |\n", round, h.name, sp,
				ns(StackEmptyFirst), ns(StackMinimal), ns(StackKedge), last, ns(StackMinimal)-last, ns(StackKedge)-last)
		}
	}
	idx := func(p string) int { return slices.Index(s.Programs, p) }
	if f, m, k, l := idx(StackEmptyFirst), idx(StackMinimal), idx(StackKedge), idx(StackEmptyLast); f >= 0 && m >= 0 && k >= 0 && l >= 0 {
		fmt.Fprintf(&b, "| all | %s | - | %.0f | %.0f | %.0f | %.0f | %+.0f | %+.0f |\n", HookTCIngress, s.IngressNs[f], s.IngressNs[m], s.IngressNs[k], s.IngressNs[l], s.IngressNs[m]-s.IngressNs[l], s.IngressNs[k]-s.IngressNs[l])
		fmt.Fprintf(&b, "| all | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %+.0f | %+.0f |\n", HookTCEgress, s.EgressPerACK, s.EgressNs[f], s.EgressNs[m], s.EgressNs[k], s.EgressNs[l], s.EgressNs[m]-s.EgressNs[l], s.EgressNs[k]-s.EgressNs[l])
	}
	fmt.Fprintf(&b, "\nThe empty program run back to back by BPF_PROG_TEST_RUN (%d runs, nothing cold between them): %.0f ns per run in the statistics (of a %.0f ns repeat); one clock read (bpf_ktime_get_ns(), from a program of %d) %.0f ns.\n",
		s.Warm.Repeat, s.Warm.StatsNs, s.Warm.TestRunNsOp, clockReads, s.Warm.ClockReadNs)
	return b.String(), nil
}
