// Package hedge is the control plane of kedge's transparent UDP request hedger: it builds
// the delay line, loads bpf/hedge/hedge.bpf.c, fills its maps from a Config, attaches the
// programs and reads back counters and histograms. docs/architecture.md shows the data flow.
package hedge

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/probe"
	"github.com/kedge-dev/kedge/pkg/kedge"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Options are the run-time choices that are not part of the config file.
type Options struct {
	// Netns is the client namespace (requests leave and responses arrive there);
	// -1 means the caller's namespace.
	Netns netns.NsHandle
	// Backend overrides Config.DelayLine.Backend when set.
	Backend string
	Log     *slog.Logger
	// Instance tells the delay lines of several hedgers in one process apart: 0 names them
	// hedge-dl (namespace) and kedge-dl0 (veth), n > 0 hedge-dl<n> and kedge-dl<n>.
	Instance int
	// Events turns the event stream on (Hedger.Events): every hedge sent, won, lost or
	// refused. Off, the programs reserve nothing.
	Events bool
	// ServiceSlots is how many services the hedger is sized for (each slot holds a store
	// ring of about 2 MiB): Update adds services into free slots without restarting
	// (default: the config's services; at most 64).
	ServiceSlots int
}

// Hedger is a running hedger. Close detaches everything and removes the delay line.
type Hedger struct {
	Config      *Config
	Backend     string
	IfIndex     int
	Calibration Calibration

	objs     hedgeObjects
	noCarry  bool // every service's store limit covers the interface MTU's payload: no clone path
	events   bool // Options.Events
	pacer    *pacer.Pacer
	pacerCli pacer.Client // what load binds the collection to (fixtures: a Config without a pacer)
	// prepare, if set, adjusts the spec right before load: the BPF_PROG_TEST_RUN fixtures
	// fix the programs' clock with it (bpftest.FixClock).
	prepare  func(*ebpf.CollectionSpec) error
	attached []bpfx.Attachment
	log      *slog.Logger

	// What Update needs: the client namespace (the caller keeps it open while the hedger
	// runs), the service slots and each service's slot (Config.Services order), and when
	// each slot was last freed. mu guards Config and slots against Stats.
	netns    netns.NsHandle
	capacity int
	slots    []uint32
	freed    map[uint32]time.Time
	mu       sync.RWMutex
	// warnings holds what Watch found wrong with a service, by name (shown by Stats).
	warnings map[string]string
}

// Calibration is the delay line's (the pacer's) calibration, measured by the pacer at start.
type Calibration = pacer.Calibration

// dlClient is the pacer's veth in the client namespace (its alias names the owner: kedge:<runstate owner ID>).
const dlClient = "kedge-dl0"

// Start builds the delay line, loads and attaches the hedger. On error nothing remains.
func Start(cfg *Config, opts Options) (_ *Hedger, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkKernel(); err != nil {
		return nil, err
	}
	h := &Hedger{Config: cfg, log: opts.Log, netns: opts.Netns, capacity: max(opts.ServiceSlots, len(cfg.Services)), events: opts.Events}
	if h.capacity > svcMax {
		return nil, fmt.Errorf("%d service slots, at most %d", h.capacity, svcMax)
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, h.Close())
		}
	}()
	if h.IfIndex, err = bpfx.IfIndex(opts.Netns, cfg.Interface); err != nil {
		return nil, err
	}
	want := cfg.DelayLine.Backend
	if opts.Backend != "" {
		want = opts.Backend
	}
	if h.noCarry, err = resolveStoreLimits(cfg, opts.Netns, h.IfIndex); err != nil {
		return nil, err
	}
	// The delay line is the pacer (internal/pacer); clones ride it as carried packets, and
	// the stored path asks it for ticks. Without a clone path it carries nothing.
	dlName, dlIf := "hedge-dl", dlClient
	if opts.Instance > 0 {
		dlName, dlIf = fmt.Sprintf("hedge-dl%d", opts.Instance), fmt.Sprintf("kedge-dl%d", opts.Instance)
	}
	if h.pacer, err = pacer.New(pacer.Options{
		Netns: opts.Netns, Name: dlName, IfName: dlIf, Backend: want,
		Period: time.Duration(cfg.DelayLine.Period), RateMbit: cfg.DelayLine.RateMbit,
		FillerBytes: cfg.DelayLine.FillerBytes, Carry: !h.noCarry, Log: h.log,
	}); err != nil {
		return nil, fmt.Errorf("delay line: %w", err)
	}
	h.Backend = h.pacer.Backend()
	h.pacerCli = h.pacer.Client()
	if err := h.load(); err != nil {
		return nil, err
	}
	if err := h.fillMaps(); err != nil {
		return nil, err
	}
	// The pacer attaches its programs and hedge_rescue (its tick program) and calibrates,
	// before the splitter sends it anything.
	if err := h.pacer.Start(h.objs.HedgeRescue); err != nil {
		return nil, fmt.Errorf("delay line: %w", err)
	}
	h.Calibration = h.pacer.Calibration()
	for _, a := range []struct {
		p   *ebpf.Program
		ifx int
		dir bpfx.Direction
		n   string
	}{
		{h.objs.HedgeResp, h.IfIndex, bpfx.Ingress, "hedge_resp"},
		{h.objs.HedgeSplit, h.IfIndex, bpfx.Egress, "hedge_split"},
	} {
		at, err := bpfx.AttachTC(a.p, bpfx.TCTarget{Netns: opts.Netns, IfIndex: a.ifx, Dir: a.dir, Name: a.n})
		if err != nil {
			return nil, fmt.Errorf("attach %s: %w", a.n, err)
		}
		h.attached = append(h.attached, at)
	}
	if err := h.arm(); err != nil {
		return nil, err
	}
	h.log.Info("hedger started", "interface", cfg.Interface, "backend", h.Backend,
		"period", h.pacer.Period(), "services", len(cfg.Services), "clone_path", !h.noCarry, "store_limit", storeLimits(cfg))
	return h, nil
}

// MinKernel is the oldest kernel the hedger runs on: BPF atomics with fetch (5.12),
// bpf_for_each_map_elem (5.13), bpf_timer (5.15) and bpf_loop (5.17).
const MinKernelMajor, MinKernelMinor = 5, 17

// ErrKernelTooOld is returned by Start on kernels older than MinKernel.
var ErrKernelTooOld = errors.New("kernel too old for the hedger")

func checkKernel() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if ok, parsed := probe.KernelAtLeast(rel, MinKernelMajor, MinKernelMinor); parsed && !ok {
		return &kedge.FeatureError{Feature: "the hedger (BPF atomics, bpf_timer, bpf_loop)",
			MinKernel: fmt.Sprintf("%d.%d", MinKernelMajor, MinKernelMinor), Hint: "see 'kedge probe'",
			Err: fmt.Errorf("%w: kernel %s", ErrKernelTooOld, rel)}
	}
	return nil
}

func (h *Hedger) load() error {
	spec, err := loadHedge()
	if err != nil {
		return fmt.Errorf("load hedge spec: %w", err)
	}
	spec.Maps[hedgeMapScoreboard].MaxEntries = h.Config.ScoreboardSize
	// Two store rings per service slot, its store ring and its park ring (a cell holds a
	// whole request: 2 KiB); the programs find the park rings after the store rings.
	rings := max(h.capacity, len(h.Config.Services))
	spec.Maps[hedgeMapStoreRing].MaxEntries = uint32(2 * rings * storeRing)
	spec.Maps[hedgeMapStoreLaps].MaxEntries = spec.Maps[hedgeMapStoreRing].MaxEntries
	cfg := hedgeHedgeConfig{
		OutIfindex: uint32(h.IfIndex),
		HedgeMark:  h.Config.Mark,
		TtlNs:      uint64(time.Duration(h.Config.TTL)),
		TickNs:     uint64(time.Duration(h.Config.Tick)),
		StoreRings: uint32(rings),
	}
	if h.noCarry {
		cfg.NoCarry = 1
	}
	spec.Maps[hedgeMapHedgeEvents].MaxEntries = uint32(os.Getpagesize()) // the smallest ring: unused
	if h.events {
		cfg.Events = 1
		spec.Maps[hedgeMapHedgeEvents].MaxEntries = eventsBytes
	}
	if err := spec.Variables[hedgeVarCfg].Set(cfg); err != nil {
		return fmt.Errorf("set run configuration: %w", err)
	}
	var opts ebpf.CollectionOptions
	if err := h.pacerCli.Bind(spec, &opts); err != nil {
		return err
	}
	if h.prepare != nil {
		if err := h.prepare(spec); err != nil {
			return err
		}
	}
	return bpfx.LoadAndAssign("hedge", spec, &h.objs, &opts)
}

func svcAddr(ap netip.AddrPort) hedgeSvcAddr {
	var a hedgeSvcAddr
	a.Addr.In6U.U6Addr8 = netip.AddrFrom16(ap.Addr().As16()).As16()
	if ap.Addr().Is4() {
		a.Addr.In6U.U6Addr8 = netip.AddrFrom16(netip.AddrFrom4(ap.Addr().As4()).As16()).As16()
	}
	a.Port = bpfx.Htons(ap.Port())
	return a
}

// fillMaps writes the services into services, replicas, svc_cfgs and svc_states, service i
// into slot i.
func (h *Hedger) fillMaps() error {
	h.slots = make([]uint32, len(h.Config.Services))
	for i := range h.Config.Services {
		h.slots[i] = uint32(i)
		if err := h.writeService(uint32(i), &h.Config.Services[i], true); err != nil {
			return err
		}
	}
	return nil
}

// writeService writes service s into slot idx: its config, its state (fresh when
// newState), its replicas and, last, its address, so the splitter sees it only complete.
func (h *Hedger) writeService(idx uint32, s *ServiceConfig, newState bool) (err error) {
	// Raised whether or not every write below succeeds: a replica entry overwritten before
	// a later write failed must not stay cached (addr_cache) under the old generation.
	defer func() { err = errors.Join(err, h.bumpLookupGen()) }()
	cfg := hedgeSvcCfg{Enabled: 1, Nreplicas: uint8(len(s.replicas)), OrigIndex: 0}
	cfg.Reqid.Offset = uint16(s.RequestID.Offset)
	cfg.Reqid.Len = uint8(s.RequestID.Length)
	if s.RequestID.Order == "little" {
		cfg.Reqid.Order = uint8(hedgeReqidOrderREQID_LITTLE_ENDIAN)
	}
	if s.Delay.Quantile > 0 {
		cfg.Mode = uint8(hedgeDelayModeDELAY_QUANTILE)
		cfg.DelayNs = uint64(s.Delay.Max) // until the window has min_samples
		cfg.MinNs, cfg.MaxNs = uint64(s.Delay.Min), uint64(s.Delay.Max)
		cfg.QuantilePm = uint32(math.Round(s.Delay.Quantile * 1000))
		cfg.MinSamples = uint32(s.Delay.MinSamples)
	} else {
		cfg.Mode = uint8(hedgeDelayModeDELAY_FIXED)
		cfg.DelayNs = uint64(s.Delay.Fixed)
		cfg.MinNs, cfg.MaxNs = cfg.DelayNs, cfg.DelayNs
	}
	cfg.MaxHedges = uint8(s.MaxHedges)
	if s.ReplicaChoice == ReplicaP50 {
		cfg.ReplicaChoice = uint8(hedgeReplicaChoiceREPLICA_P50)
	}
	cfg.StoreLimit = uint32(s.storeLimit())
	cfg.Nrules = uint32(len(s.Hedgeable))
	for i, r := range s.Hedgeable {
		cfg.Rules[i] = hedgeHedgeRule{Offset: uint16(r.Offset), Len: uint8(len(r.Value))}
		copy(cfg.Rules[i].Mask[:], r.Mask)
		copy(cfg.Rules[i].Value[:], r.Value)
	}
	if !s.Ejection.Off {
		cfg.EjectAfter = uint32(s.Ejection.After)
		cfg.SlowFactor = uint32(s.Ejection.SlowFactor)
		cfg.JudgeNs = uint64(s.judgeWait())
		cfg.EjectBaseNs = uint64(s.Ejection.Backoff)
		cfg.EjectMaxNs = uint64(s.Ejection.MaxBackoff)
	}
	cfg.BudgetRatioMilli = uint64(math.Round(s.Budget.Ratio * 1000))
	cfg.BudgetCapMilli = uint64(s.Budget.Burst) * 1000
	cfg.BudgetMode = uint32(hedgeBudgetModeBUDGET_WINDOW)
	cfg.BudgetSlotNs = uint64(time.Duration(s.Budget.Window) / time.Duration(budgetSlots))
	var state hedgeSvcState
	if s.Budget.Mode == BudgetBucket {
		cfg.BudgetMode = uint32(hedgeBudgetModeBUDGET_BUCKET)
		state.TokensMilli = int64(cfg.BudgetCapMilli) // a full bucket
	}
	for r, ap := range s.replicas {
		cfg.Replicas[r] = svcAddr(ap)
	}
	if err := h.objs.SvcCfgs.Put(idx, cfg); err != nil {
		return fmt.Errorf("write service %s config: %w", s.Name, err)
	}
	if newState {
		if err := h.objs.SvcStates.Put(idx, state); err != nil {
			return fmt.Errorf("write service %s state: %w", s.Name, err)
		}
	}
	for r, ap := range s.replicas {
		ref := hedgeReplicaRef{Svc: uint16(idx), Index: uint8(r)}
		if r == 0 {
			ref.IsSvc = 1
		}
		if err := h.objs.Replicas.Put(hedgeSvcKey{A: svcAddr(ap)}, ref); err != nil {
			return fmt.Errorf("write replica %s: %w", ap, err)
		}
	}
	if err := h.objs.Services.Put(hedgeSvcKey{A: svcAddr(s.addr)}, idx); err != nil {
		return fmt.Errorf("write service %s: %w", s.Name, err)
	}
	return nil
}

// bumpLookupGen raises lookup_gen, which invalidates every CPU's cached address matches
// (addr_cache, bpf/hedge/match.h): called after every change to services or replicas.
func (h *Hedger) bumpLookupGen() error {
	var g uint32
	if err := h.objs.LookupGen.Lookup(uint32(0), &g); err != nil {
		return fmt.Errorf("read lookup generation: %w", err)
	}
	if g++; g == 0 {
		g = 1 // 0 is never valid
	}
	if err := h.objs.LookupGen.Put(uint32(0), g); err != nil {
		return fmt.Errorf("write lookup generation: %w", err)
	}
	return nil
}

// arm starts the in-kernel timer (adaptive delay, scoreboard expiry) by running hedge_arm
// once. bpf_timer_init allocates atomically (no reclaim) and fails with ENOMEM while the
// memory cgroup is full (seen on a machine hours into builds: ten tries over 100 ms all
// failed); it is retried with a growing pause, for up to about 5 s, while other work frees
// memory.
func (h *Hedger) arm() error {
	var last uint32
	pause := 10 * time.Millisecond
	for i := 0; i < 16; i++ {
		ret, err := h.objs.HedgeArm.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
		if err != nil {
			return fmt.Errorf("run hedge_arm: %w", err)
		}
		if ret == 0 {
			return nil
		}
		last = ret
		time.Sleep(pause) // nothing to poll: the kernel only said "not now"
		pause = min(2*pause, 400*time.Millisecond)
	}
	if unix.Errno(last) == unix.ENOMEM {
		return fmt.Errorf("start adaptive-delay timer: bpf_timer_init: %w - the kernel could not allocate the timer: free memory (or raise the memory cgroup's limit) and retry", unix.ENOMEM)
	}
	return fmt.Errorf("start adaptive-delay timer: bpf_timer error %d", -int32(last))
}

// Close detaches all programs, removes the delay line and unloads everything.
func (h *Hedger) Close() error {
	var errs []error
	for i := len(h.attached) - 1; i >= 0; i-- {
		errs = append(errs, h.attached[i].Close())
	}
	h.attached = nil
	if h.pacer != nil {
		errs = append(errs, h.pacer.Close())
		h.pacer = nil
	}
	errs = append(errs, h.objs.Close())
	return errors.Join(errs...)
}
