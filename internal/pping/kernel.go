package pping

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// The kernel RTT source (bpf/pping/sockops.h): a sock_ops program on a cgroup2 directory
// switches the RTT callback on for the TCP sockets established in the monitored
// interface's namespace and reports what the stack measures.

// KernelRTTCgroup resolves cfg's cgroup: its Cgroup, or the cgroup2 root. The directory must
// be on a cgroup2 file system.
func KernelRTTCgroup(path string) (string, error) {
	if path == "" {
		return bpfx.Cgroup2Root()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "", fmt.Errorf("cgroup %s: %w", path, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", fmt.Errorf("cgroup %s is not a cgroup2 directory (sock_ops programs attach to cgroup2 only)", path)
	}
	return path, nil
}

// KernelRTTSupported reports whether this kernel runs the kernel RTT source: sock_ops
// programs with socket storage (5.2) and bpf_get_netns_cookie (5.15).
func KernelRTTSupported() error {
	for _, h := range []asm.BuiltinFunc{asm.FnSkStorageGet, asm.FnGetNetnsCookie, asm.FnSockOpsCbFlagsSet} {
		if err := features.HaveProgramHelper(ebpf.SockOps, h); err != nil {
			return bpfx.NotSupported("sock_ops helper "+h.String(), "5.15",
				"the kernel RTT source needs it; --kernel-rtt=false runs without it", err)
		}
	}
	return nil
}

// netnsCookie returns the cookie of the namespace ns (SO_NETNS_COOKIE, 5.14), which the
// sock_ops program compares with bpf_get_netns_cookie().
func netnsCookie(ns netns.NsHandle) (uint64, error) {
	var cookie uint64
	err := netnsx.In(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		cookie = v
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("read the namespace cookie: %w (SO_NETNS_COOKIE needs 5.14)", err)
	}
	return cookie, nil
}

// KernelRTTPreflight checks what attaching the kernel RTT source to cgroup ("": the cgroup2
// root) needs - the kernel's support, a cgroup2 directory, and (in tests) that it is not
// the root - and returns the cgroup it would attach to.
func KernelRTTPreflight(cgroup string) (string, error) {
	if err := KernelRTTSupported(); err != nil {
		return "", err
	}
	cg, err := KernelRTTCgroup(cgroup)
	if err != nil {
		return "", err
	}
	return cg, guardRootCgroup(cg)
}

// attachKernelRTT attaches the sock_ops program to the configured cgroup for the sockets of
// namespace ns.
func (m *Monitor) attachKernelRTT(ns netns.NsHandle) error {
	cg, err := KernelRTTCgroup(m.cfg.Cgroup)
	if err != nil {
		return fmt.Errorf("attach the kernel RTT source: %w", err)
	}
	if err := guardRootCgroup(cg); err != nil {
		return err
	}
	cookie, err := netnsCookie(ns)
	if err != nil {
		return fmt.Errorf("attach the kernel RTT source: %w", err)
	}
	if err := m.objs.PpNetnsCookie.Set(cookie); err != nil {
		return fmt.Errorf("attach the kernel RTT source: %w", err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: m.sockops})
	if err != nil {
		return fmt.Errorf("attach the kernel RTT source to cgroup %s: %w", cg, err)
	}
	m.cgroupLink, m.cgroupPath = l, cg
	return nil
}

// KernelRTTCgroupPath is the cgroup the kernel RTT source is attached to ("" when it is not).
func (m *Monitor) KernelRTTCgroupPath() string { return m.cgroupPath }

// ForbidRootCgroupEnv, when set in the environment, makes attaching the kernel RTT source to
// the cgroup2 root an error: the test suite sets it (scripts/test.sh, internal/pping's
// TestMain), so a test that forgot to give the monitor a cgroup of its own fails instead of
// touching every process of the host.
const ForbidRootCgroupEnv = "KEDGE_FORBID_ROOT_CGROUP"

func guardRootCgroup(cg string) error {
	if os.Getenv(ForbidRootCgroupEnv) == "" {
		return nil
	}
	root, err := bpfx.Cgroup2Root()
	if err != nil {
		return nil // no root to protect
	}
	a, errA := os.Stat(cg)
	b, errB := os.Stat(root)
	if errA == nil && errB == nil && os.SameFile(a, b) {
		return fmt.Errorf("attach the kernel RTT source: %s is the cgroup2 root and %s is set (tests attach to a cgroup of their own)", cg, ForbidRootCgroupEnv)
	}
	return nil
}
