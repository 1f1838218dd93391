// Package pacer is kedge's in-kernel pacer: it gives a consumer's BPF code a packet context
// at chosen times (docs/pacer.md). It builds a kedge-owned namespace with a veth into the
// consumer's namespace and a delay device whose qdisc is one of the delay-line backends
// (edt with fq, netem, conveyor with tbf; auto-chosen by probe), attaches the programs
// bpf/include/pacer.h gives the consumer, calibrates itself and reports its precision.
package pacer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/probe"
	"github.com/kedge-dev/kedge/internal/runstate"
	"github.com/kedge-dev/kedge/pkg/kedge"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Backends.
const (
	BackendAuto     = "auto"
	BackendEDT      = "edt"
	BackendNetem    = "netem"
	BackendConveyor = "conveyor"
)

// Backends lists the backend names Options.Backend accepts.
var Backends = []string{BackendAuto, BackendEDT, BackendNetem, BackendConveyor}

var backendIDs = map[string]pacerPacerBackend{
	BackendConveyor: pacerPacerBackendPACER_CONVEYOR,
	BackendNetem:    pacerPacerBackendPACER_NETEM,
	BackendEDT:      pacerPacerBackendPACER_EDT,
}

// Device names inside the pacer namespace, and the MTU of all its devices.
const (
	peerDev   = "pcb" // peer of Options.IfName: pacer_enter; due packets leave here
	tickPeer  = "pct" // peer of the tick veth: pacer_enter makes ticks of what comes in
	delayDev  = "pq0" // carries the backend's qdisc
	delayEnd  = "pq1" // its peer: pacer_pass
	mtu       = 9000
	maxFrame  = mtu + 14
	ownerTag  = "kedge:" // alias of IfName: kedge:<runstate owner ID> of the run that made it
	ethPPacer = 0x88B5   // ethertype of the frames Arm injects (pacer_enter rebuilds them)
)

var (
	tickMinBytes = int(pacerPacerConstsPACER_TICK_MIN_BYTES)
	fillerEthP   = uint16(pacerPacerConstsPACER_FILLER_ETH_P)
	fillerMagic  = uint64(pacerPacerMagicPACER_FILLER_MAGIC)
)

// Options configure a pacer. Zero values take the defaults written beside each field.
type Options struct {
	// Netns is the consumer's namespace (its tick program runs there); -1 means the
	// caller's namespace.
	Netns netns.NsHandle
	// Name names the pacer namespace: lab.OwnedName(Name) (default "pacer").
	Name string
	// IfName is the pacer's veth in the consumer namespace (default "kedge-pc0"); tick
	// requests go through its twin IfName+"t".
	IfName string
	// Backend is auto, edt, netem or conveyor (default auto: the first of edt, netem,
	// conveyor that this kernel runs).
	Backend string
	// Period is one pass on netem and, with Carry, the conveyor's filler queue
	// (default 10ms; 200us..10s).
	Period time.Duration
	// Resolution is one pass of a tick on the conveyor without Carry: the tick frame is
	// padded so that its transmission time at RateMbit is Resolution (default 100us).
	Resolution time.Duration
	// RateMbit and FillerBytes shape the conveyor's tbf (defaults 100 and 1514).
	RateMbit    int
	FillerBytes int
	// Carry: the consumer carries packets (pacer_carry). The conveyor then keeps a filler
	// queue of Period circulating all the time.
	Carry bool
	// LostAfter: an armed tick this long overdue is presumed lost and re-armed by the
	// next request or by the watchdog (default max(4*Period, 100ms)).
	LostAfter time.Duration
	// Log receives the pacer's start and calibration messages (default slog.Default()).
	Log *slog.Logger
}

func (o *Options) setDefaults() error {
	if o.Name == "" {
		o.Name = "pacer"
	}
	if o.IfName == "" {
		o.IfName = "kedge-pc0"
	}
	if o.Backend == "" {
		o.Backend = BackendAuto
	}
	if _, ok := backendIDs[o.Backend]; !ok && o.Backend != BackendAuto {
		return fmt.Errorf("pacer backend %q unknown: use %s", o.Backend, strings.Join(Backends, ", "))
	}
	if o.Period == 0 {
		o.Period = 10 * time.Millisecond
	}
	if o.Period < 200*time.Microsecond || o.Period > 10*time.Second {
		return fmt.Errorf("pacer period %v out of range: use 200us..10s", o.Period)
	}
	if o.Resolution == 0 {
		o.Resolution = 100 * time.Microsecond
	}
	if o.Resolution < 10*time.Microsecond || o.Resolution > o.Period {
		return fmt.Errorf("pacer resolution %v out of range: use 10us..period (%v)", o.Resolution, o.Period)
	}
	if o.RateMbit == 0 {
		o.RateMbit = 100
	}
	if o.RateMbit < 1 || o.RateMbit > 10000 {
		return fmt.Errorf("pacer rate %d Mbit/s out of range: use 1..10000", o.RateMbit)
	}
	if o.FillerBytes == 0 {
		o.FillerBytes = 1514
	}
	// A filler must hold a tick frame: due ticks ride filler passes (pacer_piggyback).
	if o.FillerBytes < tickMinBytes || o.FillerBytes > maxFrame {
		return fmt.Errorf("pacer filler_bytes %d out of range: use %d..%d", o.FillerBytes, tickMinBytes, maxFrame)
	}
	if o.LostAfter == 0 {
		o.LostAfter = max(4*o.Period, 100*time.Millisecond)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return nil
}

// Programs are the consumer's: the two pacer programs wrapped in its SEC("tc") functions,
// its tick program, and the maps pacer.h defined in its collection.
type Programs struct {
	Enter, Pass, Tick        *ebpf.Program
	State, Counters, Control *ebpf.Map
}

// Pacer is a running pacer. Close removes everything it made.
type Pacer struct {
	opts       Options
	backend    string
	rateBytes  uint64
	tickBytes  int
	ns         *lab.Netns
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
	progs      Programs
	attached   []bpfx.Attachment
	cal        Calibration
	stop       chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex // Arm (the socket) from the watchdog and callers
}

// backendOrder returns the backends to try for want: itself, or for auto edt (when the
// kernel has bpf_skb_set_tstamp), netem, conveyor.
func backendOrder(want string) []string {
	if want != BackendAuto {
		return []string{want}
	}
	var out []string
	if haveSetTstamp() == nil {
		out = append(out, BackendEDT)
	}
	return append(out, BackendNetem, BackendConveyor)
}

func haveSetTstamp() error {
	return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnSkbSetTstamp)
}

// MinKernelMajor, MinKernelMinor: pacer.h needs BPF atomics with fetch and
// compare-and-swap (Linux 5.12). A consumer may need more (bpf_loop: 5.17).
const MinKernelMajor, MinKernelMinor = 5, 12

// CheckKernel returns a *kedge.FeatureError on kernels older than MinKernel.
func CheckKernel() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if ok, parsed := probe.KernelAtLeast(rel, MinKernelMajor, MinKernelMinor); parsed && !ok {
		return &kedge.FeatureError{Feature: "the pacer (BPF atomic compare-and-swap)",
			MinKernel: fmt.Sprintf("%d.%d", MinKernelMajor, MinKernelMinor), Hint: "see 'kedge probe'",
			Err: fmt.Errorf("kernel %s", rel)}
	}
	return nil
}

// New builds the pacer's namespace, veths and qdisc. With backend auto it keeps the first
// backend the kernel accepts. On error nothing remains.
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
	if p.ns, err = lab.NewNetns(lab.OwnedName(o.Name)); err != nil {
		return nil, err
	}
	if err := p.makeDevices(); err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(p.ns.Handle)
	if err != nil {
		return nil, fmt.Errorf("open netlink in pacer netns: %w", err)
	}
	defer h.Close()
	var tried []error
	order := backendOrder(o.Backend)
	for _, b := range order {
		q := p.qdisc(b)
		if err := h.QdiscAdd(q); err != nil {
			tried = append(tried, fmt.Errorf("%s: add %s qdisc: %w", b, q.Type(), bpfx.QdiscError(q.Type(), err)))
			continue
		}
		p.backend = b
		break
	}
	if p.backend == "" {
		if len(order) == 1 && order[0] != BackendConveyor {
			return nil, fmt.Errorf("pacer backend %s does not work on this kernel: %w - use backend auto or conveyor ('kedge probe' lists the backends this kernel offers)",
				order[0], errors.Join(tried...))
		}
		return nil, fmt.Errorf("no pacer backend works on this kernel: %w", errors.Join(tried...))
	}
	p.tickBytes = p.tickFrameBytes()
	if err := p.openArmSocket(); err != nil {
		return nil, err
	}
	return p, nil
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

func (p *Pacer) qdisc(backend string) netlink.Qdisc {
	attrs := netlink.QdiscAttrs{LinkIndex: p.devIfx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	switch backend {
	case BackendEDT:
		fq := netlink.NewFq(attrs)
		fq.Horizon = uint32((10 * time.Second).Microseconds())
		fq.HorizonDropPolicy = 1
		fq.PacketLimit = 100000
		fq.FlowPacketLimit = 100000
		return fq
	case BackendNetem:
		return netlink.NewNetem(attrs, netlink.NetemQdiscAttrs{
			Latency: uint32(p.opts.Period.Microseconds()),
			Limit:   100000,
		})
	default: // conveyor
		burst := uint32(2 * maxFrame)
		// Queue room: the fillers plus 64 MiB of carried packets before tbf drops.
		limit := uint32(float64(p.rateBytes)*p.opts.Period.Seconds()) + 64<<20
		return &netlink.Tbf{QdiscAttrs: attrs, Rate: p.rateBytes, Buffer: netlink.Xmittime(p.rateBytes, burst), Limit: limit}
	}
}

func (p *Pacer) makeDevices() error {
	var err error
	if p.nh, err = bpfx.NetlinkHandle(p.consumerNS); err != nil {
		return fmt.Errorf("consumer netns: %w", err)
	}
	dh, err := netlink.NewHandleAt(p.ns.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in pacer netns: %w", err)
	}
	defer dh.Close()
	// The main veth first: its alias names the owner, and a live owner's is refused.
	if p.ifIndex, err = p.consumerVeth(p.opts.IfName, peerDev, true); err != nil {
		return err
	}
	p.ownsIf = true
	if p.tickIfx, err = p.consumerVeth(p.tickIfName(), tickPeer, false); err != nil {
		return err
	}
	if err := dh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: delayDev, MTU: mtu}, PeerName: delayEnd, PeerMTU: mtu}); err != nil {
		return fmt.Errorf("add veth %s: %w", delayDev, err)
	}
	for _, n := range []string{"lo", peerDev, tickPeer, delayDev, delayEnd} {
		l, err := dh.LinkByName(n)
		if err != nil {
			return fmt.Errorf("find %s: %w", n, err)
		}
		_ = dh.LinkSetIP6AddrGenMode(l, 1)
		if err := dh.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", n, err)
		}
		switch n {
		case peerDev:
			p.peerIfx = l.Attrs().Index
		case tickPeer:
			p.tickPeerIx = l.Attrs().Index
		case delayDev:
			p.devIfx = l.Attrs().Index
		case delayEnd:
			p.devEndIfx, p.devEndMAC = l.Attrs().Index, l.Attrs().HardwareAddr
		}
	}
	return nil
}

func (p *Pacer) tickIfName() string { return p.opts.IfName + "t" }

// consumerVeth makes the veth name in the consumer namespace with its peer in the pacer
// namespace, up and without addresses, and returns its ifindex. Its alias names the owner
// (kedge:<runstate owner ID>). One left by an ended run would block it and is removed; one
// whose owner is alive, or cannot be proven dead (another PID namespace, another
// /run/kedge), is refused (check only for the main veth: the tick veth goes with it).
func (p *Pacer) consumerVeth(name, peer string, check bool) (int, error) {
	if l, err := p.nh.LinkByName(name); err == nil {
		if id, ok := Owner(l.Attrs().Alias); check && ok {
			if v := runstate.Judge(id); v.State != runstate.Dead {
				return 0, fmt.Errorf("%s in this namespace belongs to kedge run %s (%s: %s): stop it first, one runs per namespace (see 'kedge status')", name, id, v.State, v.Reason)
			}
		}
		if err := p.nh.LinkDel(l); err != nil {
			return 0, fmt.Errorf("remove the leftover %s: %w", name, err)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: mtu},
		PeerName:      peer,
		PeerNamespace: netlink.NsFd(int(p.ns.Handle)),
		PeerMTU:       mtu,
	}
	if err := p.nh.LinkAdd(veth); err != nil {
		return 0, fmt.Errorf("add veth %s: %w", name, err)
	}
	l, err := p.nh.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("find %s: %w", name, err)
	}
	if err := p.nh.LinkSetAlias(l, ownerTag+runstate.SelfID()); err != nil {
		return 0, fmt.Errorf("name the owner of %s: %w", name, err)
	}
	// No addresses at all: no IPv6 link-local, DAD or router solicitations into the pacer.
	_ = p.nh.LinkSetIP6AddrGenMode(l, 1 /* IN6_ADDR_GEN_MODE_NONE */)
	if err := p.nh.LinkSetUp(l); err != nil {
		return 0, fmt.Errorf("set %s up: %w", name, err)
	}
	return l.Attrs().Index, nil
}

// Owner parses the owner ID (runstate.ParseID: <pid>_<hex>, or a bare pid from older runs)
// from the alias of a pacer's veth.
func Owner(alias string) (string, bool) {
	id, ok := strings.CutPrefix(alias, ownerTag)
	if !ok {
		return "", false
	}
	_, _, ok = runstate.ParseID(id)
	return id, ok
}

// KindVeth is the runstate kind of a pacer's veths in its consumer namespace.
const KindVeth = runstate.KindVeth

// The pacer's veths in the consumer namespace outlive a killed run (the pacer namespace's
// end takes them along, but the consumer's may be any namespace): `kedge cleanup` and a
// starting hedger find them by their alias, so a dead owner's record stays until they go.
func init() {
	runstate.Register(runstate.Cleaner{Kind: KindVeth, Order: 28, List: func(s runstate.Scope) ([]runstate.Leftover, error) {
		var out []runstate.Leftover
		err := bpfx.ScopeNetns(s, func(label string, ns netns.NsHandle) error {
			vs, err := listVeths(ns)
			for _, v := range vs {
				out = append(out, runstate.Leftover{Kind: KindVeth, Name: label + v.name, Owner: v.owner,
					Remove: func() error { return removeVeth(ns, v.name, v.index) }})
			}
			return err
		})
		return out, err
	}})
}

type ownedVeth struct {
	name, owner string
	index       int
}

// listVeths lists the links of namespace ns (-1: the caller's) whose alias names an owner.
func listVeths(ns netns.NsHandle) ([]ownedVeth, error) {
	var out []ownedVeth
	err := bpfx.EachLink(ns, func(_ *netlink.Handle, l netlink.Link) {
		if id, ok := Owner(l.Attrs().Alias); ok {
			out = append(out, ownedVeth{l.Attrs().Name, id, l.Attrs().Index})
		}
	})
	return out, err
}

// removeVeth deletes the link name of ns if it is still the one listed (index); one gone
// already (its peer's namespace went first) is not an error.
func removeVeth(ns netns.NsHandle, name string, index int) error {
	h, err := bpfx.NetlinkHandle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || err == nil && l.Attrs().Index != index {
		return nil // gone, or another's by now
	}
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
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

// Configure writes pacer_cfg into a consumer's collection spec (one that includes
// pacer.h). Call it before loading the collection.
func (p *Pacer) Configure(spec *ebpf.CollectionSpec) error {
	return ConfigureSpec(spec, p.config())
}

func (p *Pacer) config() pacerPacerConfig {
	return pacerPacerConfig{
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

// Start attaches the programs (Enter and Pass in the pacer namespace, Tick at IfName
// ingress), fills and calibrates the conveyor's filler queue when Carry is on, measures
// the tick precision and starts the lost-tick watchdog. On error the caller closes.
func (p *Pacer) Start(progs Programs) error {
	if progs.Enter == nil || progs.Pass == nil || progs.Tick == nil || progs.State == nil || progs.Counters == nil || progs.Control == nil {
		return errors.New("start pacer: Programs needs Enter, Pass, Tick, State, Counters and Control")
	}
	p.progs = progs
	for _, a := range []struct {
		p   *ebpf.Program
		ns  netns.NsHandle
		ifx int
		n   string
	}{
		{progs.Enter, p.ns.Handle, p.peerIfx, "pacer_enter"},
		{progs.Enter, p.ns.Handle, p.tickPeerIx, "pacer_enter"},
		{progs.Pass, p.ns.Handle, p.devEndIfx, "pacer_pass"},
		{progs.Tick, p.consumerNS, p.ifIndex, "pacer_tick"},
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

// openArmSocket opens the packet socket Arm sends tick requests through (the tick veth,
// so pacer_enter makes a tick of what it sends).
func (p *Pacer) openArmSocket() error {
	return bpfx.InNetns(p.consumerNS, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		p.armFD = fd
		return nil
	})
}

// Arm asks for a tick at deadline (CLOCK_MONOTONIC, as Now and bpf_ktime_get_ns), as
// pacer_request does from BPF: nothing happens when a tick at or before it is armed.
func (p *Pacer) Arm(deadline time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armFD < 0 || p.progs.State == nil {
		return errors.New("arm pacer: not started")
	}
	var st pacerPacerState
	if err := p.progs.State.Lookup(uint32(0), &st); err != nil {
		return fmt.Errorf("arm pacer: read state: %w", err)
	}
	now := Now()
	d := uint64(deadline)
	if st.ArmedNs != 0 && st.ArmedNs <= d && uint64(now) < st.ArmedNs+uint64(p.opts.LostAfter) {
		return nil
	}
	if err := p.progs.State.Update(uint32(0), pacerPacerState{ArmedNs: d, Seq: st.Seq + 1}, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("arm pacer: write state: %w", err)
	}
	frame := make([]byte, tickMinBytes)
	copy(frame[0:6], []byte{0x02, 'k', 'p', 'a', 'c', 'e'})
	copy(frame[6:12], []byte{0x02, 'k', 'p', 'a', 'c', 'e'})
	binary.BigEndian.PutUint16(frame[12:14], ethPPacer)
	sa := &unix.SockaddrLinklayer{Ifindex: p.tickIfx, Protocol: htons(ethPPacer), Halen: 6}
	if err := unix.Sendto(p.armFD, frame, 0, sa); err != nil {
		return fmt.Errorf("arm pacer: send tick request: %w", err)
	}
	return nil
}

// Now is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns and of tick deadlines.
func Now() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// watchdog re-arms a tick that is overdue by LostAfter (lost in a qdisc, say) when no
// request came to do it. It reads one map value per LostAfter/2.
func (p *Pacer) watchdog() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.LostAfter / 2)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		var st pacerPacerState
		if err := p.progs.State.Lookup(uint32(0), &st); err != nil || st.ArmedNs == 0 {
			continue
		}
		if uint64(Now()) >= st.ArmedNs+uint64(p.opts.LostAfter) {
			if err := p.Arm(time.Duration(st.ArmedNs)); err != nil {
				p.opts.Log.Warn("pacer watchdog: re-arm a lost tick", "err", err)
			} else {
				p.opts.Log.Debug("pacer watchdog: re-armed a lost tick", "deadline", st.ArmedNs)
			}
		}
	}
}

// addFillers injects n filler frames into the conveyor's queue from a packet socket.
func (p *Pacer) addFillers(n int) error {
	if n <= 0 {
		return nil
	}
	return p.ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		defer unix.Close(fd)
		// Fillers circulate forever and stay charged to this socket's send buffer.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 256<<20)
		frame := make([]byte, p.opts.FillerBytes)
		copy(frame[0:6], p.devEndMAC)
		copy(frame[6:12], []byte{0x02, 'k', 'e', 'd', 'g', 'e'})
		binary.BigEndian.PutUint16(frame[12:14], fillerEthP)
		binary.NativeEndian.PutUint64(frame[14:22], fillerMagic)
		sa := &unix.SockaddrLinklayer{Ifindex: p.devIfx, Protocol: htons(fillerEthP), Halen: 6}
		copy(sa.Addr[:], p.devEndMAC)
		for i := 0; i < n; i++ {
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("send filler %d/%d: %w", i+1, n, err)
			}
		}
		p.fillers += n
		return nil
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// fillersFor returns how many fillers make a queue of one period at the conveyor's rate.
func (p *Pacer) fillersFor(period time.Duration) int {
	return int(math.Round(period.Seconds() * float64(p.rateBytes) / float64(p.opts.FillerBytes)))
}

// Close stops the watchdog, detaches the programs and removes the veth and the namespace
// (with it the qdisc and the fillers). The consumer closes its own collection.
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
	p.mu.Lock()
	if p.armFD >= 0 {
		unix.Close(p.armFD)
		p.armFD = -1
	}
	p.mu.Unlock()
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
	return errors.Join(errs...)
}

// Config is struct pacer_config (bpf/include/pacer.h): what Configure writes into a
// consumer's spec. Exported for consumers' BPF_PROG_TEST_RUN fixtures, which load their
// programs without a running pacer.
type Config = pacerPacerConfig

// RawStats is struct pacer_stats, one CPU's counters (for fixtures' per-CPU sums).
type RawStats = pacerPacerStats

// Ctl is struct pacer_ctl (conveyor filler control).
type Ctl = pacerPacerCtl

// BackendID returns enum pacer_backend for a backend name (auto and unknown names: conveyor).
func BackendID(name string) uint32 { return uint32(backendIDs[name]) }

// Config returns the pacer_cfg Configure writes.
func (p *Pacer) Config() Config { return p.config() }

// ConfigureSpec writes cfg as pacer_cfg into a consumer's collection spec.
func ConfigureSpec(spec *ebpf.CollectionSpec, cfg Config) error {
	v, ok := spec.Variables["pacer_cfg"]
	if !ok {
		return errors.New("configure pacer: the collection has no pacer_cfg (does it include pacer.h?)")
	}
	if err := v.Set(cfg); err != nil {
		return fmt.Errorf("configure pacer: set pacer_cfg: %w", err)
	}
	return nil
}
