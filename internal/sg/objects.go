package sg

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/pacer"
)

// The map value types, as bpf2go generated them from bpf/include/sg.h.
type (
	GroupCfg  = sgSgGroup
	WorkerCfg = sgSgWorker
	ResultRec = sgSgResult
	SlotRec   = sgSgSlot
	Stats     = sgSgStats
	PartsRec  = sgSgParts
	ShardRec  = sgSgShard
	StoredRec = sgSgStored
	BudgetRec = sgSgBudget
)

// Tier is the set of kernel features the data plane is built from.
type Tier int

const (
	// TierLoop: bpf_loop (5.17+) for the scatter and a bpf_timer per slot for expiry.
	TierLoop Tier = iota
	// TierBounded: a bounded loop for the scatter and the sg_sweep program, run by user
	// space, for expiry (kernels 5.10-5.16).
	TierBounded
)

func (t Tier) String() string {
	if t == TierLoop {
		return "bpf_loop+bpf_timer"
	}
	return "bounded-loop+sweep"
}

// DetectTier picks TierLoop when the kernel has bpf_loop.
func DetectTier() Tier {
	if features.HaveProgramHelper(ebpf.SchedCLS, asm.FnLoop) == nil {
		return TierLoop
	}
	return TierBounded
}

// Objects is one loaded instance of the sg data plane.
type Objects struct {
	Tier    Tier
	Groups  *ebpf.Map
	Workers *ebpf.Map
	Slots   *ebpf.Map
	Results *ebpf.Map
	Stats   *ebpf.Map
	// Parts holds which parts of a multi-packet reply arrived, per (slot, worker) of the
	// groups with GroupFlagParts (LoadOptions.PartEntries).
	Parts *ebpf.Map
	// Replicas holds the shards of the groups with GroupFlagReplicas
	// (LoadOptions.ReplicaEntries): each shard's replicas and their judgement.
	Replicas *ebpf.Map
	// Stored holds each slot's stored request (LoadOptions.Resend) and Budgets each
	// group's re-send budget.
	Stored  *ebpf.Map
	Budgets *ebpf.Map
	Scatter *ebpf.Program
	// Cont goes on the group interface's TC ingress: it sends the next batch of a
	// fan-out larger than the batch (LoadOptions.Batch).
	Cont   *ebpf.Program
	Gather *ebpf.Program
	Sweep  *ebpf.Program
	// TimersInit is nil in TierBounded.
	TimersInit *ebpf.Program
	// Resend is the pacer's tick program of groups that re-send (internal/pacer
	// Pacer.Start); loaded with LoadOptions.Resend only.
	Resend *ebpf.Program

	// PacerArming is the pacer's shared state (pacer_arming: the tick deadline asked for);
	// the object's own copy when no pacer is bound (fixtures).
	PacerArming *ebpf.Map

	// Clock is kedge_clock_ns: the time the programs read after LoadOptions.FixClock.
	Clock *ebpf.Variable

	chunk *ebpf.Program // TierBounded: sg_scatter_chunk
	other []*ebpf.Map   // maps only the programs use

	// User reductions (LoadUserReduction): the programs the gather tail-calls by group,
	// what it hands them, and the programs loaded.
	userProgs *ebpf.Map
	userCall  *ebpf.Map
	user      []*ebpf.Program
}

type loopObjects struct {
	sgMaps
	sgVariables
	Scatter    *ebpf.Program `ebpf:"sg_scatter"`
	Cont       *ebpf.Program `ebpf:"sg_scatter_cont"`
	Gather     *ebpf.Program `ebpf:"sg_gather"`
	Sweep      *ebpf.Program `ebpf:"sg_sweep"`
	TimersInit *ebpf.Program `ebpf:"sg_timers_init"`
}

// resendObjects adds the pacer's tick program, loaded only for groups that re-send.
type resendObjects struct {
	loopObjects
	Resend *ebpf.Program `ebpf:"sg_resend"`
}

type boundedObjects struct {
	sgMaps
	sgVariables
	Scatter *ebpf.Program `ebpf:"sg_scatter_bl"`
	Cont    *ebpf.Program `ebpf:"sg_scatter_cont_bl"`
	Chunk   *ebpf.Program `ebpf:"sg_scatter_chunk"`
	Gather  *ebpf.Program `ebpf:"sg_gather"`
	Sweep   *ebpf.Program `ebpf:"sg_sweep"`
}

// LoadOptions tune Load.
type LoadOptions struct {
	Tier Tier
	// CopyMark is the skb mark on scatter copies (default CopyMark, from the registry in
	// bpf/include/marks.h).
	CopyMark uint32
	// ExpireSlack: a deadline this close counts as reached.
	ExpireSlack uint64
	// Batch is the number of copies one run of the scatter sends before it hands the
	// request on to the interface's ingress (default 64; at most 32 x 33 on the bounded
	// tier). Every copy of a run waits in the CPU's backlog (netdev_max_backlog) until the
	// run ends.
	Batch uint32
	// FirstBatch is the first run's copies (default min(8, Batch)); each later run sends
	// as many as were sent before it, up to Batch: 8, 8, 16, 32, 64, 64, ... (BatchRuns).
	FirstBatch uint32
	// PartEntries sizes the parts map: slots x workers of every group that takes
	// multi-packet replies (GroupFlagParts; its PartBase indexes into it). 0: none does
	// (a map of one entry, never used).
	PartEntries uint32
	// ReplicaEntries sizes the replicas map: the workers (shards) of every group with
	// replicas (GroupFlagReplicas; its ReplicaBase indexes into it). 0: none has (a map of
	// one entry, never used). The workers map gets room for their further replicas
	// (ReplicaKey).
	ReplicaEntries uint32
	// Resend loads the pacer's tick program (Objects.Resend) and sizes the stored map for
	// re-sends (a group with GroupFlagResend): one stored request per slot. TierLoop only.
	Resend bool
	// Pacer, if set, binds the object to a running pacer (its config and maps), whose
	// tick program Objects.Resend then is. Unset, the object keeps its own pacer maps
	// (fixtures: ticks are fed to Resend through BPF_PROG_TEST_RUN).
	Pacer *pacer.Client
	// FixClock makes the programs read the time from the object's kedge_clock_ns
	// (bpf/include/clock.h; fixtures only), which Objects.Clock sets.
	FixClock bool
}

// DefaultBatch and DefaultFirstBatch are the scatter's default batches
// (LoadOptions.Batch, LoadOptions.FirstBatch).
const (
	DefaultBatch      = 64
	DefaultFirstBatch = 8
)

// The skb marks of the scatter (bpf/include/marks.h): its copies (LoadOptions.CopyMark
// moves it) and a request handed on to its next batch.
const (
	CopyMark = uint32(sgKedgeMarkKEDGE_MARK_SG_COPY)
	ContMark = uint32(sgKedgeMarkKEDGE_MARK_SG_CONT)
)

// BatchRuns is how many runs of the scatter send n copies (batch_end in bpf/sg/scatter.h):
// a request is handed on BatchRuns - 1 times.
func BatchRuns(n, first, batch int) int {
	runs := 0
	for next := 0; next < n; runs++ {
		next += max(first, min(next, batch), 1)
	}
	return runs
}

// ReplicaKey is the workers-map key of replica r (1..ReplicasMax-1) of the shard whose
// replicas-map entry is entry (struct sg_shard.key; replica 0 is the group's own worker
// entry): the range past every group's workers.
func ReplicaKey(entry uint32, r int) uint32 {
	return GroupsMax*WorkersMax + entry*(ReplicasMax-1) + uint32(r-1)
}

// Load loads the programs of opts.Tier and creates the maps.
func Load(opts LoadOptions) (*Objects, error) {
	spec, err := loadSg()
	if err != nil {
		return nil, fmt.Errorf("load sg spec: %w", err)
	}
	if opts.CopyMark == 0 {
		opts.CopyMark = CopyMark
	}
	if opts.Batch == 0 {
		opts.Batch = DefaultBatch
	}
	if opts.Batch > 32*33 {
		return nil, fmt.Errorf("sg batch %d: at most %d", opts.Batch, 32*33)
	}
	if opts.FirstBatch == 0 {
		opts.FirstBatch = min(DefaultFirstBatch, opts.Batch)
	}
	if opts.FirstBatch > opts.Batch {
		return nil, fmt.Errorf("sg first batch %d: at most the batch (%d)", opts.FirstBatch, opts.Batch)
	}
	cfg := sgSgConfig{
		CopyMark:      opts.CopyMark,
		ContMark:      ContMark,
		Batch:         opts.Batch,
		FirstBatch:    opts.FirstBatch,
		ExpireSlackNs: opts.ExpireSlack,
	}
	if err := spec.Variables[sgVarSgCfg].Set(cfg); err != nil {
		return nil, fmt.Errorf("set sg config: %w", err)
	}
	if opts.PartEntries > PartEntriesMax {
		return nil, fmt.Errorf("sg parts map of %d entries: at most %d (slots x workers)", opts.PartEntries, PartEntriesMax)
	}
	spec.Maps["parts"].MaxEntries = max(opts.PartEntries, 1)
	if opts.ReplicaEntries > GroupsMax*WorkersMax {
		return nil, fmt.Errorf("sg replicas map of %d entries: at most %d (workers of the groups with replicas)", opts.ReplicaEntries, GroupsMax*WorkersMax)
	}
	spec.Maps["replicas"].MaxEntries = max(opts.ReplicaEntries, 1)
	spec.Maps["workers"].MaxEntries = ReplicaKey(opts.ReplicaEntries, 1)
	if opts.Resend {
		if opts.Tier != TierLoop {
			return nil, bpfx.NotSupported("re-sends of scatter-gather requests (bpf_loop)", "5.17",
				"run without re-sends on this kernel", ebpf.ErrNotSupported)
		}
		spec.Maps["stored"].MaxEntries = Slots
	}
	var copts *ebpf.CollectionOptions
	if opts.Pacer != nil {
		copts = &ebpf.CollectionOptions{}
		if err := opts.Pacer.Bind(spec, copts); err != nil {
			return nil, err
		}
	}
	if opts.FixClock {
		if err := spec.Variables[sgVarKedgeClockFixed].Set(true); err != nil {
			return nil, fmt.Errorf("fix the sg clock: %w", err)
		}
	}
	o := &Objects{Tier: opts.Tier}
	if opts.Tier == TierLoop {
		var ro resendObjects
		var to any = &ro.loopObjects
		if opts.Resend {
			to = &ro
		}
		if err := bpfx.LoadAndAssign("sg", spec, to, copts); err != nil {
			return nil, err
		}
		lo := ro.loopObjects
		o.fromMaps(lo.sgMaps)
		o.Clock = lo.KedgeClockNs
		o.Scatter, o.Cont, o.Gather, o.Sweep, o.TimersInit = lo.Scatter, lo.Cont, lo.Gather, lo.Sweep, lo.TimersInit
		o.Resend = ro.Resend
	} else {
		var bo boundedObjects
		if err := bpfx.LoadAndAssign("sg", spec, &bo, copts); err != nil {
			return nil, err
		}
		o.fromMaps(bo.sgMaps)
		o.Clock = bo.KedgeClockNs
		o.Scatter, o.Cont, o.chunk, o.Gather, o.Sweep = bo.Scatter, bo.Cont, bo.Chunk, bo.Gather, bo.Sweep
		if err := bo.ScatterChain.Put(uint32(0), bo.Chunk); err != nil {
			o.Close()
			return nil, fmt.Errorf("link scatter chunks: %w", err)
		}
	}
	return o, nil
}

func (o *Objects) fromMaps(m sgMaps) {
	o.Groups, o.Workers, o.Slots, o.Results, o.Stats, o.Parts, o.Replicas = m.Groups, m.Workers, m.Slots, m.Results, m.Stats, m.Parts, m.Replicas
	o.Stored, o.Budgets, o.PacerArming = m.Stored, m.Budgets, m.PacerArming
	o.userProgs, o.userCall = m.SgUserProgs, m.SgUserCall
	o.other = []*ebpf.Map{m.ScatterChain, m.ScatterState, m.PacerArming, m.PacerCounters, m.ResendState, m.SgUserProgs, m.SgUserCall}
}

// InitTimers gives slots their bpf_timer (TierLoop), retrying while one of the first
// inUse slots (the ones a group of that many requests in flight takes: slot_base 0) has
// none; bpf_timer_init fails with -ENOMEM under bursts on 6.18 (kernel-notes), and on the
// development VM it stops for good after about 540 of the 1024 slots. It returns how many
// of those inUse slots are left without a timer: their requests must be expired by
// RunSweep. sg_timers_init walks the slots in order and stops at the first failure, so
// the slots below it all have their timer.
func (o *Objects) InitTimers(inUse int) (int, error) {
	if o.TimersInit == nil {
		return 0, nil
	}
	inUse = min(max(inUse, 0), Slots)
	untimed := 0
	const tries = 200
	for try := 0; try < tries; try++ {
		ret, err := o.TimersInit.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
		if err != nil {
			return inUse, fmt.Errorf("run sg_timers_init: %w", err)
		}
		if untimed = untimedInUse(inUse, int(ret)); untimed == 0 {
			return 0, nil
		}
		time.Sleep(500 * time.Microsecond) // the allocator's cache refills from irq_work
	}
	return untimed, nil
}

// untimedInUse is how many of the first inUse slots are without a timer when
// sg_timers_init returned failed: the slots from its first failure (Slots - failed) on.
func untimedInUse(inUse, failed int) int {
	return min(max(inUse-(Slots-failed), 0), inUse)
}

// RunSweep runs sg_sweep once and returns how many requests it expired.
func (o *Objects) RunSweep() (int, error) {
	ret, err := o.Sweep.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	if err != nil {
		return 0, fmt.Errorf("run sg_sweep: %w", err)
	}
	return int(ret), nil
}

// SumStats returns group's counters (GroupsMax: the no-group slot) summed over CPUs.
func (o *Objects) SumStats(group uint32) (Stats, error) {
	return bpfx.SumPerCPU[Stats](o.Stats, group)
}

// Close releases every object.
func (o *Objects) Close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{o.Scatter, o.Cont, o.Gather, o.Sweep, o.Groups, o.Workers, o.Slots, o.Results, o.Stats, o.Parts, o.Replicas, o.Stored, o.Budgets} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	for _, p := range append([]*ebpf.Program{o.TimersInit, o.chunk, o.Resend}, o.user...) {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	for _, m := range o.other {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
