package bpfx

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// Direction of a TC attachment.
type Direction int

const (
	Ingress Direction = iota
	Egress
)

func (d Direction) String() string {
	if d == Ingress {
		return "ingress"
	}
	return "egress"
}

// TCMode selects the TC attach mechanism.
type TCMode int

const (
	TCAuto   TCMode = iota // TCX when the kernel has it (6.6+), clsact otherwise
	TCX                    // bpf_link based, detached when the last fd closes
	TCClsact               // classic cls_bpf filter on a clsact qdisc
)

func (m TCMode) String() string {
	return [...]string{"auto", "tcx", "clsact"}[m]
}

// TCTarget names where to attach.
type TCTarget struct {
	Netns   netns.NsHandle // -1: the caller's namespace
	IfIndex int
	Dir     Direction
	Mode    TCMode
	Name    string // filter name for clsact (prefix "kedge:" added); shown by tc filter show
}

// Attachment detaches on Close.
type Attachment interface {
	Close() error
	// Mode reports how the program was attached ("tcx", "clsact", "xdp-native", ...).
	Mode() string
}

// LinkFD returns the file descriptor of an attachment made through a bpf_link (TCX, XDP),
// -1 for one that holds none (a clsact filter, which stays until it is deleted). Closing the
// link's last descriptor detaches it and waits for an RCU grace period (tcx_link_release,
// bpf_xdp_link_release): internal/fastexit holds duplicates so that a killed process's exit
// does not wait for them.
func LinkFD(a Attachment) int {
	var l link.Link
	switch a := a.(type) {
	case *tcxAttachment:
		l = a.l
	case *xdpAttachment:
		l = a.l
	}
	if f, ok := l.(interface{ FD() int }); ok {
		return f.FD()
	}
	return -1
}

type tcxAttachment struct{ l link.Link }

func (a *tcxAttachment) Close() error { return a.l.Close() }
func (a *tcxAttachment) Mode() string { return "tcx" }

// FilterPrefix starts the name of every cls_bpf filter kedge adds:
// kedge:<owner ID>:<name>:<seq> (runstate owner; filters named before runstate carry a
// bare pid). Cleanup recognises a dead run's filters by it.
const FilterPrefix = "kedge:"

// AttachTC attaches prog at the TC hook of an interface. With TCAuto it uses TCX and falls
// back to clsact when the kernel lacks TCX.
func AttachTC(prog *ebpf.Program, t TCTarget) (Attachment, error) {
	if t.Mode == TCAuto || t.Mode == TCX {
		a, err := attachTCX(prog, t)
		if err == nil || t.Mode == TCX || !errors.Is(err, ebpf.ErrNotSupported) {
			return a, err
		}
	}
	return attachClsact(prog, t)
}

func attachTCX(prog *ebpf.Program, t TCTarget) (Attachment, error) {
	at := ebpf.AttachTCXIngress
	if t.Dir == Egress {
		at = ebpf.AttachTCXEgress
	}
	var l link.Link
	err := netnsx.In(t.Netns, func() (err error) {
		l, err = link.AttachTCX(link.TCXOptions{Interface: t.IfIndex, Program: prog, Attach: at})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attach tcx %s on ifindex %d: %w", t.Dir, t.IfIndex,
			NotSupported("TCX links", "6.6", "attach through clsact instead (TC mode auto or clsact)", err))
	}
	return &tcxAttachment{l: l}, nil
}

type clsactAttachment struct {
	ns         netns.NsHandle
	filter     *netlink.BpfFilter
	addedQdisc bool
}

func (a *clsactAttachment) Mode() string { return "clsact" }

func (a *clsactAttachment) Close() error {
	h, err := NetlinkHandle(a.ns)
	if err != nil {
		return err
	}
	defer h.Close()
	var errs []error
	if err := h.FilterDel(a.filter); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) {
		errs = append(errs, fmt.Errorf("delete tc filter %s: %w", a.filter.Name, err))
	}
	if a.addedQdisc && clsactUnref(a.ns, a.filter.LinkIndex) {
		errs = append(errs, removeClsactIfUnused(h, a.filter.LinkIndex))
	}
	return errors.Join(errs...)
}

// clsactRefs counts kedge attachments on clsact qdiscs that kedge itself added, so the
// qdisc goes with the last of them (and a qdisc that was there before stays).
var (
	clsactMu   sync.Mutex
	clsactRefs = map[[2]int]int{}
)

func clsactRef(ns netns.NsHandle, ifindex int) {
	clsactMu.Lock()
	defer clsactMu.Unlock()
	clsactRefs[[2]int{int(ns), ifindex}]++
}

// clsactUnref drops one reference and reports whether it was the last.
func clsactUnref(ns netns.NsHandle, ifindex int) bool {
	clsactMu.Lock()
	defer clsactMu.Unlock()
	k := [2]int{int(ns), ifindex}
	clsactRefs[k]--
	if clsactRefs[k] > 0 {
		return false
	}
	delete(clsactRefs, k)
	return true
}

func clsactOwned(ns netns.NsHandle, ifindex int) bool {
	clsactMu.Lock()
	defer clsactMu.Unlock()
	return clsactRefs[[2]int{int(ns), ifindex}] > 0
}

// ErrNoInterface matches the error of IfIndex for an interface that does not exist: the
// caller named it, so the kedge command treats it as bad usage (exit 2).
var ErrNoInterface = errors.New("no such interface")

// IfIndex returns the index of interface name in ns (< 0: the caller's namespace).
func IfIndex(ns netns.NsHandle, name string) (int, error) {
	h, err := NetlinkHandle(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		err = ErrNoInterface
	}
	if err != nil {
		return 0, fmt.Errorf("find interface %q: %w (list interfaces with 'ip link')", name, err)
	}
	return l.Attrs().Index, nil
}

// NetlinkHandle opens a netlink handle in ns, or in the caller's namespace when ns < 0
// (netns.None()). The caller closes it.
func NetlinkHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if ns < 0 {
		h, err = netlink.NewHandle()
	} else {
		h, err = netlink.NewHandleAt(ns)
	}
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	return h, nil
}

func clsactQdisc(ifindex int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
}

func attachClsact(prog *ebpf.Program, t TCTarget) (Attachment, error) {
	h, err := NetlinkHandle(t.Netns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	a := &clsactAttachment{ns: t.Netns}
	if err := h.QdiscAdd(clsactQdisc(t.IfIndex)); err == nil {
		a.addedQdisc = true
	} else if errors.Is(err, unix.EEXIST) {
		a.addedQdisc = clsactOwned(t.Netns, t.IfIndex) // added by an earlier kedge attachment
	} else {
		return nil, fmt.Errorf("add clsact qdisc on ifindex %d: %w", t.IfIndex, QdiscError("clsact", err))
	}
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if t.Dir == Egress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	// Handle and priority 0: the kernel picks free ones, so several kedge filters (and the
	// user's own) can share a hook. The unique name finds ours again for deletion.
	name := fmt.Sprintf("%s%s:%s:%d", FilterPrefix, runstate.SelfID(), t.Name, filterSeq.Add(1))
	f := &netlink.BpfFilter{
		FilterAttrs:  netlink.FilterAttrs{LinkIndex: t.IfIndex, Parent: parent, Protocol: unix.ETH_P_ALL},
		Fd:           prog.FD(),
		Name:         name,
		DirectAction: true,
	}
	if a.addedQdisc {
		clsactRef(t.Netns, t.IfIndex)
	}
	err = h.FilterAdd(f)
	if err == nil {
		a.filter, err = findFilter(h, t.IfIndex, parent, name)
	}
	if err != nil {
		if a.addedQdisc && clsactUnref(t.Netns, t.IfIndex) {
			_ = removeClsactIfUnused(h, t.IfIndex)
		}
		return nil, fmt.Errorf("add tc %s filter on ifindex %d: %w", t.Dir, t.IfIndex, err)
	}
	return a, nil
}

var filterSeq atomic.Uint64

// findFilter returns the cls_bpf filter with the given name (with its kernel-chosen handle
// and priority, which deletion needs).
func findFilter(h *netlink.Handle, ifindex int, parent uint32, name string) (*netlink.BpfFilter, error) {
	link, err := h.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("find ifindex %d: %w", ifindex, err)
	}
	fs, err := retryDump(func() ([]netlink.Filter, error) { return h.FilterList(link, parent) })
	if err != nil {
		return nil, fmt.Errorf("list filters: %w", err)
	}
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == name {
			return bf, nil
		}
	}
	return nil, fmt.Errorf("filter %s not found after adding it", name)
}

// removeClsactIfUnused deletes the clsact qdisc when no filter is left on either hook.
func removeClsactIfUnused(h *netlink.Handle, ifindex int) error {
	link, err := h.LinkByIndex(ifindex)
	if err != nil {
		return nil // interface gone, qdisc with it
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := retryDump(func() ([]netlink.Filter, error) { return h.FilterList(link, parent) })
		if err != nil || len(fs) > 0 {
			return nil
		}
	}
	if err := h.QdiscDel(clsactQdisc(ifindex)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("delete clsact qdisc on ifindex %d: %w", ifindex, err)
	}
	return nil
}

// Filter is a kedge cls_bpf filter found on an interface.
type Filter struct {
	Iface string
	Hook  Direction
	Name  string
	Owner string // runstate owner ID (legacy: a bare pid)
}

func (f Filter) String() string { return fmt.Sprintf("%s %s filter %s", f.Iface, f.Hook, f.Name) }

// filterOwner parses the owner ID from a kedge filter name.
func filterOwner(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, FilterPrefix)
	if !ok {
		return "", false
	}
	id, _, _ := strings.Cut(rest, ":")
	_, _, valid := runstate.ParseID(id)
	return id, valid
}

// ListFilters lists the kedge cls_bpf filters on every interface of the namespace (ns < 0:
// the caller's), any owner's. It lists nothing whose name does not carry FilterPrefix.
func ListFilters(ns netns.NsHandle) ([]Filter, error) {
	var out []Filter
	err := EachLink(ns, func(h *netlink.Handle, l netlink.Link) {
		for _, dir := range []Direction{Ingress, Egress} {
			fs, err := retryDump(func() ([]netlink.Filter, error) { return h.FilterList(l, hookParent(dir)) })
			if err != nil {
				continue // no clsact qdisc
			}
			for _, f := range fs {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok {
					continue
				}
				if owner, ok := filterOwner(bf.Name); ok {
					out = append(out, Filter{Iface: l.Attrs().Name, Hook: dir, Name: bf.Name, Owner: owner})
				}
			}
		}
	})
	return out, err
}

// EachLink calls fn with every link of namespace ns (ns < 0: the caller's) and a netlink
// handle in ns, valid during the call. Cleaners list what they own from the links this way.
func EachLink(ns netns.NsHandle, fn func(h *netlink.Handle, l netlink.Link)) error {
	h, err := NetlinkHandle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	links, err := retryDump(h.LinkList)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		fn(h, l)
	}
	return nil
}

// RemoveFilter deletes the kedge filter f from namespace ns (a filter already gone is not
// an error), and the clsact qdisc when no filter at all is left on the interface.
func RemoveFilter(ns netns.NsHandle, f Filter) error {
	h, err := NetlinkHandle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(f.Iface)
	if err != nil {
		return nil // interface gone, filter with it
	}
	fs, err := retryDump(func() ([]netlink.Filter, error) { return h.FilterList(l, hookParent(f.Hook)) })
	if err != nil {
		return nil
	}
	for _, x := range fs {
		if bf, ok := x.(*netlink.BpfFilter); ok && bf.Name == f.Name {
			if err := h.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("delete filter %s on %s: %w", f.Name, f.Iface, err)
			}
		}
	}
	return removeClsactIfUnused(h, l.Attrs().Index)
}

func hookParent(d Direction) uint32 {
	if d == Egress {
		return netlink.HANDLE_MIN_EGRESS
	}
	return netlink.HANDLE_MIN_INGRESS
}

func init() {
	runstate.Register(runstate.Cleaner{Kind: runstate.KindFilter, Order: 10, List: func(s runstate.Scope) ([]runstate.Leftover, error) {
		var out []runstate.Leftover
		err := ScopeNetns(s, func(label string, ns netns.NsHandle) error {
			fs, err := ListFilters(ns)
			for _, f := range fs {
				out = append(out, runstate.Leftover{Kind: runstate.KindFilter, Name: label + f.String(), Owner: f.Owner,
					Remove: func() error { return RemoveFilter(ns, f) }})
			}
			return err
		})
		return out, err
	}})
}

// ScopeNetns calls fn for every network namespace a cleaner searches: s.Netns first
// (label ""), then each of s.Named other than it, sorted by name (label "netns <name>: ").
// It returns fn's errors joined, each prefixed with its label.
func ScopeNetns(s runstate.Scope, fn func(label string, ns netns.NsHandle) error) error {
	var errs []error
	call := func(label string, ns netns.NsHandle) {
		if err := fn(label, ns); err != nil {
			errs = append(errs, fmt.Errorf("%s%w", label, err))
		}
	}
	call("", s.Netns)
	primary := s.Netns
	if primary < 0 {
		if h, err := netnsx.Thread(); err == nil {
			primary = h
			defer h.Close()
		}
	}
	names := make([]string, 0, len(s.Named))
	for n, h := range s.Named {
		if !h.Equal(primary) { // the primary one, done already
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		call("netns "+n+": ", s.Named[n])
	}
	return errors.Join(errs...)
}

// dumpRetries is how often a netlink dump that the kernel marked interrupted (the table
// changed during the dump: netlink.ErrDumpInterrupted, with a result that may be incomplete)
// is asked again before its error is returned. Other runs' labs come and go beside ours.
const dumpRetries = 5

// retryDump runs dump until it is not interrupted, at most dumpRetries times.
func retryDump[T any](dump func() (T, error)) (T, error) {
	v, err := dump()
	for i := 1; i < dumpRetries && errors.Is(err, netlink.ErrDumpInterrupted); i++ {
		v, err = dump()
	}
	return v, err
}
