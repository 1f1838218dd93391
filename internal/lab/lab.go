// Package lab builds network-namespace topologies for kedge's tests, demo and benchmarks.
//
// A lab is a set of hosts (one namespace each, one interface eth0) joined by a fabric
// namespace: a bridge (one L2 segment) or a router (one subnet per host, forwarding on).
// Addresses come from test ranges (198.18.0.0/16, RFC 2544; 2001:db8::/48, RFC 3849) or
// from the subnets a Spec names; neighbours are static and IPv6 DAD is off, so a lab is
// usable the moment Up returns. Every name carries the kedge-<owner>- prefix (runstate);
// Close (or, after a crash, `kedge cleanup`) removes everything. A persistent lab
// (Spec.Persistent, made by `kedge lab up`) outlives its creator instead: its namespaces are
// named kedge-lab-<name>-<host> (or another Spec.NamePrefix), Open finds it again and Down
// (or Close) removes it. Nothing is ever created in the caller's namespace.
package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
)

// Fabric selects how hosts are joined.
type Fabric int

const (
	// Bridge puts every host on one L2 segment (198.18.0.0/24, 2001:db8::/64).
	Bridge Fabric = iota
	// Router gives host i the subnet 198.18.i.0/24 (2001:db8:i::/64) with the fabric
	// namespace routing between them (.1 is the router, .2 the host).
	Router
)

// String returns "bridge" or "router".
func (f Fabric) String() string {
	switch f {
	case Bridge:
		return "bridge"
	case Router:
		return "router"
	}
	return fmt.Sprintf("fabric(%d)", int(f))
}

// ParseFabric parses "bridge" or "router".
func ParseFabric(s string) (Fabric, error) {
	switch s {
	case "bridge":
		return Bridge, nil
	case "router":
		return Router, nil
	}
	return 0, fmt.Errorf("unknown fabric %q: use bridge or router", s)
}

// Spec declares a topology.
type Spec struct {
	Name   string   // short lab name, part of every namespace name
	Fabric Fabric   //
	Hosts  []string // host names, in order; host i (from 1) gets addresses from i
	MTU    int      // 0: the veth default (1500)
	// Persistent names the namespaces <NamePrefix><Name>-<host> instead of
	// kedge-<owner>-..., so the lab outlives this process (cleanup leaves it alone); remove
	// it with Close or Down. Name must then be letters, digits and '_' only.
	Persistent bool
	// NamePrefix starts a persistent lab's namespace names; "": PersistentPrefix
	// (kedge-lab-). Open, Down and ListPersistent take the same prefix.
	NamePrefix string
	// Subnet4 is the IPv4 /16 the addresses come from; invalid (zero): DefaultSubnet4.
	// Bridge: hosts on <Subnet4>.0.10+i/24; router: host i on <Subnet4>.i.0/24.
	Subnet4 netip.Prefix
	// Subnet6 is the IPv6 /48 the addresses come from; invalid (zero): DefaultSubnet6.
	// Bridge: hosts on <Subnet6>:0::10+i/64; router: host i on <Subnet6>:i::/64.
	Subnet6 netip.Prefix
}

// The address plan's defaults: benchmarking (RFC 2544) and documentation (RFC 3849) ranges.
var (
	DefaultSubnet4 = netip.MustParsePrefix("198.18.0.0/16")
	DefaultSubnet6 = netip.MustParsePrefix("2001:db8::/48")
)

// ParseSubnets parses an IPv4 /16 and an IPv6 /48 ("" keeps the default) as Spec takes them.
func ParseSubnets(v4, v6 string) (s4, s6 netip.Prefix, err error) {
	s4, s6 = DefaultSubnet4, DefaultSubnet6
	if v4 != "" {
		if s4, err = netip.ParsePrefix(v4); err != nil || !s4.Addr().Is4() || s4.Bits() != 16 || s4.Masked() != s4 {
			return s4, s6, fmt.Errorf("subnet %q is not an IPv4 /16 such as 10.77.0.0/16", v4)
		}
	}
	if v6 != "" {
		if s6, err = netip.ParsePrefix(v6); err != nil || !s6.Addr().Is6() || s6.Addr().Is4In6() || s6.Bits() != 48 || s6.Masked() != s6 {
			return s4, s6, fmt.Errorf("subnet %q is not an IPv6 /48 such as fd00:77::/48", v6)
		}
	}
	return s4, s6, nil
}

func (s Spec) subnets() (netip.Prefix, netip.Prefix) {
	s4, s6 := s.Subnet4, s.Subnet6
	if !s4.IsValid() {
		s4 = DefaultSubnet4
	}
	if !s6.IsValid() {
		s6 = DefaultSubnet6
	}
	return s4, s6
}

func (s Spec) namePrefix() string {
	if s.NamePrefix == "" {
		return PersistentPrefix
	}
	return s.NamePrefix
}

// Host is one namespace with its interface eth0.
type Host struct {
	*netnsx.Netns
	HostName string
	Index    int // 1-based position in Spec.Hosts
	Iface    string
	IfIndex  int
	MAC      net.HardwareAddr
	IPv4     netip.Addr
	IPv6     netip.Addr
	Gateway4 netip.Addr // Router fabric only
	Gateway6 netip.Addr
}

// Lab is a running topology. Close removes it.
type Lab struct {
	Spec   Spec
	Fabric *netnsx.Netns
	Hosts  []*Host
	byName map[string]*Host
}

const hostIface = "eth0"

// Up builds the topology. On error everything created so far is removed.
func Up(spec Spec) (_ *Lab, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	l := &Lab{Spec: spec, byName: map[string]*Host{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	if l.Fabric, err = l.newNetns(fabricPart); err != nil {
		return nil, err
	}
	if err := l.setupFabric(); err != nil {
		return nil, err
	}
	for i, name := range spec.Hosts {
		ns, err := l.newNetns(name)
		if err != nil {
			return nil, err
		}
		h := &Host{Netns: ns, HostName: name, Index: i + 1, Iface: hostIface}
		l.Hosts = append(l.Hosts, h)
		l.byName[name] = h
		if err := l.connect(h); err != nil {
			return nil, fmt.Errorf("connect host %s: %w", name, err)
		}
	}
	if err := l.staticNeighbours(); err != nil {
		return nil, err
	}
	if err := l.waitOperUp(linkUpTimeout); err != nil {
		return nil, err
	}
	return l, nil
}

// linkUpTimeout bounds waitOperUp; the kernel's link watcher runs at most once a second.
const linkUpTimeout = 5 * time.Second

// waitOperUp waits until every host's eth0 and its fabric peer are operationally up. Setting
// a veth up is not enough: the kernel's link watcher (deferred work, rate-limited to one
// run a second) attaches the real qdisc and marks the carrier only later, and until then
// packets are dropped (noop qdisc) and bridge ports do not forward.
func (l *Lab) waitOperUp(timeout time.Duration) error {
	fh, err := netlink.NewHandleAt(l.Fabric.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in fabric: %w", err)
	}
	defer fh.Close()
	deadline := time.Now().Add(timeout)
	for _, h := range l.Hosts {
		hh, err := netlink.NewHandleAt(h.Handle)
		if err != nil {
			return fmt.Errorf("open netlink in %s: %w", h.HostName, err)
		}
		err = errors.Join(waitLinkUp(hh, hostIface, deadline), waitLinkUp(fh, fmt.Sprintf("v%d", h.Index), deadline))
		if err == nil {
			err = waitLocalRoutes(hh, deadline, h.IPv4, h.IPv6)
		}
		hh.Close()
		if err != nil {
			return fmt.Errorf("wait for host %s: %w", h.HostName, err)
		}
	}
	return nil
}

func waitLinkUp(h *netlink.Handle, name string, deadline time.Time) error {
	for {
		link, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		if st := link.Attrs().OperState; st == netlink.OperUp {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("%s still %s after %v: link watcher stuck?", name, st, linkUpTimeout)
		}
		time.Sleep(time.Millisecond) // polling a kernel state with a deadline
	}
}

// waitLocalRoutes waits until each address has its local route. IPv6 installs it from
// addrconf's deferred work (even with DAD off), which waits for the RTNL lock: while other
// namespaces are being torn down that took seconds, and a host dropped the first packets
// addressed to it (Ip6InAddrErrors).
func waitLocalRoutes(h *netlink.Handle, deadline time.Time, addrs ...netip.Addr) error {
	for _, a := range addrs {
		for {
			rs, err := h.RouteGet(a.AsSlice())
			if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no local route for %s after %v (route get: %v)", a, linkUpTimeout, err)
			}
			time.Sleep(time.Millisecond) // polling a kernel state with a deadline
		}
	}
	return nil
}

// newNetns creates the namespace for part (a host name or the fabric).
func (l *Lab) newNetns(part string) (*netnsx.Netns, error) {
	name := netnsx.OwnedName(l.Spec.Name + "-" + part)
	if l.Spec.Persistent {
		name = persistentName(l.Spec.namePrefix(), l.Spec.Name, part)
	}
	ns, err := netnsx.New(name)
	if l.Spec.Persistent && errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("lab %s already exists (namespace %s): %w - remove it with 'kedge lab down %s' or pick another name",
			l.Spec.Name, name, ErrExist, l.Spec.Name)
	}
	return ns, err
}

// Host returns the named host or nil.
func (l *Lab) Host(name string) *Host { return l.byName[name] }

// Close deletes every namespace of the lab (hosts first, then the fabric).
func (l *Lab) Close() error {
	var errs []error
	for i := len(l.Hosts) - 1; i >= 0; i-- {
		errs = append(errs, l.Hosts[i].Close())
	}
	errs = append(errs, l.Fabric.Close())
	return errors.Join(errs...)
}

func (l *Lab) setupFabric() error {
	h, err := netlink.NewHandleAt(l.Fabric.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in fabric: %w", err)
	}
	defer h.Close()
	if err := linkUpByName(h, "lo"); err != nil {
		return err
	}
	switch l.Spec.Fabric {
	case Bridge:
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge: %w", err)
		}
		return linkUpByName(h, "br0")
	case Router:
		for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := l.Fabric.SetSysctl(k, "1"); err != nil {
				return fmt.Errorf("enable forwarding in fabric: %w", err)
			}
		}
		return nil
	}
	return fmt.Errorf("unknown fabric kind %d", l.Spec.Fabric)
}

// addresses returns (host v4, host v6, gateway v4, gateway v6, prefix lengths) for host i.
func (l *Lab) addresses(i int) (h4, h6, g4, g6 netip.Addr, p4, p6 int) {
	s4, s6 := l.Spec.subnets()
	if l.Spec.Fabric == Router {
		return addr4(s4, byte(i), 2), addr6(s6, uint16(i), 2), addr4(s4, byte(i), 1), addr6(s6, uint16(i), 1), 24, 64
	}
	return addr4(s4, 0, byte(10+i)), addr6(s6, 0, uint16(10+i)), netip.Addr{}, netip.Addr{}, 24, 64
}

// addr4 is <s>.subnet.host of the /16 s.
func addr4(s netip.Prefix, subnet, host byte) netip.Addr {
	a := s.Addr().As4()
	return netip.AddrFrom4([4]byte{a[0], a[1], subnet, host})
}

// v6 is addr6 in the default /48.
func v6(subnet, host uint16) netip.Addr { return addr6(DefaultSubnet6, subnet, host) }

// addr6 is <s>:subnet::host of the /48 s.
func addr6(s netip.Prefix, subnet, host uint16) netip.Addr {
	a := s.Addr().As16()
	a[6], a[7] = byte(subnet>>8), byte(subnet)
	a[14], a[15] = byte(host>>8), byte(host)
	return netip.AddrFrom16(a)
}

// connect creates eth0 in the host with its peer v-<index> in the fabric, addresses and routes.
func (l *Lab) connect(host *Host) error {
	hh, err := netlink.NewHandleAt(host.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in host: %w", err)
	}
	defer hh.Close()
	fh, err := netlink.NewHandleAt(l.Fabric.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in fabric: %w", err)
	}
	defer fh.Close()

	peer := fmt.Sprintf("v%d", host.Index)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostIface, MTU: l.Spec.MTU},
		PeerName:      peer,
		PeerNamespace: netlink.NsFd(int(l.Fabric.Handle)),
		PeerMTU:       uint32(l.Spec.MTU),
	}
	if err := hh.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", hostIface, peer, err)
	}
	h4, h6, g4, g6, p4, p6 := l.addresses(host.Index)
	host.IPv4, host.IPv6, host.Gateway4, host.Gateway6 = h4, h6, g4, g6

	if err := linkUpByName(hh, "lo"); err != nil {
		return err
	}
	link, err := hh.LinkByName(hostIface)
	if err != nil {
		return fmt.Errorf("find %s: %w", hostIface, err)
	}
	host.IfIndex, host.MAC = link.Attrs().Index, link.Attrs().HardwareAddr
	if err := addAddrs(hh, link, netip.PrefixFrom(h4, p4), netip.PrefixFrom(h6, p6)); err != nil {
		return err
	}
	if err := hh.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", hostIface, err)
	}

	plink, err := fh.LinkByName(peer)
	if err != nil {
		return fmt.Errorf("find fabric %s: %w", peer, err)
	}
	switch l.Spec.Fabric {
	case Bridge:
		br, err := fh.LinkByName("br0")
		if err != nil {
			return fmt.Errorf("find br0: %w", err)
		}
		if err := fh.LinkSetMaster(plink, br); err != nil {
			return fmt.Errorf("attach %s to br0: %w", peer, err)
		}
	case Router:
		if err := addAddrs(fh, plink, netip.PrefixFrom(g4, p4), netip.PrefixFrom(g6, p6)); err != nil {
			return err
		}
		for _, gw := range []netip.Addr{g4, g6} {
			r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}
			if gw.Is4() {
				r.Dst = &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
			} else {
				r.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
			}
			if err := hh.RouteAdd(r); err != nil {
				return fmt.Errorf("add default route via %s: %w", gw, err)
			}
		}
	}
	if err := fh.LinkSetUp(plink); err != nil {
		return fmt.Errorf("set %s up: %w", peer, err)
	}
	return nil
}

// staticNeighbours fills every neighbour table so no ARP/ND happens during measurements.
func (l *Lab) staticNeighbours() error {
	fh, err := netlink.NewHandleAt(l.Fabric.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in fabric: %w", err)
	}
	defer fh.Close()
	for _, h := range l.Hosts {
		hh, err := netlink.NewHandleAt(h.Handle)
		if err != nil {
			return fmt.Errorf("open netlink in %s: %w", h.HostName, err)
		}
		switch l.Spec.Fabric {
		case Bridge:
			for _, o := range l.Hosts {
				if o == h {
					continue
				}
				err = addNeigh(hh, h.IfIndex, o.MAC, o.IPv4, o.IPv6)
				if err != nil {
					break
				}
			}
		case Router:
			var plink netlink.Link
			plink, err = fh.LinkByName(fmt.Sprintf("v%d", h.Index))
			if err == nil {
				err = addNeigh(hh, h.IfIndex, plink.Attrs().HardwareAddr, h.Gateway4, h.Gateway6)
			}
			if err == nil {
				err = addNeigh(fh, plink.Attrs().Index, h.MAC, h.IPv4, h.IPv6)
			}
		}
		hh.Close()
		if err != nil {
			return fmt.Errorf("static neighbours for %s: %w", h.HostName, err)
		}
	}
	return nil
}

func addNeigh(h *netlink.Handle, ifindex int, mac net.HardwareAddr, ips ...netip.Addr) error {
	for _, ip := range ips {
		n := &netlink.Neigh{LinkIndex: ifindex, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
		if ip.Is4() {
			n.Family = unix.AF_INET
		} else {
			n.Family = unix.AF_INET6
		}
		if err := h.NeighSet(n); err != nil {
			return fmt.Errorf("add neighbour %s: %w", ip, err)
		}
	}
	return nil
}

func addAddrs(h *netlink.Handle, link netlink.Link, prefixes ...netip.Prefix) error {
	for _, p := range prefixes {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, a); err != nil {
			return fmt.Errorf("add address %s to %s: %w", p, link.Attrs().Name, err)
		}
	}
	return nil
}

func linkUpByName(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}
