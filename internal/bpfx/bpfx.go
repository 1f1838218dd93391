// Package bpfx is kedge's loader and attach layer: loading collections with readable
// verifier errors, attaching TC programs (TCX, falling back to clsact before 6.6) and XDP
// programs (native, falling back to generic) inside a given network namespace, and the
// kedge-owned bpffs directory for pins. Every attachment is an io.Closer that detaches.
package bpfx

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/pkg/kedge"
)

// LoadError wraps a load failure; its message carries the verifier log's last lines, and
// Full() the whole log (shown with kedge -v). A failure because the kernel lacks a map
// type, program type or helper matches kedge.ErrNotSupported (a *kedge.FeatureError).
type LoadError struct {
	What string
	err  error
}

func (e *LoadError) Error() string {
	var ve *ebpf.VerifierError
	if errors.As(e.err, &ve) {
		return fmt.Sprintf("load %s: verifier rejected the program: %v (run with -v for the full verifier log)", e.What, ve)
	}
	return fmt.Sprintf("load %s: %v", e.What, e.err)
}

func (e *LoadError) Unwrap() error { return e.err }

// Full returns the complete verifier log, or the plain error.
func (e *LoadError) Full() string {
	var ve *ebpf.VerifierError
	if errors.As(e.err, &ve) {
		return fmt.Sprintf("%+v", ve)
	}
	return e.err.Error()
}

// LoadAndAssign loads spec into to (a bpf2go objects struct). It never requires raising
// RLIMIT_MEMLOCK: on kernels with memcg accounting (5.11+) the rlimit does not apply, and
// on older ones RemoveMemlock's failure is reported only if loading then fails.
func LoadAndAssign(what string, spec *ebpf.CollectionSpec, to any, opts *ebpf.CollectionOptions) error {
	memlockErr := rlimit.RemoveMemlock()
	if err := spec.LoadAndAssign(to, opts); err != nil {
		if memlockErr != nil {
			err = errors.Join(err, fmt.Errorf("raise RLIMIT_MEMLOCK: %w", memlockErr))
		}
		return &LoadError{What: what, err: NotSupported("a BPF feature of the "+what+" programs", "",
			"see 'kedge probe' for what this kernel offers", err)}
	}
	return nil
}

// ThreadNetns returns a handle to the calling thread's network namespace. Unlike
// netns.Get (/proc/<getpid()>/task/<gettid()>), it works in a PID namespace of its own,
// where /proc may be the parent namespace's and the pid names another process.
func ThreadNetns() (netns.NsHandle, error) {
	return netns.GetFromPath("/proc/thread-self/ns/net")
}

// OpenNamedNetns opens the network namespace name under /run/netns. An entry there whose
// namespace mount is gone is an error: a process in a mount namespace of its own (one run
// under `ip netns exec`) that named a namespace left, when it ended, only the empty file
// in this mount namespace's view.
func OpenNamedNetns(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromName(name)
	if err != nil {
		return h, err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(h), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		h.Close()
		return -1, fmt.Errorf("open netns %s: not a namespace (a mount made in another mount namespace, gone)", name)
	}
	return h, nil
}

// NotSupported turns err into a *kedge.FeatureError for feature when it says the kernel
// lacks something: cilium/ebpf's ErrNotSupported, or EOPNOTSUPP. Other errors are
// returned as they are. The FeatureError wraps err, so errors.Is(err, ebpf.ErrNotSupported)
// still holds.
func NotSupported(feature, minKernel, hint string, err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EOPNOTSUPP) {
		return &kedge.FeatureError{Feature: feature, MinKernel: minKernel, Hint: hint, Err: err}
	}
	return err
}

// QdiscError classifies a failure to add a qdisc of kind: the kernel answers ENOENT for a
// kind it does not know (neither built in nor loadable as sch_<kind>), which is a missing
// feature (*kedge.FeatureError); any other error is returned as it is.
func QdiscError(kind string, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
		module := "sch_" + kind
		if kind == "clsact" {
			module = "sch_ingress"
		}
		return &kedge.FeatureError{Feature: "qdisc " + kind, Err: err,
			Hint: "install its module " + module + " or build the kernel with it"}
	}
	return err
}

// InNetns runs fn on a thread inside ns (ns < 0: the caller's namespace). Interface indexes
// are per namespace, so attaching must happen inside the target namespace.
func InNetns(ns netns.NsHandle, fn func() error) error {
	if ns < 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := ThreadNetns()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return to original netns: %w", err))
			return // thread stays locked; Go retires it
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
