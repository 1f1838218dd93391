package bpfx_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/probe"
	"golang.org/x/sys/unix"
)

func passProg(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		t.Fatalf("load program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func kedgeFilters(t *testing.T, h *netlink.Handle, ifindex int) int {
	t.Helper()
	link, err := h.LinkByIndex(ifindex)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, _ := h.FilterList(link, parent)
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, bpfx.FilterPrefix) {
				n++
			}
		}
	}
	return n
}

// Two clsact attachments on one hook coexist and detaching removes exactly them, then the
// qdisc kedge added; TCX attachments detach on Close.
func TestAttachTCModes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and attaches programs")
	}
	l, err := lab.Up(lab.Spec{Name: "bpfx", Hosts: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	host := l.Host("a")
	h, err := netlink.NewHandleAt(host.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	prog := passProg(t)

	var atts []bpfx.Attachment
	for i, dir := range []bpfx.Direction{bpfx.Ingress, bpfx.Ingress, bpfx.Egress} {
		a, err := bpfx.AttachTC(prog, bpfx.TCTarget{Netns: host.Handle, IfIndex: host.IfIndex, Dir: dir, Mode: bpfx.TCClsact, Name: "t"})
		if err != nil {
			t.Fatalf("clsact attach %d: %v", i, err)
		}
		if a.Mode() != "clsact" {
			t.Errorf("mode %q, want clsact", a.Mode())
		}
		atts = append(atts, a)
	}
	if n := kedgeFilters(t, h, host.IfIndex); n != 3 {
		t.Fatalf("%d kedge filters after 3 attaches", n)
	}
	for _, a := range atts {
		if err := a.Close(); err != nil {
			t.Fatalf("detach: %v", err)
		}
	}
	if n := kedgeFilters(t, h, host.IfIndex); n != 0 {
		t.Errorf("%d kedge filters left after detach", n)
	}
	qs, _ := h.QdiscList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: host.IfIndex}})
	for _, q := range qs {
		if q.Type() == "clsact" {
			t.Errorf("clsact qdisc left after the last kedge filter went")
		}
	}

	a, err := bpfx.AttachTC(prog, bpfx.TCTarget{Netns: host.Handle, IfIndex: host.IfIndex, Dir: bpfx.Egress, Mode: bpfx.TCX})
	if errors.Is(err, ebpf.ErrNotSupported) {
		var u unix.Utsname
		_ = unix.Uname(&u)
		rel := unix.ByteSliceToString(u.Release[:])
		if ok, parsed := probe.KernelAtLeast(rel, 6, 6); parsed && ok {
			t.Fatalf("tcx attach on %s (6.6+ has TCX): %v", rel, err)
		}
		t.Skipf("TCX needs Linux 6.6+ (kernel %s); the clsact path above ran", rel)
	}
	if err != nil {
		t.Fatalf("tcx attach: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("tcx detach: %v", err)
	}
}
