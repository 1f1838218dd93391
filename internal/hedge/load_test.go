package hedge

import (
	"errors"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

func TestLoadVerifies(t *testing.T) {
	requireRoot(t)
	spec, err := loadHedge()
	if err != nil {
		t.Fatal(err)
	}
	var objs hedgeObjects
	if err := bpfx.LoadAndAssign("hedge", spec, &objs, nil); err != nil {
		var le *bpfx.LoadError
		if ok := errors.As(err, &le); ok {
			t.Log(le.Full())
		}
		t.Fatal(err)
	}
	objs.Close()
}
