package bpfx

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestRetryDump: an interrupted dump is asked again; another error or a clean dump ends
// it; a dump interrupted every time returns its error after dumpRetries tries.
func TestRetryDump(t *testing.T) {
	other := errors.New("other")
	for _, tc := range []struct {
		name      string
		errs      []error // per call; past the end: nil
		wantCalls int
		wantErr   error
	}{
		{"clean", nil, 1, nil},
		{"interrupted twice", []error{netlink.ErrDumpInterrupted, netlink.ErrDumpInterrupted}, 3, nil},
		{"other error", []error{other}, 1, other},
		{"always interrupted", []error{netlink.ErrDumpInterrupted, netlink.ErrDumpInterrupted, netlink.ErrDumpInterrupted,
			netlink.ErrDumpInterrupted, netlink.ErrDumpInterrupted, netlink.ErrDumpInterrupted}, dumpRetries, netlink.ErrDumpInterrupted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			v, err := retryDump(func() (int, error) {
				calls++
				if calls <= len(tc.errs) {
					return calls, tc.errs[calls-1]
				}
				return calls, nil
			})
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || v != calls {
				t.Errorf("calls %d, err %v, v %d; want calls %d, err %v", calls, err, v, tc.wantCalls, tc.wantErr)
			}
		})
	}
}
