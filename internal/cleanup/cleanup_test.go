package cleanup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	_ "github.com/kedge-dev/kedge/internal/pacer" // registers the pacer veth cleaner
	"github.com/kedge-dev/kedge/internal/runstate"
	"github.com/kedge-dev/kedge/internal/runstate/runstatetest"
)

// deadPID is far above any pid_max, so it cannot belong to a live process.
const deadPID = 99999999

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, tc filters and BPF programs")
	}
}

// usePinRoot points bpfx at a temporary pin root (a plain directory stands in for bpffs:
// listing and removing pin dirs are plain file operations).
func usePinRoot(t *testing.T) string {
	t.Helper()
	old := bpfx.PinRoot
	bpfx.PinRoot = filepath.Join(t.TempDir(), "kedge")
	t.Cleanup(func() { bpfx.PinRoot = old })
	return bpfx.PinRoot
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "map"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// filterNamespace makes a namespace with a veth whose ingress hook carries one kedge filter
// per owner pid, named kedge:<pid>:<name> as bpfx names them.
func filterNamespace(t *testing.T, name string, pids ...int) *netnsx.Netns {
	t.Helper()
	ns, err := netnsx.New(netnsx.OwnedName(name))
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "c0"}, PeerName: "c1"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	l, err := h.LinkByName("c0")
	if err != nil {
		t.Fatalf("find veth: %v", err)
	}
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := h.QdiscAdd(q); err != nil {
		t.Fatalf("add clsact: %v", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		t.Fatalf("load program: %v", err)
	}
	defer prog.Close() // the filters hold their own references
	for i, pid := range pids {
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
				Handle: 1, Priority: uint16(i + 1), Protocol: unix.ETH_P_ALL,
			},
			Fd: prog.FD(), Name: fmt.Sprintf("%s%d:test", bpfx.FilterPrefix, pid), DirectAction: true,
		}
		if err := h.FilterAdd(f); err != nil {
			t.Fatalf("add filter %s: %v", f.Name, err)
		}
	}
	return ns
}

func filterNames(t *testing.T, ns *netnsx.Netns) []string {
	t.Helper()
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer h.Close()
	l, err := h.LinkByName("c0")
	if err != nil {
		t.Fatalf("find veth: %v", err)
	}
	fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatalf("list filters: %v", err)
	}
	var names []string
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok {
			names = append(names, bf.Name)
		}
	}
	return names
}

// ownedVeth adds the veth name (peer name+"p", both in ns) whose alias names its owner, as
// internal/pacer marks its veths in a consumer namespace.
func ownedVeth(t *testing.T, ns *netnsx.Netns, name, alias string) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetAlias(l, alias)
	}
	if err != nil {
		t.Fatalf("alias %s: %v", name, err)
	}
}

// linkNames lists ns's links, sorted.
func linkNames(t *testing.T, ns *netnsx.Netns) []string {
	t.Helper()
	var names []string
	if err := bpfx.EachLink(ns.Handle, func(_ *netlink.Handle, l netlink.Link) { names = append(names, l.Attrs().Name) }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func TestRunRemovesDeadRunsOnly(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	pinRoot := usePinRoot(t)
	deadPin := filepath.Join(pinRoot, fmt.Sprintf("x-%d", deadPID))
	livePin := filepath.Join(pinRoot, fmt.Sprintf("y-%d", os.Getpid()))
	mkdirs(t, deadPin, livePin)

	deadNS := fmt.Sprintf("%s-%d-cleanup%d", netnsx.Prefix, deadPID, os.Getpid())
	ns, err := netnsx.New(deadNS)
	if err != nil {
		t.Fatalf("create %s: %v", deadNS, err)
	}
	ns.Handle.Close()
	t.Cleanup(func() { _ = os.Remove(filepath.Join(netnsx.Dir, deadNS)) })
	live, err := netnsx.New(netnsx.OwnedName("cleanuplive"))
	if err != nil {
		t.Fatalf("create live namespace: %v", err)
	}
	t.Cleanup(func() { live.Close() })

	fns := filterNamespace(t, "cleanuptest", deadPID, os.Getpid())
	// Another namespace (a lab host, a user's `ip netns add`) with a dead run's filter:
	// found there although cleanup is pointed at fns.
	other := filterNamespace(t, "cleanupother", deadPID)
	deadFilter := fmt.Sprintf("%s%d:test", bpfx.FilterPrefix, deadPID)
	// Pacer veths (alias kedge:<owner>) in a consumer namespace: the dead run's goes, the
	// live run's stays.
	ownedVeth(t, other, "pv-dead", fmt.Sprintf("kedge:%d", deadPID))
	ownedVeth(t, other, "pv-live", fmt.Sprintf("kedge:%d", os.Getpid()))
	liveFilter := fmt.Sprintf("%s%d:test", bpfx.FilterPrefix, os.Getpid())

	persistent := fmt.Sprintf("c%d", os.Getpid())
	pl, err := lab.Up(lab.Spec{Name: persistent, Hosts: []string{"a"}, Persistent: true})
	if err != nil {
		t.Fatalf("persistent lab up: %v", err)
	}
	pl.Release()
	t.Cleanup(func() { _, _ = lab.Down(persistent) })

	// Status files of a dead run named the old way (a killed `kedge hedge run` of an older
	// kedge leaves hedge.<pid>.json) and of this live run.
	statusDir := t.TempDir()
	self, err := runstate.Self()
	if err != nil {
		t.Fatal(err)
	}
	if err := runstate.WriteStatus(statusDir, "test", self.ID, map[string]int{"pid": os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	deadStatus, liveStatus := runstate.StatusPath(statusDir, "hedge", strconv.Itoa(deadPID)), runstate.StatusPath(statusDir, "test", self.ID)
	if err := os.WriteFile(deadStatus, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	res, err := Run(Options{FilterNetns: fns, StatusDir: statusDir})
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	for _, tc := range []struct {
		what    string
		got     []string
		removed string
	}{
		{"pin dirs", res.PinDirs, deadPin},
		{"status files", res.StatusFiles, deadStatus},
		{"filters", res.Filters, "c0 ingress filter " + deadFilter},
		{"filters", res.Filters, "netns " + other.Name + ": c0 ingress filter " + deadFilter},
		{"namespaces", res.Namespaces, deadNS},
		{"veths", res.Veths, "netns " + other.Name + ": pv-dead"},
	} {
		if !slices.Contains(tc.got, tc.removed) {
			t.Errorf("removed %s = %v, want it to contain %s", tc.what, tc.got, tc.removed)
		}
	}
	if exists(filepath.Join(netnsx.Dir, deadNS)) || exists(deadPin) || exists(deadStatus) {
		t.Errorf("dead run's namespace, pin dir or status file still present")
	}
	if !exists(filepath.Join(netnsx.Dir, live.Name)) || !exists(livePin) || !exists(liveStatus) {
		t.Errorf("live run's namespace %s, pin dir %s or status file %s was removed", live.Name, livePin, liveStatus)
	}
	if got := linkNames(t, other); !slices.Equal(got, []string{"c0", "c1", "lo", "pv-live", "pv-livep"}) {
		t.Errorf("links after cleanup = %v, want the dead run's pacer veth (and its peer) gone, the live run's kept", got)
	}
	if len(res.Veths) != 1 {
		t.Errorf("removed veths = %v, want only the dead run's", res.Veths)
	}
	if got := filterNames(t, fns); !slices.Equal(got, []string{liveFilter}) {
		t.Errorf("filters after cleanup = %v, want only %s", got, liveFilter)
	}
	if len(res.Labs) != 0 {
		t.Errorf("cleanup without All removed persistent labs %v", res.Labs)
	}
	if _, err := lab.Open(persistent); err != nil {
		t.Errorf("persistent lab gone after cleanup without All: %v", err)
	}
}

// TestRemoveLabs covers the All path on one lab of its own (Run with All would also take
// down persistent labs that concurrently running tests own).
func TestRemoveLabs(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	name := fmt.Sprintf("r%d", os.Getpid())
	l, err := lab.Up(lab.Spec{Name: name, Hosts: []string{"a", "b"}, Persistent: true})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	l.Release()
	t.Cleanup(func() { _, _ = lab.Down(name) })
	removed, err := removePersistent(labKind(t), []string{name, "absent_" + name})
	if err != nil {
		t.Fatalf("remove labs: %v", err)
	}
	if !slices.Equal(removed, []string{name}) {
		t.Errorf("removed = %v", removed)
	}
	if _, err := lab.Open(name); !errors.Is(err, lab.ErrNotFound) {
		t.Errorf("Open after removal: %v, want ErrNotFound", err)
	}
	entries, _ := os.ReadDir(netnsx.Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), lab.PersistentPrefix+name+"-") {
			t.Errorf("namespace %s left", e.Name())
		}
	}
}

// TestStaleNetnsEntry: a run under `ip netns exec` (a mount namespace of its own) that named
// a namespace and was killed leaves, in this mount namespace, only the empty file under
// /run/netns. Cleanup removes a dead run's such file and does not fail on it (it once
// reported "failed to set into network namespace: invalid argument" for every cleaner that
// searches named namespaces, and exited 1).
func TestStaleNetnsEntry(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	usePinRoot(t)
	ns, err := netnsx.New(netnsx.OwnedName("cleanupstaledir")) // /run/netns as kedge prepares it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	stale := fmt.Sprintf("%s-%d-raft-hb", netnsx.Prefix, deadPID)
	if err := os.WriteFile(filepath.Join(netnsx.Dir, stale), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := netnsx.OpenNamed(stale); err == nil {
		t.Errorf("OpenNamedNetns(%s): no error for a plain file", stale)
	}
	res, err := Run(Options{StatusDir: t.TempDir()})
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	if !slices.Contains(res.Namespaces, stale) || exists(filepath.Join(netnsx.Dir, stale)) {
		t.Errorf("removed namespaces %v; want the stale entry %s removed", res.Namespaces, stale)
	}
}

// labKind is the persistent kind internal/lab registers.
func labKind(t *testing.T) runstate.Persistent {
	t.Helper()
	for _, p := range runstate.PersistentKinds() {
		if p.Kind == "lab" {
			return p
		}
	}
	t.Fatal("internal/lab registered no persistent kind \"lab\"")
	return runstate.Persistent{}
}
