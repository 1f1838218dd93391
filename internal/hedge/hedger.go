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
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/kedge-dev/kedge/internal/bpfx"
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
}

// Hedger is a running hedger. Close detaches everything and removes the delay line.
type Hedger struct {
	Config      *Config
	Backend     string
	IfIndex     int
	Calibration Calibration

	objs     hedgeObjects
	dl       *DelayLine
	attached []bpfx.Attachment
	log      *slog.Logger
}

// Calibration describes the delay line as measured at start.
type Calibration struct {
	Target  time.Duration `json:"target_ns"` // wanted transit time per pass
	Mean    time.Duration `json:"mean_ns"`   // measured (conveyor: filler round trip)
	Min     time.Duration `json:"min_ns"`
	Max     time.Duration `json:"max_ns"`
	Fillers int           `json:"fillers"`
	Spread  time.Duration `json:"spread_ns"` // conveyor: one filler's transmission time, FillerBytes*8/rate
}

// backendIDs maps a backend's name to enum dl_backend (bpf/include/hedge.h).
var backendIDs = map[string]hedgeDlBackend{
	BackendConveyor: hedgeDlBackendDL_CONVEYOR,
	BackendNetem:    hedgeDlBackendDL_NETEM,
	BackendEDT:      hedgeDlBackendDL_EDT,
}

// backendOrder returns the backends to try: the requested one, or all in preference order
// (edt only when the kernel has bpf_skb_set_tstamp).
func backendOrder(want string) []string {
	if want != "" && want != BackendAuto {
		return []string{want}
	}
	var out []string
	if features.HaveProgramHelper(ebpf.SchedCLS, asm.FnSkbSetTstamp) == nil {
		out = append(out, BackendEDT)
	}
	return append(out, BackendNetem, BackendConveyor)
}

// Start builds the delay line, loads and attaches the hedger. On error nothing remains.
func Start(cfg *Config, opts Options) (_ *Hedger, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkKernel(); err != nil {
		return nil, err
	}
	h := &Hedger{Config: cfg, log: opts.Log}
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
	if want == BackendEDT {
		if err := features.HaveProgramHelper(ebpf.SchedCLS, asm.FnSkbSetTstamp); err != nil {
			return nil, fmt.Errorf("delay-line backend edt: %w", bpfx.NotSupported("BPF helper bpf_skb_set_tstamp", "5.18",
				"use --backend netem or conveyor", err))
		}
	}
	if h.dl, err = newDelayLine(opts.Netns, backendOrder(want), cfg.DelayLine); err != nil {
		return nil, err
	}
	h.Backend = h.dl.Backend
	if err := h.load(); err != nil {
		return nil, err
	}
	if err := h.fillMaps(); err != nil {
		return nil, err
	}
	if err := h.dl.attach(h.objs.DlEntry, h.objs.DlLoop); err != nil {
		return nil, err
	}
	for _, a := range []struct {
		p   *ebpf.Program
		ifx int
		dir bpfx.Direction
		n   string
	}{
		{h.objs.HedgeResp, h.IfIndex, bpfx.Ingress, "hedge_resp"},
		{h.objs.HedgeRescue, h.dl.ClientIfx, bpfx.Ingress, "hedge_rescue"},
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
	if h.Backend == BackendConveyor {
		if err := h.calibrate(); err != nil {
			return nil, err
		}
	}
	h.log.Info("hedger started", "interface", cfg.Interface, "backend", h.Backend,
		"period", h.dl.Period, "services", len(cfg.Services))
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
	early := time.Duration(0)
	if h.Backend != BackendEDT {
		early = h.dl.Period / 2
	}
	cfg := hedgeHedgeConfig{
		DlIfindex:     uint32(h.dl.ClientIfx),
		OutIfindex:    uint32(h.IfIndex),
		HedgeMark:     h.Config.Mark,
		DlBackend:     uint32(backendIDs[h.Backend]),
		DlPeerIfindex: uint32(h.dl.PeerIfx),
		DlDevIfindex:  uint32(h.dl.DevIfx),
		EarlyNs:       uint64(early),
		TtlNs:         uint64(time.Duration(h.Config.TTL)),
		TickNs:        uint64(time.Duration(h.Config.Tick)),
	}
	if err := spec.Variables[hedgeVarCfg].Set(cfg); err != nil {
		return fmt.Errorf("set run configuration: %w", err)
	}
	return bpfx.LoadAndAssign("hedge", spec, &h.objs, nil)
}

func svcAddr(ap netip.AddrPort) hedgeSvcAddr {
	var a hedgeSvcAddr
	a.Addr.In6U.U6Addr8 = netip.AddrFrom16(ap.Addr().As16()).As16()
	if ap.Addr().Is4() {
		a.Addr.In6U.U6Addr8 = netip.AddrFrom16(netip.AddrFrom4(ap.Addr().As4()).As16()).As16()
	}
	a.Port = htons(ap.Port())
	return a
}

// fillMaps writes the services into services, replicas, svc_cfgs and svc_states.
func (h *Hedger) fillMaps() error {
	for i, s := range h.Config.Services {
		idx := uint32(i)
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
			ref := hedgeReplicaRef{Svc: uint16(i), Index: uint8(r)}
			if r == 0 {
				ref.IsSvc = 1
			}
			if err := h.objs.Replicas.Put(hedgeSvcKey{A: svcAddr(ap)}, ref); err != nil {
				return fmt.Errorf("write replica %s: %w", ap, err)
			}
		}
		if err := h.objs.SvcCfgs.Put(idx, cfg); err != nil {
			return fmt.Errorf("write service %s config: %w", s.Name, err)
		}
		if err := h.objs.SvcStates.Put(idx, state); err != nil {
			return fmt.Errorf("write service %s state: %w", s.Name, err)
		}
		if err := h.objs.Services.Put(hedgeSvcKey{A: svcAddr(s.addr)}, idx); err != nil {
			return fmt.Errorf("write service %s: %w", s.Name, err)
		}
	}
	return nil
}

// arm starts the in-kernel timer (adaptive delay, scoreboard expiry) by running hedge_arm
// once. bpf_timer_init can fail with ENOMEM under memory pressure; it is retried.
func (h *Hedger) arm() error {
	var last uint32
	for i := 0; i < 10; i++ {
		ret, err := h.objs.HedgeArm.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
		if err != nil {
			return fmt.Errorf("run hedge_arm: %w", err)
		}
		if ret == 0 {
			return nil
		}
		last = ret
		time.Sleep(10 * time.Millisecond) // nothing to poll: the kernel only said "not now"
	}
	return fmt.Errorf("start adaptive-delay timer: bpf_timer error %d", -int32(last))
}

// calibrate fills the conveyor so a pass takes the target period, measuring the fillers'
// own round-trip times and correcting the filler count a few times.
func (h *Hedger) calibrate() error {
	d := h.dl
	target := d.Period
	if err := d.addFillers(d.fillersFor(target)); err != nil {
		return err
	}
	h.Calibration = Calibration{Target: target, Spread: time.Duration(float64(d.fillerBytes) / float64(d.rateBytes) * float64(time.Second))}
	for round := 0; round < 6; round++ {
		mean, lo, hi, err := h.measurePeriod(max(3*target, 100*time.Millisecond))
		if err != nil {
			return err
		}
		h.Calibration.Mean, h.Calibration.Min, h.Calibration.Max = mean, lo, hi
		h.Calibration.Fillers = d.fillers
		off := mean - target
		h.log.Debug("conveyor calibration", "round", round, "fillers", d.fillers, "mean", mean, "target", target)
		if off.Abs() <= max(h.Calibration.Spread, target/50) {
			return nil
		}
		// Each filler adds one spread to the period.
		delta := int(math.Round(float64(-off) / float64(h.Calibration.Spread)))
		if delta > 0 {
			if err := d.addFillers(delta); err != nil {
				return err
			}
		} else if delta < 0 {
			if err := h.objs.DlControl.Put(uint32(0), hedgeDlCtl{FillersToDrop: int32(-delta)}); err != nil {
				return fmt.Errorf("shrink conveyor: %w", err)
			}
			d.fillers += delta
		}
	}
	h.log.Warn("conveyor calibration did not converge", "target", target, "mean", h.Calibration.Mean)
	return nil
}

// measurePeriod samples the conveyor's filler round trips over window.
func (h *Hedger) measurePeriod(window time.Duration) (mean, lo, hi time.Duration, err error) {
	before, err := h.dlStats()
	if err != nil {
		return 0, 0, 0, err
	}
	// Reset min/max so this window's extremes are seen.
	if err := h.resetDLMinMax(); err != nil {
		return 0, 0, 0, err
	}
	time.Sleep(window)
	after, err := h.dlStats()
	if err != nil {
		return 0, 0, 0, err
	}
	n := after.PeriodCount - before.PeriodCount
	if n == 0 {
		return 0, 0, 0, errors.New("conveyor fillers are not circulating (no filler round trips measured)")
	}
	return time.Duration((after.PeriodSumNs - before.PeriodSumNs) / n), time.Duration(after.PeriodMinNs), time.Duration(after.PeriodMaxNs), nil
}

func (h *Hedger) resetDLMinMax() error {
	var per []hedgeDlStats
	if err := h.objs.DlCounters.Lookup(uint32(0), &per); err != nil {
		return fmt.Errorf("read delay-line counters: %w", err)
	}
	for i := range per {
		per[i].PeriodMinNs, per[i].PeriodMaxNs = 0, 0
	}
	if err := h.objs.DlCounters.Put(uint32(0), per); err != nil {
		return fmt.Errorf("reset delay-line counters: %w", err)
	}
	return nil
}

// Close detaches all programs, removes the delay line and unloads everything.
func (h *Hedger) Close() error {
	var errs []error
	for i := len(h.attached) - 1; i >= 0; i-- {
		errs = append(errs, h.attached[i].Close())
	}
	h.attached = nil
	if h.dl != nil {
		errs = append(errs, h.dl.Close())
		h.dl = nil
	}
	errs = append(errs, h.objs.Close())
	return errors.Join(errs...)
}
