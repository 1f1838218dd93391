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

// checkSum fails unless res completed with every one of n workers (shards) answered and
// the sum each worker's index gives (isg.ValueFor, what `kedge sg worker` answers).
func checkSum(t *testing.T, k int, res Result, n int) {
	t.Helper()
	if res.Status != OK || res.Count != n || len(res.Answered) != n {
		t.Fatalf("request %d (%#x): %s, %d of %d answered %v", k, res.ID, res.Status, res.Count, n, res.Answered)
	}
	for j := range 3 {
		var want int64
		for w := range n {
			want += isg.ValueFor(uint16(w), res.ID, j)
		}
		if res.Values[j] != want {
			t.Fatalf("request %d (%#x) element %d: %d, want %d", k, res.ID, j, res.Values[j], want)
		}
	}
}

// TestLabRetries: eight workers on a lab host, two of them (one `kedge sg worker` process)
// losing each request with probability 0.3 (seeded), over IPv4 and IPv6. Without re-sends
// about half of the requests time out (the control); with Resend 20 ms and 8 rounds every
// request completes before its deadline with the right sum, by retries to the same workers
// (no replicas): the loss is recovered in the kernel, and a request whose reply was lost
// rather than the request gets a second reply, which is dropped as a late reply.
func TestLabRetries(t *testing.T) {
	bpftest.RequireRoot(t)
	bin := bpftest.KedgeBinary(t)
	l, err := lab.Up(lab.Spec{Name: "sgrt", Fabric: lab.Bridge, Hosts: []string{"coord", "w1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	w1, coord := l.Host("w1"), l.Host("coord")
	for k, addr := range []netip.Addr{w1.IPv4, w1.IPv6} {
		t.Run(map[bool]string{true: "ipv4", false: "ipv6"}[addr.Is4()], func(t *testing.T) {
			const n, lossy = 8, 2
			port := uint16(9500 + 100*k)
			startWorkers(t, bin, w1, addr, port, n-lossy)
			startWorkers(t, bin, w1, addr, port+n-lossy, lossy, "--loss", "0.3", "--seed", "7")
			var workers []netip.AddrPort
			for i := range n {
				workers = append(workers, netip.AddrPortFrom(addr, port+uint16(i)))
			}
			labRetries(t, Config{Interface: coord.Iface, Netns: coord.Path(), Workers: workers, Reduction: Sum, Type: Int64, Elems: 3})
		})
	}
}

// labRetries runs TestLabRetries' control and its requests with re-sends on group base.
func labRetries(t *testing.T, base Config) {
	n := len(base.Workers)
	// The control: no re-sends, a short deadline.
	ctl := base
	ctl.Timeout = 100 * time.Millisecond
	g, err := Open(ctl)
	if err != nil {
		t.Fatal(err)
	}
	const nctl = 20
	ctlTimeouts := 0
	for range nctl {
		res, err := g.Scatter(context.Background(), []byte("control"))
		if err != nil {
			g.Close()
			t.Fatal(err)
		}
		if res.Status == Timeout {
			ctlTimeouts++
		}
	}
	g.Close()
	t.Logf("control without re-sends: %d of %d requests timed out", ctlTimeouts, nctl)
	if ctlTimeouts == 0 {
		t.Fatalf("control: no request timed out with two workers losing 30%% of requests: the workers do not lose")
	}

	// A deadline no round of re-sends comes near on a loaded machine (8 rounds, 20 ms apart,
	// end by 180 ms); the budget pays for every round.
	cfg := base
	cfg.Timeout = 2 * time.Second
	cfg.Resend, cfg.MaxResends = 20*time.Millisecond, 8
	cfg.ResendBudget = ResendBudget{Ratio: 1, Burst: 64}
	g, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const reqs = 40
	for k := range reqs {
		res, err := g.Scatter(context.Background(), []byte("retries"))
		if err != nil {
			t.Fatal(err)
		}
		checkSum(t, k, res, n)
		if res.Kernel >= cfg.Timeout {
			t.Fatalf("request %d: completed after %v, past its deadline", k, res.Kernel)
		}
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests with re-sends: retries %d hedges %d refused %d late replies %d timeouts %d copies %d",
		reqs, st.Retries, st.Hedges, st.ResendRefused, st.LateReplies, st.Timeouts, st.Copies)
	if st.Retries == 0 || st.Hedges != 0 || st.ResendRefused != 0 || st.ResendErrors != 0 || st.Timeouts != 0 || st.ResendUnstored != 0 {
		t.Errorf("stats %+v: want retries, no hedges (no replicas), no refusals, errors or timeouts", st)
	}
}

// TestLabHedges: four shards of two replicas (`kedge sg worker` processes on w1 and w2);
// every replica on w2 answers 300 ms late, and shard 2 has no process on w2 at all (dead).
// Round robin sends half the copies to w2. With Resend 20 ms the copy of every shard that
// has not answered is hedged to its other replica on w1: every request completes well
// before the straggler's 300 ms (and none waits for the dead replica's timeout), with the
// right sum; hedges are counted, and won.
func TestLabHedges(t *testing.T) {
	const port, shards, dead, slow = 9600, 4, 2, 300 * time.Millisecond
	coord, workers, replicas := replicaLab(t, "sgh", port, shards, func(bin string, w2 *lab.Host) {
		startWorkers(t, bin, w2, w2.IPv4, port, dead, "--delay", slow.String())
		startWorkers(t, bin, w2, w2.IPv4, port+dead+1, shards-dead-1, "--delay", slow.String())
	})
	g, err := Open(Config{Interface: coord.Iface, Netns: coord.Path(), Workers: workers, Replicas: replicas,
		Reduction: Sum, Type: Int64, Elems: 3, Timeout: 2 * time.Second, EjectBackoff: -1,
		Resend: 20 * time.Millisecond, ResendBudget: ResendBudget{Ratio: 1, Burst: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const reqs = 30
	fast := 0
	for k := range reqs {
		res, err := g.Scatter(context.Background(), []byte("hedges"))
		if err != nil {
			t.Fatal(err)
		}
		checkSum(t, k, res, shards)
		if res.Kernel < slow/2 {
			fast++
		}
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests: %d completed within %v; hedges %d won %d retries %d refused %d late %d late replies %d",
		reqs, fast, slow/2, st.Hedges, st.HedgesWon, st.Retries, st.ResendRefused, st.Late, st.LateReplies)
	// Every request has copies on w2 (round robin over two replicas, four shards); a
	// loaded machine may starve the fast replica now and then.
	if fast < reqs*3/4 {
		t.Errorf("%d of %d requests completed within %v, want at least %d: the stragglers were not hedged", fast, reqs, slow/2, reqs*3/4)
	}
	if st.Hedges == 0 || st.HedgesWon == 0 || st.Timeouts != 0 || st.ResendErrors != 0 {
		t.Errorf("stats %+v: want hedges, hedges won, no timeouts or errors", st)
	}
}

// TestLabHedgesAdaptive: TestLabHedges' shards (every w2 replica 300 ms late) with the delay
// at the 0.9 quantile of reply times, estimated in the kernel, between 2 ms and 100 ms:
// the estimate follows the fast replicas (a straggler's copy is hedged before it answers,
// and a re-sent worker's reply is not sampled), so after a few requests the hedges go out
// well before the 100 ms ceiling and the requests complete in a fraction of it.
func TestLabHedgesAdaptive(t *testing.T) {
	const port, shards, slow = 9700, 4, 300 * time.Millisecond
	coord, workers, replicas := replicaLab(t, "sga", port, shards, func(bin string, w2 *lab.Host) {
		startWorkers(t, bin, w2, w2.IPv4, port, shards, "--delay", slow.String())
	})
	g, err := Open(Config{Interface: coord.Iface, Netns: coord.Path(), Workers: workers, Replicas: replicas,
		Reduction: Sum, Type: Int64, Elems: 3, Timeout: 2 * time.Second, EjectBackoff: -1,
		Resend: 100 * time.Millisecond, ResendQuantile: 0.9, ResendMin: 2 * time.Millisecond,
		ResendBudget: ResendBudget{Ratio: 1, Burst: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const warm, reqs = 5, 30
	fast := 0
	for k := range warm + reqs {
		res, err := g.Scatter(context.Background(), []byte("adaptive"))
		if err != nil {
			t.Fatal(err)
		}
		checkSum(t, k, res, shards)
		if k >= warm && res.Kernel < 50*time.Millisecond {
			fast++
		}
	}
	var b isg.BudgetRec
	if err := g.objs.Budgets.Lookup(uint32(0), &b); err != nil {
		t.Fatal(err)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d requests after the first %d within 50 ms; estimated 0.9 quantile %v; hedges %d won %d",
		fast, reqs, warm, time.Duration(b.DelayNs), st.Hedges, st.HedgesWon)
	if fast < reqs*3/4 || b.DelayNs == 0 || b.DelayNs >= uint64(50*time.Millisecond) {
		t.Errorf("%d of %d requests within 50 ms (want %d), estimate %v (want below 50 ms): the delay did not adapt",
			fast, reqs, reqs*3/4, time.Duration(b.DelayNs))
	}
}
