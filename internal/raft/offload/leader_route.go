package offload

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/internal/nexthop"
)

// A heartbeat leaves as a clone of the tick's skb (bpf_clone_redirect), and a clone gets no
// neighbour resolution: the frame carries the next hop's MAC, which user space resolves
// here (route, then the neighbour entry of the gateway or of the follower itself) and
// refreshes every Refresh. A follower whose route or neighbour is not known is left to
// user space (its slot inactive, its heartbeats not suppressed): user space's own sends
// resolve the neighbour, and the next refresh hands the follower to the kernel.
// bpf_fib_lookup could do this in the kernel, but it refuses on a device without IP
// forwarding (BPF_FIB_LKUP_RET_FWD_DISABLED), which is every node that is not a router.

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
	hop, err := nexthop.Resolve(l.nh, dst)
	if err != nil {
		return h, err
	}
	h.ifindex = hop.Ifindex
	copy(h.smac[:], hop.SrcMAC)
	copy(h.dmac[:], hop.DstMAC) // both nil for a local address: no link layer to fill in
	return h, nil
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
