package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// PersistentPrefix starts the namespace names of persistent labs by default:
// kedge-lab-<name>-<host> and kedge-lab-<name>-fabric (Spec.NamePrefix picks another).
// OwnerID does not parse them, so cleanup keeps them.
const PersistentPrefix = netnsx.Prefix + "-lab-"

const (
	fabricPart = "fabric"
	defaultMTU = 1500 // veth default: Spec.MTU 0
)

var (
	// ErrNotFound: no persistent lab of that name exists.
	ErrNotFound = errors.New("lab not found")
	// ErrExist: a persistent lab of that name exists already.
	ErrExist = errors.New("lab exists")

	labNameRE  = regexp.MustCompile(`^[A-Za-z0-9_]{1,32}$`)
	hostNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$`)
)

func persistentName(prefix, lab, part string) string { return prefix + lab + "-" + part }

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,32}$`)

// ValidPrefix checks a persistent lab's namespace-name prefix: 1-32 letters, digits, '_',
// '.' or '-', and not one that makes names look like a run's (kedge-<owner>-...), which
// cleanup would judge by that owner.
func ValidPrefix(prefix string) error {
	if !prefixRE.MatchString(prefix) {
		return fmt.Errorf("name prefix %q is not valid: use 1-32 letters, digits, '_', '.' or '-'", prefix)
	}
	if _, owned := netnsx.OwnerID(prefix + "x-h"); owned {
		return fmt.Errorf("name prefix %q would make names of the form %s-<owner>-..., which cleanup removes: pick another", prefix, netnsx.Prefix)
	}
	return nil
}

// ValidName checks a persistent lab name: 1-32 letters, digits or '_' (no '-', so the
// namespace names parse back unambiguously).
func ValidName(name string) error {
	if !labNameRE.MatchString(name) {
		return fmt.Errorf("lab name %q is not valid: use 1-32 letters, digits or '_'", name)
	}
	return nil
}

// Validate checks the spec as Up does (names, host count, duplicates).
func (s Spec) Validate() error {
	if s.Name == "" || len(s.Hosts) == 0 {
		return errors.New("lab spec needs a name and at least one host")
	}
	if s.Persistent {
		if err := ValidName(s.Name); err != nil {
			return err
		}
		if err := ValidPrefix(s.namePrefix()); err != nil {
			return err
		}
	}
	if len(s.Hosts) > 200 {
		return fmt.Errorf("lab spec has %d hosts, at most 200 fit the address plan", len(s.Hosts))
	}
	for i, h := range s.Hosts {
		switch {
		case h == fabricPart:
			return fmt.Errorf("lab host name %q is reserved for the fabric namespace: pick another", h)
		case !hostNameRE.MatchString(h):
			return fmt.Errorf("lab host name %q is not valid: use 1-32 letters, digits, '_', '.' or '-', starting with a letter, digit or '_'", h)
		case slices.Contains(s.Hosts[:i], h):
			return fmt.Errorf("lab spec names host %q twice", h)
		}
	}
	return nil
}

// Release closes the lab's namespace handles but leaves the namespaces in place: the way
// to let go of a persistent lab that should outlive this process. Close removes it instead.
func (l *Lab) Release() {
	for _, h := range l.Hosts {
		h.Release()
	}
	l.Fabric.Release()
}

// Persistent labs go with `kedge cleanup --all` (internal/cleanup imports no lab).
func init() {
	runstate.RegisterPersistent(runstate.Persistent{Kind: "lab", List: ListPersistent, Remove: func(name string) error {
		_, err := Down(name)
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("%w: %w", err, os.ErrNotExist)
		}
		return err
	}})
}

// ListPersistent returns the names of the persistent labs present (sorted), including
// half-built or half-removed ones.
func ListPersistent() ([]string, error) { return ListPersistentIn(PersistentPrefix) }

// ListPersistentIn is ListPersistent for labs whose namespaces start with prefix.
func ListPersistentIn(prefix string) ([]string, error) {
	entries, err := netnsx.List()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e, prefix)
		if !ok {
			continue
		}
		name, _, ok := strings.Cut(rest, "-")
		if ok && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// namespacesOf returns the namespace names of persistent lab name, hosts first, fabric last.
func namespacesOf(prefix, name string) ([]string, error) {
	entries, err := netnsx.List()
	if err != nil {
		return nil, err
	}
	var hosts []string
	fabric := ""
	for _, e := range entries {
		part, ok := strings.CutPrefix(e, prefix+name+"-")
		switch {
		case !ok:
		case part == fabricPart:
			fabric = e
		default:
			hosts = append(hosts, e)
		}
	}
	if fabric != "" {
		hosts = append(hosts, fabric)
	}
	return hosts, nil
}

// Down removes the persistent lab name (every namespace kedge-lab-<name>-*, even of a
// half-built lab) and returns the namespaces it deleted. It returns ErrNotFound when there
// is nothing of that name.
func Down(name string) ([]string, error) { return DownIn(PersistentPrefix, name) }

// DownIn is Down for a lab whose namespaces start with prefix.
func DownIn(prefix, name string) ([]string, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if err := ValidPrefix(prefix); err != nil {
		return nil, err
	}
	nss, err := namespacesOf(prefix, name)
	if err != nil {
		return nil, err
	}
	if len(nss) == 0 {
		return nil, fmt.Errorf("remove lab %s: %w", name, ErrNotFound)
	}
	var removed []string
	var errs []error
	for _, n := range nss {
		if err := netnsx.Delete(n); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete netns %s: %w", n, err))
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}

// Open finds the persistent lab name and rebuilds its Spec and Hosts (ifindex, MAC,
// addresses, gateways) from netlink. Close removes the lab; Release just lets go of it.
func Open(name string) (*Lab, error) { return OpenIn(PersistentPrefix, name) }

// OpenIn is Open for a lab whose namespaces start with prefix.
func OpenIn(prefix, name string) (_ *Lab, err error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if err := ValidPrefix(prefix); err != nil {
		return nil, err
	}
	nss, err := namespacesOf(prefix, name)
	if err != nil {
		return nil, err
	}
	fabricName := persistentName(prefix, name, fabricPart)
	if !slices.Contains(nss, fabricName) {
		if len(nss) > 0 {
			return nil, fmt.Errorf("open lab %s: fabric namespace %s missing (half-removed lab?) - remove it with 'kedge lab down %s'", name, fabricName, name)
		}
		return nil, fmt.Errorf("open lab %s: %w (see 'kedge lab list')", name, ErrNotFound)
	}
	l := &Lab{Spec: Spec{Name: name, Persistent: true}, byName: map[string]*Host{}}
	if prefix != PersistentPrefix {
		l.Spec.NamePrefix = prefix
	}
	defer func() {
		if err != nil {
			l.Release()
		}
	}()
	if l.Fabric, err = openNetns(fabricName); err != nil {
		return nil, err
	}
	fh, err := netlink.NewHandleAt(l.Fabric.Handle)
	if err != nil {
		return nil, fmt.Errorf("open netlink in fabric: %w", err)
	}
	defer fh.Close()
	l.Spec.Fabric = Router
	if _, err := fh.LinkByName("br0"); err == nil {
		l.Spec.Fabric = Bridge
	}
	for _, nsName := range nss {
		if nsName == fabricName {
			continue
		}
		ns, err := openNetns(nsName)
		if err != nil {
			return nil, err
		}
		h := &Host{Netns: ns, HostName: strings.TrimPrefix(nsName, prefix+name+"-"), Iface: hostIface}
		l.Hosts = append(l.Hosts, h)
		mtu, err := readHost(h, fh)
		if err != nil {
			return nil, fmt.Errorf("open lab %s: host %s: %w", name, h.HostName, err)
		}
		if mtu != defaultMTU {
			l.Spec.MTU = mtu
		}
		l.byName[h.HostName] = h
	}
	slices.SortFunc(l.Hosts, func(a, b *Host) int { return a.Index - b.Index })
	if len(l.Hosts) > 0 {
		// The address plan's /16 and /48, as Up chose them; kept zero when the default.
		if p, err := l.Hosts[0].IPv4.Prefix(16); err == nil && p != DefaultSubnet4 {
			l.Spec.Subnet4 = p
		}
		if p, err := l.Hosts[0].IPv6.Prefix(48); err == nil && p != DefaultSubnet6 {
			l.Spec.Subnet6 = p
		}
	}
	for _, h := range l.Hosts {
		l.Spec.Hosts = append(l.Spec.Hosts, h.HostName)
	}
	return l, nil
}

func openNetns(name string) (*netnsx.Netns, error) {
	h, err := netnsx.OpenNamed(name)
	if err != nil {
		return nil, err
	}
	return &netnsx.Netns{Name: name, Handle: h}, nil
}

// readHost fills h from its eth0 and returns the MTU; the index comes from the fabric-side
// peer's name v<index>.
func readHost(h *Host, fh *netlink.Handle) (mtu int, err error) {
	hh, err := netlink.NewHandleAt(h.Handle)
	if err != nil {
		return 0, fmt.Errorf("open netlink: %w", err)
	}
	defer hh.Close()
	link, err := hh.LinkByName(hostIface)
	if err != nil {
		return 0, fmt.Errorf("find %s: %w", hostIface, err)
	}
	a := link.Attrs()
	h.IfIndex, h.MAC = a.Index, a.HardwareAddr
	peer, err := fh.LinkByIndex(a.ParentIndex)
	if err != nil {
		return 0, fmt.Errorf("find fabric peer of %s (ifindex %d): %w", hostIface, a.ParentIndex, err)
	}
	idx, err := strconv.Atoi(strings.TrimPrefix(peer.Attrs().Name, "v"))
	if err != nil || !strings.HasPrefix(peer.Attrs().Name, "v") {
		return 0, fmt.Errorf("fabric peer %s of %s is not named v<index>", peer.Attrs().Name, hostIface)
	}
	h.Index = idx
	addrs, err := hh.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("list addresses: %w", err)
	}
	for _, ad := range addrs {
		ip, ok := netip.AddrFromSlice(ad.IP)
		if !ok || ad.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() && !h.IPv4.IsValid() {
			h.IPv4 = ip
		} else if ip.Is6() && !h.IPv6.IsValid() {
			h.IPv6 = ip
		}
	}
	routes, err := hh.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Gw == nil || !isDefault(r.Dst) {
			continue
		}
		gw, ok := netip.AddrFromSlice(r.Gw)
		if !ok {
			continue
		}
		if gw = gw.Unmap(); gw.Is4() {
			h.Gateway4 = gw
		} else {
			h.Gateway6 = gw
		}
	}
	return a.MTU, nil
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}
