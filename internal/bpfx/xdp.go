package bpfx

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/netnsx"
)

// XDPMode selects native (driver) or generic (skb) XDP.
type XDPMode int

const (
	XDPAuto    XDPMode = iota // native, falling back to generic
	XDPNative                 // driver mode; veth supports it
	XDPGeneric                // skb mode, works on any device, slower
)

type xdpAttachment struct {
	l    link.Link
	mode string
	pass *ebpf.Program // owned helper program (AttachXDPPass), closed with the link
}

func (a *xdpAttachment) Mode() string { return a.mode }
func (a *xdpAttachment) Close() error {
	err := a.l.Close()
	if a.pass != nil {
		err = errors.Join(err, a.pass.Close())
	}
	return err
}

// AttachXDP attaches prog to an interface in ns (-1: the caller's namespace). An interface
// that already has an XDP program gives an *XDPBusyError naming it and its holders.
func AttachXDP(prog *ebpf.Program, ns netns.NsHandle, ifindex int, mode XDPMode) (Attachment, error) {
	try := func(flags link.XDPAttachFlags, name string) (Attachment, error) {
		var l link.Link
		err := netnsx.In(ns, func() (err error) {
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: flags})
			return err
		})
		if isBusy(err) {
			return nil, xdpBusy(ns, ifindex, err)
		}
		if err != nil {
			return nil, fmt.Errorf("attach xdp (%s) on ifindex %d: %w", name, ifindex, err)
		}
		return &xdpAttachment{l: l, mode: "xdp-" + name}, nil
	}
	switch mode {
	case XDPNative:
		return try(link.XDPDriverMode, "native")
	case XDPGeneric:
		return try(link.XDPGenericMode, "generic")
	}
	a, err := try(link.XDPDriverMode, "native")
	if err == nil {
		return a, nil
	}
	if busy := (*XDPBusyError)(nil); errors.As(err, &busy) {
		return nil, err // generic mode would meet the same program
	}
	a, gerr := try(link.XDPGenericMode, "generic")
	if gerr != nil {
		return nil, errors.Join(err, fmt.Errorf("%w - native mode failed too; the driver may not support XDP", gerr))
	}
	return a, nil
}

// AttachXDPPass attaches a program that returns XDP_PASS. A veth only delivers frames that
// its peer sends with XDP_TX/XDP_REDIRECT when the receiving veth has an XDP program (the
// peer's NAPI is then enabled), so the peer of an interface that transmits from XDP needs one.
func AttachXDPPass(ns netns.NsHandle, ifindex int) (Attachment, error) {
	return AttachXDPPassMode(ns, ifindex, XDPNative)
}

// AttachXDPPassMode attaches a program that returns XDP_PASS in the given mode (a
// benchmark's control: what attaching any XDP program costs on an interface).
func AttachXDPPassMode(ns netns.NsHandle, ifindex int, mode XDPMode) (Attachment, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "kedge_xdp_pass",
		Type:         ebpf.XDP,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("load xdp_pass: %w", err)
	}
	a, err := AttachXDP(prog, ns, ifindex, mode)
	if err != nil {
		prog.Close()
		return nil, err
	}
	a.(*xdpAttachment).pass = prog
	return a, nil
}
