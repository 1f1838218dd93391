package pacer

import (
	"errors"
	"os"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

// TestLoadVerifies loads the reference consumer (pacer.h's programs included) for every
// backend: the verifier sees each backend's branch live in turn.
func TestLoadVerifies(t *testing.T) {
	bpftest.RequireRoot(t)
	for _, b := range []pacerPacerBackend{pacerPacerBackendPACER_CONVEYOR, pacerPacerBackendPACER_NETEM, pacerPacerBackendPACER_EDT} {
		spec, err := loadPacer()
		if err != nil {
			t.Fatal(err)
		}
		if err := spec.Variables["pacer_cfg"].Set(pacerPacerConfig{Backend: uint32(b), TickBytes: 128}); err != nil {
			t.Fatal(err)
		}
		var objs pacerObjects
		if err := bpfx.LoadAndAssign("pacer", spec, &objs, nil); err != nil {
			var le *bpfx.LoadError
			if errors.As(err, &le) {
				t.Log(le.Full())
			}
			t.Fatalf("backend %d: %v", b, err)
		}
		objs.Close()
	}
}
