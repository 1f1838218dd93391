// Package bpfx is kedge's loader and attach layer: loading collections with readable
// verifier errors, attaching TC programs (TCX, falling back to clsact before 6.6) and XDP
// programs (native, falling back to generic) inside a given network namespace, and the
// kedge-owned bpffs directory for pins. Every attachment is an io.Closer that detaches.
package bpfx

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
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
		return loadError(what, err, memlockErr)
	}
	return nil
}

// loadError is the *LoadError of a failed load of what.
func loadError(what string, err, memlockErr error) error {
	if memlockErr != nil {
		err = errors.Join(err, fmt.Errorf("raise RLIMIT_MEMLOCK: %w", memlockErr))
	}
	return &LoadError{What: what, err: NotSupported("a BPF feature of the "+what+" programs", "",
		"see 'kedge probe' for what this kernel offers", err)}
}

// NewCollection loads spec like LoadAndAssign, for a collection whose programs and maps
// are not known at build time (an object the user built): every program and map of spec.
func NewCollection(what string, spec *ebpf.CollectionSpec, opts ebpf.CollectionOptions) (*ebpf.Collection, error) {
	memlockErr := rlimit.RemoveMemlock()
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err != nil {
		return nil, loadError(what, err, memlockErr)
	}
	return coll, nil
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

// Htons returns the value whose in-memory bytes are v in network order: what a __be16 field
// of a bpf2go struct holds (a port, an ethertype), or a socket address's protocol. It is its
// own inverse (ntohs). kedge's objects are bpfel: the host is little-endian.
func Htons(v uint16) uint16 { return bits.ReverseBytes16(v) }
