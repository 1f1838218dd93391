package pping

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// Monitor is a loaded pping object: programs and maps. Attach puts it on an interface;
// Close detaches and frees everything.
type Monitor struct {
	cfg        Config
	objs       monitorObjects
	sockops    *ebpf.Program // the kernel RTT source (KernelRTT), else nil
	attach     []bpfx.Attachment
	cgroupLink link.Link // the sock_ops program on its cgroup
	cgroupPath string
	clock      monoClock
	jiffies    jiffyClock
	clockFixed bool // the programs read bpf/include/clock.h's fixed clock (fixtures)
	aggMu      sync.Mutex
	aggPrev    int // buffer the kernel wrote before the last flip (under aggMu)
}

// monitorObjects is what Load loads: bpf2go's maps and variables, egress, and the ingress
// program of the configured hook only (pping_ingress or pping_xdp, loaded under the
// first's name), so a kernel that refuses one ingress program still runs the other and a
// load verifies nothing it does not use.
type monitorObjects struct {
	ppingMaps
	ppingVariables
	PpingEgress   *ebpf.Program `ebpf:"pping_egress"`
	PpingIngress  *ebpf.Program `ebpf:"pping_ingress"`
	PpingGcExpire *ebpf.Program `ebpf:"pping_gc_expire"`
	PpingGcFlows  *ebpf.Program `ebpf:"pping_gc_flows"`
}

func (o *monitorObjects) Close() error {
	return errors.Join(o.PpingEgress.Close(), o.PpingIngress.Close(), o.PpingGcExpire.Close(),
		o.PpingGcFlows.Close(), o.ppingMaps.Close())
}

// kernelObjects adds the kernel RTT source's program, loaded only when it is configured (a
// kernel that cannot run it still runs the packet programs).
type kernelObjects struct {
	monitorObjects
	PpingSockops *ebpf.Program `ebpf:"pping_sockops"`
}

// Load validates cfg and loads the BPF object with it.
func Load(cfg Config) (*Monitor, error) {
	return load(cfg, nil)
}

// load is Load with prepare, when not nil, applied to the spec before the programs are
// loaded (the fixtures fix the programs' clock).
func load(cfg Config, prepare func(*ebpf.CollectionSpec) error) (*Monitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	spec, err := loadPping()
	if err != nil {
		return nil, fmt.Errorf("load pping spec: %w", err)
	}
	if prepare != nil {
		if err := prepare(spec); err != nil {
			return nil, err
		}
	}
	if cfg.KernelRTT {
		if err := KernelRTTSupported(); err != nil {
			return nil, err
		}
	}
	m := &Monitor{cfg: cfg}
	if err := spec.Variables[ppingVarKedgeClockFixed].Get(&m.clockFixed); err != nil {
		return nil, fmt.Errorf("read the clock setting: %w", err)
	}
	if m.clockFixed {
		tick := time.Duration(ppingKedgeClockConstsKEDGE_CLOCK_FIXED_JIFFY_NS)
		m.jiffies = jiffyClock{tick: tick, refNs: 0, refJ: 0}
	} else if m.jiffies, err = kernelJiffyClock(); err != nil {
		return nil, err
	}
	if err := spec.Variables[ppingVarPpCfg].Set(cfg.bpfConfig(m.jiffies.tick)); err != nil {
		return nil, fmt.Errorf("set pping config: %w", err)
	}
	if cfg.MaxFlows > 0 {
		spec.Maps[ppingMapFlows].MaxEntries = uint32(cfg.MaxFlows)
		spec.Maps[ppingMapPktTs].MaxEntries = uint32(2 * cfg.MaxFlows)
	}
	if cfg.MaxSubnets > 0 {
		for _, name := range []string{ppingMapAgg40, ppingMapAgg41, ppingMapAgg60, ppingMapAgg61} {
			spec.Maps[name].MaxEntries = uint32(2 * (cfg.MaxSubnets + 1)) // two sides, + the "other" entries
		}
	}
	if cfg.IngressHook == IngressXDP {
		spec.Programs[ppingProgPpingIngress] = spec.Programs[ppingProgPpingXdp]
	}
	delete(spec.Programs, ppingProgPpingXdp)
	var to any = &m.objs
	var k kernelObjects
	if cfg.KernelRTT {
		to = &k
	} else {
		delete(spec.Programs, ppingProgPpingSockops)
	}
	if err := bpfx.LoadAndAssign("pping", spec, to, nil); err != nil {
		if ve := (*ebpf.VerifierError)(nil); cfg.IngressHook == IngressXDP && errors.As(err, &ve) {
			return nil, fmt.Errorf("%w - if it is pping_xdp, try --ingress-hook tc", err)
		}
		return nil, err
	}
	if cfg.KernelRTT {
		m.objs, m.sockops = k.monitorObjects, k.PpingSockops
	}
	if err := m.init(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Monitor) init() error {
	for _, s := range m.cfg.Services {
		spec := ppingReqidSpec{Offset: s.Offset, Len: s.Len, Order: b2u(s.LittleEndian)}
		if err := m.objs.Services.Put(bpfx.Htons(s.Port), spec); err != nil {
			return fmt.Errorf("add UDP service %d: %w", s.Port, err)
		}
	}
	if m.cfg.Aggregate > 0 {
		if err := m.initAggregation(); err != nil {
			return err
		}
	}
	return nil
}

// Config returns the configuration the monitor was loaded with.
func (m *Monitor) Config() Config { return m.cfg }

// Attach attaches the ingress and egress programs to ifindex in ns (-1: the caller's
// namespace): egress with TC in mode, ingress with TC too or, with the XDP ingress hook,
// with XDP (native, falling back to generic); and with KernelRTT the sock_ops program to
// the configured cgroup, for the sockets of ns. The attachments live until Close.
func (m *Monitor) Attach(ns netns.NsHandle, ifindex int, mode bpfx.TCMode) error {
	if m.sockops != nil {
		if err := m.attachKernelRTT(ns); err != nil {
			return err
		}
	}
	if m.cfg.IngressHook == IngressXDP {
		a, err := bpfx.AttachXDP(m.objs.PpingIngress, ns, ifindex, m.cfg.XDPMode)
		if busy := (*bpfx.XDPBusyError)(nil); errors.As(err, &busy) {
			detach := "end its holder"
			if len(busy.Holders) == 0 {
				detach = fmt.Sprintf("ip link set dev %s xdp off", busy.Iface)
			}
			return fmt.Errorf("attach pping ingress: %w - use --ingress-hook tc (pping's TC ingress program runs beside it), or detach it (%s)", err, detach)
		}
		if err != nil {
			return fmt.Errorf("attach pping ingress: %w - try --ingress-hook tc", err)
		}
		m.attach = append(m.attach, a)
	}
	for _, t := range []struct {
		prog *ebpf.Program
		dir  bpfx.Direction
	}{{m.objs.PpingIngress, bpfx.Ingress}, {m.objs.PpingEgress, bpfx.Egress}} {
		if t.dir == bpfx.Ingress && m.cfg.IngressHook == IngressXDP {
			continue
		}
		a, err := bpfx.AttachTC(t.prog, bpfx.TCTarget{Netns: ns, IfIndex: ifindex, Dir: t.dir, Mode: mode, Name: "pping-" + t.dir.String()})
		if err != nil {
			return fmt.Errorf("attach pping %s: %w", t.dir, err)
		}
		m.attach = append(m.attach, a)
	}
	return nil
}

// AttachMode reports how the programs were attached: "tcx" or "clsact" for both hooks, or
// "xdp-native+tcx" and the like with the XDP ingress hook (ingress first); "" before Attach.
func (m *Monitor) AttachMode() string {
	var modes []string
	for _, a := range m.attach {
		if !slices.Contains(modes, a.Mode()) {
			modes = append(modes, a.Mode())
		}
	}
	return strings.Join(modes, "+")
}

// Programs returns the ingress (TC or XDP, as configured) and egress programs (for
// BPF_PROG_TEST_RUN and run-time statistics).
func (m *Monitor) Programs() (ingress, egress *ebpf.Program) {
	return m.objs.PpingIngress, m.objs.PpingEgress
}

// Close detaches the programs and frees the maps.
func (m *Monitor) Close() error {
	var errs []error
	for i := len(m.attach) - 1; i >= 0; i-- {
		errs = append(errs, m.attach[i].Close())
	}
	m.attach = nil
	if m.cgroupLink != nil {
		errs = append(errs, m.cgroupLink.Close())
		m.cgroupLink, m.cgroupPath = nil, ""
	}
	if m.sockops != nil {
		errs = append(errs, m.sockops.Close())
		m.sockops = nil
	}
	errs = append(errs, m.objs.Close())
	return errors.Join(errs...)
}
