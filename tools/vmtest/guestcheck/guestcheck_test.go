package guestcheck

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Addresses from the benchmarking range (RFC 2544), as internal/lab uses; they only
// exist inside the namespaces these tests create.
var (
	addrA = netip.MustParsePrefix("198.18.0.1/24")
	addrB = netip.MustParsePrefix("198.18.0.2/24")
)

// netemDelay is the delay the netem test adds; TCG makes timings slow, never fast, so
// only the lower bound is checked.
const netemDelay = 20 * time.Millisecond

// guest skips the test outside a vmtest guest and returns the expected kernel release.
func guest(t *testing.T) string {
	t.Helper()
	rel := os.Getenv("VMTEST_KERNEL_RELEASE")
	if rel == "" {
		t.Skip("not in a vmtest guest (VMTEST_KERNEL_RELEASE unset): run go run ./tools/vmtest")
	}
	return rel
}

func TestKernelRelease(t *testing.T) {
	want := guest(t)
	got, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatalf("read osrelease: %v", err)
	}
	if strings.TrimSpace(string(got)) != want {
		t.Fatalf("booted kernel %q, want %q", strings.TrimSpace(string(got)), want)
	}
	version, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatalf("read /proc/version: %v", err)
	}
	t.Logf("%s (package %s)", strings.TrimSpace(string(version)), os.Getenv("VMTEST_KERNEL_PACKAGE"))
}

func TestBTF(t *testing.T) {
	guest(t)
	st, err := os.Stat("/sys/kernel/btf/vmlinux")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("kernel has no /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF off): CO-RE programs cannot load here")
	}
	if err != nil {
		t.Fatalf("stat vmlinux BTF: %v", err)
	}
	t.Logf("vmlinux BTF: %d bytes", st.Size())
}

func TestModulesLoaded(t *testing.T) {
	guest(t)
	mods := strings.Fields(os.Getenv("VMTEST_MODULES"))
	if len(mods) == 0 {
		t.Skip("VMTEST_MODULES is empty: the kernel builds in every module vmtest asks for")
	}
	for _, m := range mods {
		state, err := os.ReadFile("/sys/module/" + m + "/initstate")
		if err != nil || strings.TrimSpace(string(state)) != "live" {
			t.Errorf("module %s not live: %q, %v", m, state, err)
		}
	}
}

func TestMounts(t *testing.T) {
	guest(t)
	for _, m := range []struct {
		path  string
		magic int64
	}{
		{"/sys/fs/bpf", unix.BPF_FS_MAGIC},
		{"/tmp", unix.TMPFS_MAGIC},
		{"/sys/fs/cgroup", unix.CGROUP2_SUPER_MAGIC},
		{"/sys/kernel/debug", unix.DEBUGFS_MAGIC},
	} {
		var st unix.Statfs_t
		if err := unix.Statfs(m.path, &st); err != nil {
			t.Errorf("statfs %s: %v", m.path, err)
		} else if st.Type != m.magic {
			t.Errorf("%s: filesystem magic %#x, want %#x", m.path, st.Type, m.magic)
		}
	}
}

// newNetns creates an unnamed network namespace without moving the test into it.
func newNetns(t *testing.T) netns.NsHandle {
	t.Helper()
	var h netns.NsHandle
	err := inNetns(-1, func() (err error) {
		h, err = netns.New() // switches this locked thread; inNetns switches back
		return err
	})
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// inNetns runs fn on a locked OS thread inside ns (ns -1: the current namespace) and
// returns the thread to its namespace afterwards. Sockets fn opens stay in ns.
func inNetns(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if ns != -1 {
			if err := netns.Set(ns); err != nil {
				errc <- err
				return
			}
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err) // thread stays locked: Go retires it
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func handleAt(t *testing.T, ns netns.NsHandle) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

// vethPair creates va in nsA and its peer vb in nsB, addressed and up.
func vethPair(t *testing.T, nsA, nsB netns.NsHandle) (hA, hB *netlink.Handle, va, vb netlink.Link) {
	t.Helper()
	hA, hB = handleAt(t, nsA), handleAt(t, nsB)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "va"}, PeerName: "vb", PeerNamespace: netlink.NsFd(nsB)}
	if err := hA.LinkAdd(veth); err != nil {
		t.Fatalf("add veth pair: %v", err)
	}
	for _, x := range []struct {
		h    *netlink.Handle
		name string
		addr netip.Prefix
		link *netlink.Link
	}{{hA, "va", addrA, &va}, {hB, "vb", addrB, &vb}} {
		l, err := x.h.LinkByName(x.name)
		if err != nil {
			t.Fatalf("find %s: %v", x.name, err)
		}
		ipnet := &net.IPNet{IP: x.addr.Addr().AsSlice(), Mask: net.CIDRMask(x.addr.Bits(), 32)}
		if err := x.h.AddrAdd(l, &netlink.Addr{IPNet: ipnet}); err != nil {
			t.Fatalf("address %s: %v", x.name, err)
		}
		if err := x.h.LinkSetUp(l); err != nil {
			t.Fatalf("set %s up: %v", x.name, err)
		}
		*x.link = l
	}
	return hA, hB, va, vb
}

// TestNetemDelaysUDP sends one UDP datagram across a veth pair whose sending side has
// netem (delay) and whose receiving side has fq, and checks it arrives no earlier than
// the delay.
func TestNetemDelaysUDP(t *testing.T) {
	guest(t)
	nsA, nsB := newNetns(t), newNetns(t)
	hA, hB, va, vb := vethPair(t, nsA, nsB)

	netem := netlink.NewNetem(
		netlink.QdiscAttrs{LinkIndex: va.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		netlink.NetemQdiscAttrs{Latency: uint32(netemDelay.Microseconds())})
	if err := hA.QdiscAdd(netem); err != nil {
		t.Fatalf("add netem qdisc (module sch_netem): %v", err)
	}
	fq := netlink.NewFq(netlink.QdiscAttrs{LinkIndex: vb.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})
	if err := hB.QdiscAdd(fq); err != nil {
		t.Fatalf("add fq qdisc (module sch_fq): %v", err)
	}
	requireQdisc(t, hA, va, "netem")
	requireQdisc(t, hB, vb, "fq")

	var rx, tx *net.UDPConn
	if err := inNetns(nsB, func() (err error) {
		rx, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrB.Addr(), 0)))
		return err
	}); err != nil {
		t.Fatalf("listen in nsB: %v", err)
	}
	defer rx.Close()
	if err := inNetns(nsA, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatalf("dial from nsA: %v", err)
	}
	defer tx.Close()

	start := time.Now()
	if _, err := tx.Write([]byte("kedge vmtest")); err != nil {
		t.Fatalf("send: %v", err)
	}
	if err := rx.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatalf("set deadline: %v", err)
	}
	buf := make([]byte, 64)
	n, err := rx.Read(buf)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	elapsed := time.Since(start)
	if string(buf[:n]) != "kedge vmtest" {
		t.Fatalf("received %q", buf[:n])
	}
	if elapsed < netemDelay {
		t.Fatalf("datagram arrived after %v, netem should delay it by at least %v", elapsed, netemDelay)
	}
	t.Logf("datagram arrived after %v (netem delay %v; TCG timing is not meaningful beyond the lower bound)", elapsed, netemDelay)
}

func requireQdisc(t *testing.T, h *netlink.Handle, l netlink.Link, kind string) {
	t.Helper()
	qs, err := h.QdiscList(l)
	if err != nil {
		t.Fatalf("list qdiscs of %s: %v", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() == kind {
			return
		}
	}
	t.Fatalf("%s has no %s qdisc: %v", l.Attrs().Name, kind, qs)
}

// tcProgram returns a SCHED_CLS program that returns verdict.
func tcProgram(t *testing.T, verdict int32) *ebpf.Program {
	t.Helper()
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatalf("remove memlock limit (needed before 5.11): %v", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "vmtest_verdict",
		Type:    ebpf.SchedCLS,
		License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, verdict),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load SCHED_CLS program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

func TestBPFProgTestRun(t *testing.T) {
	guest(t)
	const verdict = 2 // TC_ACT_SHOT
	prog := tcProgram(t, verdict)
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	if ret != verdict {
		t.Fatalf("program returned %d, want %d", ret, verdict)
	}
}

// TestClsactBPFFilter attaches a direct-action cls_bpf filter to a clsact qdisc.
func TestClsactBPFFilter(t *testing.T) {
	guest(t)
	nsA, nsB := newNetns(t), newNetns(t)
	hA, _, va, _ := vethPair(t, nsA, nsB)
	clsact := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: va.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := hA.QdiscAdd(clsact); err != nil {
		t.Fatalf("add clsact qdisc (module sch_ingress): %v", err)
	}
	prog := tcProgram(t, 0)
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: va.Attrs().Index, Parent: netlink.HANDLE_MIN_EGRESS,
			Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1,
		},
		Fd: prog.FD(), Name: "vmtest_verdict", DirectAction: true,
	}
	if err := hA.FilterAdd(filter); err != nil {
		t.Fatalf("add bpf filter (module cls_bpf): %v", err)
	}
	filters, err := hA.FilterList(va, netlink.HANDLE_MIN_EGRESS)
	if err != nil {
		t.Fatalf("list filters: %v", err)
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.DirectAction {
			return
		}
	}
	t.Fatalf("no direct-action bpf filter on egress of va: %v", filters)
}
