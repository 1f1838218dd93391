// Package kedge is the public face of kedge for Go programs: the error model every kedge
// package reports kernel-feature problems with, as cilium/ebpf does.
//
// A kernel that lacks something kedge needs (a helper, an attach mode, a qdisc, a minimum
// version) yields an error that matches ErrNotSupported and, with errors.As, a *FeatureError
// naming the feature, the oldest kernel that has it and what to do:
//
//	if err := ...; errors.Is(err, kedge.ErrNotSupported) {
//		var fe *kedge.FeatureError
//		errors.As(err, &fe) // fe.Feature, fe.MinKernel, fe.Hint
//	}
//
// The kedge command maps such errors to exit code 3 (see ExitCode).
//
// Packages under pkg/ export only standard-library types and types declared under pkg/;
// they may use kedge's internal packages (docs/development.md, "Public API boundary").
package kedge

import (
	"errors"
	"strings"
)

// ErrNotSupported matches every error caused by a missing kernel feature.
var ErrNotSupported = errors.New("not supported by this kernel")

// FeatureError is a kernel feature kedge needs and the running kernel lacks.
type FeatureError struct {
	// Feature names what is missing, e.g. "qdisc netem" or "BPF helper bpf_loop".
	Feature string
	// MinKernel is the oldest mainline kernel that has it ("5.17"); empty when it is a
	// build option or module rather than a version.
	MinKernel string
	// Hint says what to do, e.g. "load sch_netem, or use --backend conveyor".
	Hint string
	// Err is what the kernel answered (an errno, cilium/ebpf's error), if any.
	Err error
}

func (e *FeatureError) Error() string {
	var b strings.Builder
	b.WriteString(e.Feature)
	b.WriteString(" is not supported by this kernel")
	if e.MinKernel != "" {
		b.WriteString(" (needs Linux ")
		b.WriteString(e.MinKernel)
		b.WriteString(" or later)")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.Hint != "" {
		b.WriteString(" - ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

// Is makes every FeatureError match ErrNotSupported.
func (e *FeatureError) Is(target error) bool { return target == ErrNotSupported }

// Unwrap returns the kernel's answer, so errors.Is(err, unix.ENOENT) and the like still work.
func (e *FeatureError) Unwrap() error { return e.Err }

// Exit codes of the kedge command, documented in README.md and `kedge --help`.
const (
	ExitOK          = 0 // success
	ExitError       = 1 // a runtime error
	ExitUsage       = 2 // bad usage: flags, arguments, config, a named interface or namespace that does not exist
	ExitUnsupported = 3 // this kernel cannot do what was asked (errors.Is(err, ErrNotSupported))
)

// UsageError marks an error as the caller's: a bad flag, argument, config or name. The
// kedge command exits with ExitUsage for it. It is a value type: errors.As(err, &UsageError{})
// finds it.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// ExitCode maps an error to the kedge command's exit code: nil -> ExitOK, a missing kernel
// feature -> ExitUnsupported, a UsageError -> ExitUsage, anything else -> ExitError. A
// missing feature wins over a usage error that wraps it: the kernel, not the flags, is
// what has to change.
func ExitCode(err error) int {
	var ue UsageError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrNotSupported):
		return ExitUnsupported
	case errors.As(err, &ue):
		return ExitUsage
	default:
		return ExitError
	}
}
