// Package nexthop finds where packets to an address leave and the link-layer addresses a
// BPF program needs to send a whole frame itself (a clone or a packet built in the kernel
// gets no neighbour resolution): the route's device, its MAC and the next hop's MAC from
// the neighbour table.
package nexthop

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// ErrNoNeighbour: the next hop has no usable entry in the neighbour table (not resolved yet,
// or unreachable).
var ErrNoNeighbour = errors.New("no resolved neighbour")

// Hop is where packets to one address leave.
type Hop struct {
	Ifindex  int
	Loopback bool       // a local address: no link layer to fill in (the MACs stay nil)
	Src      netip.Addr // the route's preferred source address (invalid when it has none)
	Via      netip.Addr // the next hop: the route's gateway, or the address itself on-link
	SrcMAC   net.HardwareAddr
	DstMAC   net.HardwareAddr
}

// usable are the neighbour states whose MAC a program may send to: resolved (reachable, or
// stale/delay/probe while the kernel re-checks it), configured (permanent) or not needing
// resolution (noarp). Incomplete, failed and new (none) entries have no valid address.
const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE |
	netlink.NUD_PERMANENT | netlink.NUD_NOARP

// Resolve finds the route to dst and, unless it is local, the device's MAC and the next
// hop's from the neighbour table, in h's namespace (nil: the calling thread's). It does
// not ask the kernel to resolve a missing neighbour: an error wrapping ErrNoNeighbour says
// that one is missing (traffic to the next hop, or Probe, makes the kernel resolve it).
func Resolve(h *netlink.Handle, dst netip.Addr) (Hop, error) {
	if h == nil {
		h = &netlink.Handle{}
	}
	dst = dst.Unmap()
	var hop Hop
	routes, err := h.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return hop, fmt.Errorf("route to %v: %w", dst, orNoRoute(err))
	}
	r := routes[0]
	hop.Ifindex = r.LinkIndex
	if src, ok := netip.AddrFromSlice(r.Src); ok {
		hop.Src = src.Unmap()
	}
	hop.Via = dst
	if gw, ok := netip.AddrFromSlice(r.Gw); ok && gw.IsValid() {
		hop.Via = gw.Unmap()
	}
	link, err := h.LinkByIndex(r.LinkIndex)
	if err != nil {
		return hop, fmt.Errorf("route to %v: device %d: %w", dst, r.LinkIndex, err)
	}
	if link.Attrs().Flags&net.FlagLoopback != 0 {
		hop.Loopback = true
		return hop, nil
	}
	if len(link.Attrs().HardwareAddr) != 6 {
		return hop, fmt.Errorf("route to %v: device %s is not Ethernet", dst, link.Attrs().Name)
	}
	hop.SrcMAC = link.Attrs().HardwareAddr
	family := netlink.FAMILY_V4
	if hop.Via.Is6() {
		family = netlink.FAMILY_V6
	}
	neighs, err := h.NeighList(r.LinkIndex, family)
	if err != nil {
		return hop, fmt.Errorf("neighbours of %s: %w", link.Attrs().Name, err)
	}
	for _, n := range neighs {
		ip, _ := netip.AddrFromSlice(n.IP)
		if ip.Unmap() == hop.Via && n.State&usable != 0 && len(n.HardwareAddr) == 6 {
			hop.DstMAC = n.HardwareAddr
			return hop, nil
		}
	}
	return hop, fmt.Errorf("%v via %v on %s: %w", dst, hop.Via, link.Attrs().Name, ErrNoNeighbour)
}

func orNoRoute(err error) error {
	if err == nil {
		return errors.New("no route")
	}
	return err
}

// Probe makes the kernel resolve the next hop towards dst by sending it an empty UDP
// datagram (a receiver ignores it) from the calling thread's namespace.
func Probe(dst netip.AddrPort) {
	if c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst)); err == nil {
		_, _ = c.Write(nil)
		c.Close()
	}
}
