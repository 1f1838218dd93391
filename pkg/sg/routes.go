package sg

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/nexthop"
	isg "github.com/kedge-dev/kedge/internal/sg"
	"github.com/vishvananda/netlink"
)

// Routes: the interface, each worker's next hop, and the maps that hold them.

// resolve finds the interface and each worker's next-hop MAC, and the default local
// address. Runs inside the group's namespace.
func resolve(cfg *Config) (int, bool, []isg.WorkerCfg, error) {
	link, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return 0, false, nil, fmt.Errorf("find interface %s: %w (list them with 'ip link')", cfg.Interface, err)
	}
	attrs := link.Attrs()
	loopback := attrs.Flags&net.FlagLoopback != 0
	out := make([]isg.WorkerCfg, len(cfg.Workers))
	for i, w := range cfg.Workers {
		addr := w.Addr().Unmap()
		hop, err := resolveWorker(addr, w, loopback)
		if err != nil {
			return 0, false, nil, fmt.Errorf("resolve worker %d (%v): %w", i, w, err)
		}
		if hop.Ifindex != attrs.Index {
			return 0, false, nil, fmt.Errorf("worker %d (%v) is routed through ifindex %d, not %s (%d): every worker must be reached through the group's interface", i, w, hop.Ifindex, cfg.Interface, attrs.Index)
		}
		if i == 0 && !cfg.Local.Addr().IsValid() {
			if !hop.Src.IsValid() {
				return 0, false, nil, fmt.Errorf("no source address towards worker 0 (%v): set Config.Local", w)
			}
			cfg.Local = netip.AddrPortFrom(hop.Src, cfg.Local.Port())
		}
		wc := isg.WorkerCfg{Port: bpfx.Htons(w.Port())}
		wc.Addr.In6U.U6Addr8 = netip.AddrFrom16(addr.As16()).As16()
		if addr.Is4() {
			wc.Addr.In6U.U6Addr8 = netip.AddrFrom16(v4mapped(addr)).As16()
		}
		copy(wc.Mac[:], hop.DstMAC) // none on a loopback interface
		out[i] = wc
	}
	return attrs.Index, loopback, out, nil
}

func v4mapped(a netip.Addr) [16]byte {
	var b [16]byte
	b[10], b[11] = 0xff, 0xff
	v := a.As4()
	copy(b[12:], v[:])
	return b
}

// resolveWorker finds the route to worker w (at addr) and, unless the group runs on a
// loopback interface, its next hop's MAC, asking the kernel to resolve it (a datagram to
// the worker) when it is not known yet.
func resolveWorker(addr netip.Addr, w netip.AddrPort, loopback bool) (nexthop.Hop, error) {
	deadline := time.Now().Add(3 * time.Second)
	for probed := false; ; {
		hop, err := nexthop.Resolve(nil, addr)
		if err == nil || loopback && hop.Ifindex != 0 {
			return hop, nil
		}
		if !errors.Is(err, nexthop.ErrNoNeighbour) {
			return hop, err
		}
		if time.Now().After(deadline) {
			return hop, fmt.Errorf("next hop %v has no MAC address (unreachable?): %w", hop.Via, err)
		}
		if !probed {
			nexthop.Probe(w) // the worker ignores an empty datagram
			probed = true
		}
		time.Sleep(10 * time.Millisecond) // polling the neighbour table with a deadline
	}
}

func (g *Group) fillMaps(ifindex int, loopback bool, workers []isg.WorkerCfg) error {
	gc := isg.GroupCfg{
		Enabled:   1,
		Family:    4,
		Reduce:    uint8(g.cfg.Reduction),
		Dtype:     uint8(g.cfg.Type),
		Nworkers:  uint16(len(workers)),
		Elems:     uint16(g.cfg.Elems),
		SlotBase:  0,
		Nslots:    uint16(g.cfg.InFlight),
		Ifindex:   uint32(ifindex),
		GatherK:   uint32(g.cfg.GatherK),
		TimeoutNs: uint64(g.cfg.Timeout),
		CoordPort: bpfx.Htons(g.cfg.Local.Port()),
	}
	if loopback {
		gc.Flags |= isg.GroupFlagLoopback
	}
	if g.cfg.WakeSocket && !g.cfg.BusyPoll {
		gc.Flags |= isg.GroupFlagWakeSocket
	}
	if g.cfg.MultiPacket {
		gc.Flags |= isg.GroupFlagParts // PartBase 0: the group's slots start at 0
	}
	la := g.cfg.Local.Addr().Unmap()
	if la.Is4() {
		gc.CoordAddr.In6U.U6Addr8 = v4mapped(la)
	} else {
		gc.Family = 6
		gc.CoordAddr.In6U.U6Addr8 = la.As16()
	}
	if g.cfg.Group >= isg.GroupsMax {
		return fmt.Errorf("sg config: group id %d, want < %d", g.cfg.Group, isg.GroupsMax)
	}
	gc.WorkerBase = uint16(uint32(g.cfg.Group) * isg.WorkersMax % 65536)
	base := uint32(g.cfg.Group) * isg.WorkersMax
	for i, w := range workers {
		if err := g.objs.Workers.Put(base+uint32(i), &w); err != nil {
			return fmt.Errorf("write worker %d: %w", i, err)
		}
	}
	if base > 65535 {
		return fmt.Errorf("sg config: group id %d too large", g.cfg.Group)
	}
	gc.WorkerBase = uint16(base)
	if err := g.objs.Groups.Put(uint32(g.cfg.Group), &gc); err != nil {
		return fmt.Errorf("write group: %w", err)
	}
	return nil
}
