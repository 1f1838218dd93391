package sg

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	isg "github.com/kedge-dev/kedge/internal/sg"
)

func TestLoopbackSmoke(t *testing.T) {
	bpftest.RequireRoot(t)
	ns, err := lab.NewNetns("sgsmoke")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if _, err := ns.Run("ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	var workers []netip.AddrPort
	for i := range 4 {
		workers = append(workers, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(19000+i)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- ns.Do(func() error {
			return isg.RunWorkers(ctx, isg.WorkerConfig{Listen: workers, Type: isg.TypeI64, Elems: 3}, nil, ready)
		})
	}()
	<-ready
	g, err := Open(Config{Interface: "lo", Netns: ns.Path(), Workers: workers, Reduction: Sum, Type: Int64, Elems: 3, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for k := 0; k < 5; k++ {
		res, err := g.Scatter(ctx, []byte("hello"))
		t.Logf("res %+v err %v", res, err)
	}
	st, _ := g.Stats()
	t.Logf("stats %+v", st)
}
