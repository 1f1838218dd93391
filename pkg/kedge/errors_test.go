package kedge_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/kedge-dev/kedge/pkg/kedge"
)

func TestFeatureError(t *testing.T) {
	fe := &kedge.FeatureError{Feature: "qdisc netem", MinKernel: "", Hint: "install sch_netem", Err: syscall.ENOENT}
	err := fmt.Errorf("start hedger: %w", fe)
	if !errors.Is(err, kedge.ErrNotSupported) || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("%v: not ErrNotSupported or lost its cause", err)
	}
	var got *kedge.FeatureError
	if !errors.As(err, &got) || got != fe {
		t.Errorf("errors.As did not find the FeatureError in %v", err)
	}
	for _, tc := range []struct {
		e    *kedge.FeatureError
		want string
	}{
		{fe, "qdisc netem is not supported by this kernel: no such file or directory - install sch_netem"},
		{&kedge.FeatureError{Feature: "BPF helper bpf_loop", MinKernel: "5.17"}, "BPF helper bpf_loop is not supported by this kernel (needs Linux 5.17 or later)"},
	} {
		if tc.e.Error() != tc.want {
			t.Errorf("Error() = %q, want %q", tc.e.Error(), tc.want)
		}
	}
}

func TestExitCode(t *testing.T) {
	feature := &kedge.FeatureError{Feature: "TCX links", MinKernel: "6.6"}
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, kedge.ExitOK},
		{errors.New("connection refused"), kedge.ExitError},
		{kedge.UsageError{Err: errors.New("--x: bad")}, kedge.ExitUsage},
		{fmt.Errorf("config: %w", kedge.UsageError{Err: errors.New("bad")}), kedge.ExitUsage},
		{fmt.Errorf("attach: %w", feature), kedge.ExitUnsupported},
		{kedge.UsageError{Err: fmt.Errorf("--backend: %w", feature)}, kedge.ExitUnsupported},
		{errors.Join(errors.New("close"), feature), kedge.ExitUnsupported},
	} {
		if got := kedge.ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
