package bpfx_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/pkg/kedge"
)

// TestQdiscErrorFromKernel: the kernel's answer to a qdisc kind it does not know becomes a
// FeatureError (exit 3 in the CLI); other failures stay what they are.
func TestQdiscErrorFromKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and adds a qdisc there")
	}
	ns, err := netnsx.New(netnsx.OwnedName("qderr"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lo.Attrs().Index,
		Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}, QdiscType: "kedgenosuch"}
	addErr := h.QdiscAdd(q)
	if addErr == nil {
		t.Fatal("the kernel accepted qdisc kind kedgenosuch")
	}
	err = bpfx.QdiscError("kedgenosuch", addErr)
	var fe *kedge.FeatureError
	if !errors.Is(err, kedge.ErrNotSupported) || !errors.As(err, &fe) || fe.Feature != "qdisc kedgenosuch" ||
		!errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "sch_kedgenosuch") {
		t.Errorf("QdiscError(kernel's %v) = %v, want a FeatureError for qdisc kedgenosuch wrapping ENOENT", addErr, err)
	}
}

func TestNotSupportedClassifies(t *testing.T) {
	for _, tc := range []struct {
		err     error
		feature bool
	}{
		{fmt.Errorf("attach: %w", ebpf.ErrNotSupported), true},
		{fmt.Errorf("add: %w", unix.EOPNOTSUPP), true},
		{fmt.Errorf("attach: %w", unix.EPERM), false},
		{errors.New("boom"), false},
	} {
		err := bpfx.NotSupported("TCX links", "6.6", "use clsact", tc.err)
		if got := errors.Is(err, kedge.ErrNotSupported); got != tc.feature {
			t.Errorf("NotSupported(%v): ErrNotSupported %v, want %v", tc.err, got, tc.feature)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("NotSupported(%v) = %v lost the cause", tc.err, err)
		}
		if tc.feature && err.Error() != "TCX links is not supported by this kernel (needs Linux 6.6 or later): "+tc.err.Error()+" - use clsact" {
			t.Errorf("NotSupported(%v) says %q", tc.err, err)
		}
	}
}
