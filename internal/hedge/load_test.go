package hedge

import (
	"testing"

	"github.com/cilium/ebpf"
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
		if ok := asLoadError(err, &le); ok {
			t.Log(le.Full())
		}
		t.Fatal(err)
	}
	objs.Close()
	_ = ebpf.ErrNotSupported
}
