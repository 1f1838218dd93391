package pacer

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

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

// addQdisc puts the backend's qdisc on the delay device: the one asked for, or with auto the
// first of backendOrder the kernel accepts.
func (p *Pacer) addQdisc() error {
	h, err := netlink.NewHandleAt(p.ns.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in pacer netns: %w", err)
	}
	defer h.Close()
	var tried []error
	order := backendOrder(p.opts.Backend)
	for _, b := range order {
		q := p.qdisc(b)
		if err := h.QdiscAdd(q); err != nil {
			tried = append(tried, fmt.Errorf("%s: add %s qdisc: %w", b, q.Type(), bpfx.QdiscError(q.Type(), err)))
			continue
		}
		p.backend = b
		return nil
	}
	if len(order) == 1 && order[0] != BackendConveyor {
		return fmt.Errorf("pacer backend %s does not work on this kernel: %w - use backend auto or conveyor ('kedge probe' lists the backends this kernel offers)",
			order[0], errors.Join(tried...))
	}
	return fmt.Errorf("no pacer backend works on this kernel: %w", errors.Join(tried...))
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
// /run/kedge), is refused (check only for the main veth: the tick veth goes with it). The
// ended run's pacer namespace of the same name goes with its veth, so a restart reclaims
// what a killed run left (its namespace kept its qdisc and fillers alive until then).
func (p *Pacer) consumerVeth(name, peer string, check bool) (int, error) {
	if l, err := p.nh.LinkByName(name); err == nil {
		id, owned := Owner(l.Attrs().Alias)
		if check && owned {
			if v := runstate.Judge(id); v.State != runstate.Dead {
				return 0, fmt.Errorf("%s in this namespace belongs to kedge run %s (%s: %s): stop it first, one runs per namespace (see 'kedge status')", name, id, v.State, v.Reason)
			}
		}
		if err := p.nh.LinkDel(l); err != nil {
			return 0, fmt.Errorf("remove the leftover %s: %w", name, err)
		}
		if check && owned {
			left := fmt.Sprintf("%s-%s-%s", netnsx.Prefix, id, p.opts.Name)
			if err := netnsx.Delete(left); err != nil && !errors.Is(err, os.ErrNotExist) {
				return 0, fmt.Errorf("remove the ended run's pacer namespace %s: %w", left, err)
			}
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
