package probe

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// The probe's veth pair, inside its own namespace.
const (
	vethA = "kp0"
	vethB = "kp1"
)

var nsSeq atomic.Uint32

// attach and qdisc rows, filled by probeNetns.
var netnsRows = []string{TCX, Clsact, XDPNative, XDPGeneric, QdiscNetem, QdiscFq, QdiscTbf, QdiscHtb, QdiscClsact}

// probeNetns creates a throw-away namespace with a veth pair and tries every attach mode and
// qdisc kedge may use there. The namespace (and with it every qdisc and program) is deleted
// before it returns.
func probeNetns(ctx context.Context, found map[string]result) {
	fail := func(r result) {
		for _, id := range netnsRows {
			if _, done := found[id]; !done {
				found[id] = r
			}
		}
	}
	ns, err := netnsx.New(netnsx.OwnedName(fmt.Sprintf("probe%d", nsSeq.Add(1))))
	if err != nil {
		msg := "not probed: " + errText(err)
		if !isRoot() {
			msg = "not probed: creating a namespace needs root"
		}
		fail(unknown(msg))
		return
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		fail(unknown("not probed: " + errText(fmt.Errorf("open netlink in probe namespace: %w", err))))
		return
	}
	defer h.Close()
	ifindex, err := addVeth(h)
	if err != nil {
		fail(unknown("not probed: " + errText(err)))
		return
	}
	for _, q := range qdiscProbes(ifindex) {
		if ctx.Err() != nil {
			return
		}
		found[q.id] = probeQdisc(h, q.kind, q.qdisc)
	}
	if sys := found[BPFSyscall]; !sys.available {
		return // probeBPF filled the attach rows
	}
	found[TCX], found[Clsact] = probeTC(ns, ifindex)
	found[XDPNative], found[XDPGeneric] = probeXDP(ns, ifindex)
}

func addVeth(h *netlink.Handle) (int, error) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: vethA}, PeerName: vethB}
	if err := h.LinkAdd(veth); err != nil {
		return 0, fmt.Errorf("add veth %s/%s: %w", vethA, vethB, err)
	}
	var ifindex int
	for _, name := range []string{vethA, vethB} {
		l, err := h.LinkByName(name)
		if err != nil {
			return 0, fmt.Errorf("find %s: %w", name, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			return 0, fmt.Errorf("set %s up: %w", name, err)
		}
		if name == vethA {
			ifindex = l.Attrs().Index
		}
	}
	return ifindex, nil
}

type qdiscProbe struct {
	id, kind string
	qdisc    netlink.Qdisc
}

// qdiscProbes returns each qdisc configured as kedge would use it.
func qdiscProbes(ifindex int) []qdiscProbe {
	root := netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	const rate = 100e6 / 8 // 100 Mbit/s in bytes/s
	return []qdiscProbe{
		{QdiscNetem, "netem", netlink.NewNetem(root, netlink.NetemQdiscAttrs{Latency: 10_000})}, // 10 ms
		{QdiscFq, "fq", netlink.NewFq(root)},
		{QdiscTbf, "tbf", &netlink.Tbf{QdiscAttrs: root, Rate: rate, Limit: 200_000, Buffer: netlink.Xmittime(rate, 16_000)}},
		{QdiscHtb, "htb", netlink.NewHtb(root)},
		{QdiscClsact, "clsact", &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
			QdiscType:  "clsact",
		}},
	}
}

func probeQdisc(h *netlink.Handle, kind string, q netlink.Qdisc) result {
	if err := h.QdiscAdd(q); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return no(fmt.Sprintf("qdisc kind %s unknown (ENOENT)", kind))
		}
		return no(fmt.Sprintf("add qdisc %s: %s", kind, errText(err)))
	}
	if err := h.QdiscDel(q); err != nil {
		// Still available; the namespace's deletion removes it.
		return yes(fmt.Sprintf("added; delete failed: %s", errText(err)))
	}
	return yes("")
}

func probeTC(ns *netnsx.Netns, ifindex int) (tcx, clsact result) {
	prog, err := loadTrivial(ebpf.SchedCLS, -1) // TCX_NEXT
	if err != nil {
		r := fromErr(fmt.Errorf("load tc program: %w", err), "")
		return r, r
	}
	defer prog.Close()
	try := func(mode bpfx.TCMode, notSupported string) result {
		a, err := bpfx.AttachTC(prog, bpfx.TCTarget{Netns: ns.Handle, IfIndex: ifindex, Dir: bpfx.Ingress, Mode: mode, Name: "probe"})
		if err != nil {
			return fromErr(err, notSupported)
		}
		if err := a.Close(); err != nil {
			return yes(fmt.Sprintf("attached; detach failed: %s", errText(err)))
		}
		return yes("")
	}
	return try(bpfx.TCX, "TCX links not supported (needs Linux 6.6)"), try(bpfx.TCClsact, "")
}

func probeXDP(ns *netnsx.Netns, ifindex int) (native, generic result) {
	prog, err := loadTrivial(ebpf.XDP, xdpPass)
	if err != nil {
		r := fromErr(fmt.Errorf("load xdp program: %w", err), "")
		return r, r
	}
	defer prog.Close()
	try := func(mode bpfx.XDPMode) result {
		a, err := bpfx.AttachXDP(prog, ns.Handle, ifindex, mode)
		if err != nil {
			return fromErr(err, "")
		}
		if err := a.Close(); err != nil {
			return yes(fmt.Sprintf("attached; detach failed: %s", errText(err)))
		}
		return yes("")
	}
	return try(bpfx.XDPNative), try(bpfx.XDPGeneric)
}
