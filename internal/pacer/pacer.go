// Package pacer is kedge's in-kernel pacer: it gives a consumer's BPF code a packet context
// at chosen times (docs/pacer.md). It builds a kedge-owned namespace with a veth into the
// consumer's namespace and a delay device whose qdisc is one of the delay-line backends
// (edt with fq, netem, conveyor with tbf; auto-chosen by probe), loads and attaches its own
// programs (bpf/pacer/pacer.bpf.c), hands a consumer what its collection shares with them
// (Client), attaches the consumer's tick program, calibrates itself and reports its precision.
//
// The files hold one job each: options.go (options, backends, kernel check), devices.go
// (namespace, veths, qdisc, owner records), client.go (what a consumer binds), arm.go (tick
// requests from user space, the lost-tick watchdog), conveyor.go (the filler queue and its
// calibration), stats.go (counters, precision, tick calibration).
package pacer

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

var (
	tickMinBytes = int(pacerPacerConstsPACER_TICK_MIN_BYTES)
	fillerEthP   = uint16(pacerPacerConstsPACER_FILLER_ETH_P)
	fillerMagic  = uint64(pacerPacerMagicPACER_FILLER_MAGIC)
)

// Pacer is a running pacer. Close removes everything it made.
type Pacer struct {
	opts       Options
	backend    string
	rateBytes  uint64
	tickBytes  int
	ns         *netnsx.Netns
	consumerNS netns.NsHandle
	nh         *netlink.Handle // consumer namespace
	ownsIf     bool
	ifIndex    int // IfName, consumer namespace
	tickIfx    int // IfName+"t", consumer namespace
	peerIfx    int
	tickPeerIx int
	devIfx     int
	devEndIfx  int
	devEndMAC  net.HardwareAddr
	armFD      int // packet socket on IfName (Arm), -1 when closed
	fillers    int
	objs       pacerObjects // the pacer's own programs and maps
	attached   []bpfx.Attachment
	cal        Calibration
	stop       chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex // Arm (the socket) from the watchdog and callers
}

// New builds the pacer's namespace, veths and qdisc and loads its programs. With backend
// auto it keeps the first backend the kernel accepts. On error nothing remains.
func New(o Options) (_ *Pacer, err error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	if err := CheckKernel(); err != nil {
		return nil, err
	}
	if o.Backend == BackendEDT {
		if err := haveSetTstamp(); err != nil {
			return nil, fmt.Errorf("pacer backend edt: %w", bpfx.NotSupported("BPF helper bpf_skb_set_tstamp", "5.18",
				"use backend netem or conveyor", err))
		}
	}
	p := &Pacer{opts: o, consumerNS: o.Netns, armFD: -1, rateBytes: uint64(o.RateMbit) * 1_000_000 / 8}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()
	if p.ns, err = netnsx.New(netnsx.OwnedName(o.Name)); err != nil {
		return nil, err
	}
	if err := p.makeDevices(); err != nil {
		return nil, err
	}
	if err := p.addQdisc(); err != nil {
		return nil, err
	}
	p.tickBytes = p.tickFrameBytes()
	if err := p.load(); err != nil {
		return nil, err
	}
	if err := p.openArmSocket(); err != nil {
		return nil, err
	}
	return p, nil
}

// load loads the pacer's own object with its configuration.
func (p *Pacer) load() error {
	spec, err := loadPacer()
	if err != nil {
		return fmt.Errorf("load pacer spec: %w", err)
	}
	if err := (Client{Config: p.config()}).Bind(spec, nil); err != nil {
		return err
	}
	return bpfx.LoadAndAssign("pacer", spec, &p.objs, nil)
}

// tickFrameBytes: on the conveyor without carry the tick frame's transmission time is the
// resolution; elsewhere the smallest frame.
func (p *Pacer) tickFrameBytes() int {
	if p.backend != BackendConveyor || p.opts.Carry {
		return tickMinBytes
	}
	n := int(math.Round(p.opts.Resolution.Seconds() * float64(p.rateBytes)))
	return min(max(n, tickMinBytes), maxFrame)
}

// tickMaxBytes: on the conveyor without carry a tick not yet due is resized for each pass
// to what is left of its wait, up to the largest frame (pacer_tick_resize); 0 elsewhere.
func (p *Pacer) tickMaxBytes() int {
	if p.backend != BackendConveyor || p.opts.Carry {
		return 0
	}
	return maxFrame
}

// Backend is the backend in use.
func (p *Pacer) Backend() string { return p.backend }

// Period is one pass (netem; the conveyor's filler queue with Carry).
func (p *Pacer) Period() time.Duration { return p.opts.Period }

// IfIndex is the pacer's veth in the consumer namespace.
func (p *Pacer) IfIndex() int { return p.ifIndex }

// Namespace is the name of the pacer's namespace ("" once closed).
func (p *Pacer) Namespace() string {
	if p.ns == nil {
		return ""
	}
	return p.ns.Name
}

// SlowFiles returns the descriptors whose last close waits for an RCU grace period: the
// bpf_links of its programs (tcx_link_release) and Arm's packet socket (packet_release). A
// process that must die at once when killed hands duplicates of them to internal/fastexit
// (the raft leader's kernel heartbeats do), and releases those before Close.
func (p *Pacer) SlowFiles() []int {
	var fds []int
	for _, a := range p.attached {
		if fd := bpfx.LinkFD(a); fd >= 0 {
			fds = append(fds, fd)
		}
	}
	p.mu.Lock()
	if p.armFD >= 0 {
		fds = append(fds, p.armFD)
	}
	p.mu.Unlock()
	return fds
}

// pass is how long a tick (or a carried packet) not yet due waits before it is looked at
// again (0 on edt: one pass, at the deadline).
func (p *Pacer) pass(carried bool) time.Duration {
	switch {
	case p.backend == BackendEDT:
		return 0
	case p.backend == BackendNetem, p.opts.Carry && carried:
		return p.opts.Period
	case carried:
		return 0 // the conveyor without carry holds no carried packets
	case p.opts.Carry:
		return p.frameTime(p.opts.FillerBytes) // ticks ride the filler passes
	default:
		return p.frameTime(p.tickBytes)
	}
}

func (p *Pacer) frameTime(bytes int) time.Duration {
	return time.Duration(float64(bytes) / float64(p.rateBytes) * float64(time.Second))
}

func (p *Pacer) config() Config {
	return Config{
		Backend:         uint32(backendIDs[p.backend]),
		Ifindex:         uint32(p.ifIndex),
		PeerIfindex:     uint32(p.peerIfx),
		TickIfindex:     uint32(p.tickIfx),
		TickPeerIfindex: uint32(p.tickPeerIx),
		DevIfindex:      uint32(p.devIfx),
		TickBytes:       uint32(p.tickBytes),
		TickMaxBytes:    uint32(p.tickMaxBytes()),
		RateBytes:       uint32(p.rateBytes),
		EarlyNs:         uint64(p.pass(false) / 2),
		CarryEarlyNs:    uint64(p.pass(true) / 2),
		LostNs:          uint64(p.opts.LostAfter),
	}
}

// Start attaches the pacer's programs in its namespace and the consumer's tick program (one
// of a collection bound with Client().Bind) at IfName ingress, fills and calibrates the
// conveyor's filler queue when Carry is on, measures the tick precision and starts the
// lost-tick watchdog. On error the caller closes.
func (p *Pacer) Start(tick *ebpf.Program) error {
	if tick == nil {
		return errors.New("start pacer: no tick program")
	}
	for _, a := range []struct {
		p   *ebpf.Program
		ns  netns.NsHandle
		ifx int
		n   string
	}{
		{p.objs.PacerEnter, p.ns.Handle, p.peerIfx, "pacer_enter"},
		{p.objs.PacerEnter, p.ns.Handle, p.tickPeerIx, "pacer_enter"},
		{p.objs.PacerPass, p.ns.Handle, p.devEndIfx, "pacer_pass"},
		{tick, p.consumerNS, p.ifIndex, "pacer_tick"},
	} {
		at, err := bpfx.AttachTC(a.p, bpfx.TCTarget{Netns: a.ns, IfIndex: a.ifx, Dir: bpfx.Ingress, Name: a.n})
		if err != nil {
			return fmt.Errorf("attach %s: %w", a.n, err)
		}
		p.attached = append(p.attached, at)
	}
	p.cal = Calibration{Backend: p.backend, Target: p.pass(false)}
	if p.backend == BackendConveyor {
		p.cal.Spread = p.frameTime(p.opts.FillerBytes)
		if !p.opts.Carry {
			p.cal.Spread = p.frameTime(p.tickBytes)
		}
		p.cal.TickBytes = p.tickBytes
	}
	if p.backend == BackendConveyor && p.opts.Carry {
		if err := p.calibrateConveyor(); err != nil {
			return err
		}
	}
	if err := p.measureTicks(); err != nil {
		return err
	}
	p.stop = make(chan struct{})
	p.wg.Add(1)
	go p.watchdog()
	p.opts.Log.Info("pacer started", "backend", p.backend, "pass", p.cal.Target, "tick_bytes", p.tickBytes,
		"carry", p.opts.Carry, "tick_late_p50", p.cal.TickLate.P50, "tick_late_max", p.cal.TickLate.Max)
	return nil
}

// Close stops the watchdog, detaches the programs, removes the veth and the namespace (with
// it the qdisc and the fillers) and unloads the pacer's object. The consumer closes its own
// collection.
func (p *Pacer) Close() error {
	var errs []error
	if p.stop != nil {
		close(p.stop)
		p.wg.Wait()
		p.stop = nil
	}
	for i := len(p.attached) - 1; i >= 0; i-- {
		errs = append(errs, p.attached[i].Close())
	}
	p.attached = nil
	p.closeArmSocket()
	if p.nh != nil {
		for _, name := range []string{p.opts.IfName, p.tickIfName()} {
			if l, err := p.nh.LinkByName(name); err == nil && p.ownsIf {
				if err := p.nh.LinkDel(l); err != nil {
					errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
				}
			}
		}
		p.nh.Close()
		p.nh = nil
	}
	if p.ns != nil {
		errs = append(errs, p.ns.Close())
		p.ns = nil
	}
	errs = append(errs, p.objs.Close())
	p.objs = pacerObjects{}
	return errors.Join(errs...)
}
