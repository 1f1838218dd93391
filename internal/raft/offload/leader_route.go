package offload

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
)

// A heartbeat leaves as a clone of the tick's skb (bpf_clone_redirect), and a clone gets no
// neighbour resolution: the frame carries the next hop's MAC, which user space resolves
// here (route, then the neighbour entry of the gateway or of the follower itself) and
// refreshes every Refresh. A follower whose route or neighbour is not known is left to
// user space (its slot inactive, its heartbeats not suppressed): user space's own sends
// resolve the neighbour, and the next refresh hands the follower to the kernel.
// bpf_fib_lookup could do this in the kernel, but it refuses on a device without IP
// forwarding (BPF_FIB_LKUP_RET_FWD_DISABLED), which is every node that is not a router.

var errNoNeigh = errors.New("no resolved neighbour")

// nextHop is where one follower's heartbeats leave.
type nextHop struct {
	ifindex    int
	smac, dmac [6]byte
}

// resolve finds the egress device and the next hop's MAC for dst.
func (l *Leader) resolve(dst netip.Addr) (nextHop, error) {
	var h nextHop
	if !dst.Is4() {
		return h, fmt.Errorf("%v: kernel heartbeats are IPv4 only", dst)
	}
	routes, err := l.nh.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return h, fmt.Errorf("route to %v: %w", dst, err)
	}
	r := routes[0]
	link, err := l.nh.LinkByIndex(r.LinkIndex)
	if err != nil {
		return h, fmt.Errorf("route to %v: device %d: %w", dst, r.LinkIndex, err)
	}
	h.ifindex = r.LinkIndex
	if link.Attrs().Flags&net.FlagLoopback != 0 {
		return h, nil // a local address: no link layer to fill in
	}
	if len(link.Attrs().HardwareAddr) != 6 {
		return h, fmt.Errorf("route to %v: device %s is not Ethernet", dst, link.Attrs().Name)
	}
	copy(h.smac[:], link.Attrs().HardwareAddr)
	hop := r.Gw
	if hop == nil {
		hop = dst.AsSlice()
	}
	neighs, err := l.nh.NeighList(r.LinkIndex, netlink.FAMILY_V4)
	if err != nil {
		return h, fmt.Errorf("neighbours of %s: %w", link.Attrs().Name, err)
	}
	const valid = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT
	for _, n := range neighs {
		if n.IP.Equal(hop) && n.State&valid != 0 && len(n.HardwareAddr) == 6 {
			copy(h.dmac[:], n.HardwareAddr)
			return h, nil
		}
	}
	return h, fmt.Errorf("%v via %v on %s: %w", dst, net.IP(hop), link.Attrs().Name, errNoNeigh)
}

// resolveAll (re)resolves every follower and writes the slots that changed.
func (l *Leader) resolveAll() {
	for i, f := range l.opts.Followers {
		h, err := l.resolve(f.Addr.Addr().Unmap())
		l.mu.Lock()
		s := &l.cur.F[i]
		active := uint16(0)
		if err == nil {
			active = 1
		}
		if s.Active != active || s.Ifindex != uint32(h.ifindex) || s.Dmac != h.dmac || s.Smac != h.smac {
			if err != nil {
				l.opts.Log.Info("raft: follower heartbeats stay in user space", "follower", f.ID, "reason", err)
			} else if s.Active == 0 {
				l.opts.Log.Info("raft: follower heartbeats sent by the kernel", "follower", f.ID, "ifindex", h.ifindex,
					"next_hop_mac", net.HardwareAddr(h.dmac[:]).String())
			}
			l.setSlot(i, active, h)
		}
		l.mu.Unlock()
	}
}

// setSlot changes one follower's link layer: inactive first, then the addresses, then active
// (mmap), so the kernel never sends with half a MAC. Called with mu held.
func (l *Leader) setSlot(i int, active uint16, h nextHop) {
	s := &l.cur.F[i]
	s.Active, s.Ifindex, s.Smac, s.Dmac = active, uint32(h.ifindex), h.smac, h.dmac
	if !l.mmap {
		if err := l.flush(); err != nil {
			l.opts.Log.Warn("raft: write follower route", "follower", s.Id, "err", err)
		}
		return
	}
	word := func(active uint16) uint32 { return uint32(s.Dport) | uint32(active)<<16 } // little endian
	l.store32(slotOff(i, offFDport), word(0))
	l.store32(slotOff(i, offFIfindex), s.Ifindex)
	off := slotOff(i, offFDmac)
	copy(l.lmem[off:off+12], append(s.Dmac[:], s.Smac[:]...))
	l.store32(slotOff(i, offFDport), word(active))
}

func (l *Leader) refresher() {
	defer l.wg.Done()
	t := time.NewTicker(l.opts.Refresh)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.resolveAll()
		}
	}
}
