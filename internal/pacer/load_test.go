package pacer

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/kedge-dev/kedge/internal/probe"
	"github.com/kedge-dev/kedge/pkg/kedge"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

// requireEcho skips on kernels the reference consumer does not load on: pacer.h needs
// 5.12 (atomics), the echo's tick program bpf_loop (5.17). On those kernels New must
// refuse with a FeatureError (checked here) when it is older than the pacer's minimum.
func requireEcho(t *testing.T) {
	t.Helper()
	bpftest.RequireRoot(t)
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if ok, parsed := probe.KernelAtLeast(rel, 5, 17); parsed && !ok {
		if ok5, _ := probe.KernelAtLeast(rel, MinKernelMajor, MinKernelMinor); !ok5 {
			if _, err := New(Options{Netns: -1}); !errors.Is(err, kedge.ErrNotSupported) {
				t.Errorf("New on kernel %s: %v, want a FeatureError (pacer needs %d.%d)", rel, err, MinKernelMajor, MinKernelMinor)
			}
		}
		t.Skipf("kernel %s: the reference consumer needs bpf_loop (5.17)", rel)
	}
}

// TestLoadVerifies loads the pacer's object and the reference consumer bound to it (the
// client header's code included) for every backend: the verifier sees each backend's branch
// live in turn.
func TestLoadVerifies(t *testing.T) {
	requireEcho(t)
	if bpftest.InGuest() {
		t.Skip("in a matrix guest TestLabEcho loads every backend (a load costs ~15 s under TCG)")
	}
	for _, b := range []pacerPacerBackend{pacerPacerBackendPACER_CONVEYOR, pacerPacerBackendPACER_NETEM, pacerPacerBackendPACER_EDT} {
		t.Run(fmt.Sprint(b), func(t *testing.T) {
			loadWithEcho(t, Config{Backend: uint32(b), TickBytes: 128}, echoEchoConfig{}, false)
		})
	}
}
