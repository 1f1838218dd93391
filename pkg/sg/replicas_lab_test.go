package sg

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	isg "github.com/kedge-dev/kedge/internal/sg"
)

// replicaLab brings up a lab (coord, w1, w2) with shards shards: shard i's first replica
// is w1:port+i, served by a kedge sg worker process started here, its second w2:port+i,
// whose processes startW2 starts.
func replicaLab(t *testing.T, name string, port uint16, shards int, startW2 func(bin string, w2 *lab.Host)) (*lab.Host, []netip.AddrPort, [][]netip.AddrPort) {
	t.Helper()
	bpftest.RequireRoot(t)
	bin := bpftest.KedgeBinary(t)
	l, err := lab.Up(lab.Spec{Name: name, Fabric: lab.Bridge, Hosts: []string{"coord", "w1", "w2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	w1, w2 := l.Host("w1"), l.Host("w2")
	startWorkers(t, bin, w1, w1.IPv4, port, shards)
	startW2(bin, w2)
	var workers []netip.AddrPort
	var replicas [][]netip.AddrPort
	for i := range shards {
		workers = append(workers, netip.AddrPortFrom(w1.IPv4, port+uint16(i)))
		replicas = append(replicas, []netip.AddrPort{netip.AddrPortFrom(w2.IPv4, port+uint16(i))})
	}
	return l.Host("coord"), workers, replicas
}

// TestLabReplicas: four shards, each with a replica on w1 and one on w2, served by real
// `kedge sg worker` processes; shard 2's replica on w2 has no process (dead). Requests
// alternate between the replicas of each shard (round robin); the first copy that goes to
// the dead replica expires its request, the next pick that finds it unanswered for the
// timeout ejects it, and from then on every request completes with all four shards
// answered and the sum each shard's worker index gives.
func TestLabReplicas(t *testing.T) {
	const port, shards, dead = 9300, 4, 2
	coord, workers, replicas := replicaLab(t, "sgr", port, shards, func(bin string, w2 *lab.Host) {
		startWorkers(t, bin, w2, w2.IPv4, port, dead)                 // shards 0 and 1
		startWorkers(t, bin, w2, w2.IPv4, port+dead+1, shards-dead-1) // shard 3
	})
	// The timeout (also how long a replica may leave a copy unanswered) is generous: a
	// loaded machine can starve a live worker process for hundreds of milliseconds, and it
	// must not be judged dead. The back-off outlasts the test.
	g, err := Open(Config{Interface: coord.Iface, Netns: coord.Path(), Workers: workers, Replicas: replicas,
		Reduction: Sum, Type: Int64, Elems: 3, Timeout: time.Second, EjectBackoff: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const n = 40
	timeouts, firstOK := 0, -1
	for k := range n {
		res, err := g.Scatter(context.Background(), []byte("replicas"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status == Timeout {
			timeouts++
			if firstOK >= 0 {
				t.Fatalf("request %d (%#x) timed out after request %d completed: %+v", k, res.ID, firstOK, res)
			}
			if res.Count != shards-1 || len(res.Answered) != shards-1 || res.Answered[dead] == dead {
				t.Fatalf("request %d: timeout with %v answered; want every shard but %d", k, res.Answered, dead)
			}
			continue
		}
		if firstOK < 0 && timeouts > 0 {
			firstOK = k
		}
		checkSum(t, k, res, shards)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests: %d timed out; stats: ejections %d shard_out %d copies %d replies %d", n, timeouts, st.Ejections, st.ShardOut, st.Copies, st.Replies)
	// The dead replica gets a copy from the first or second request (round robin), and at
	// most one more before it is judged: the request after the expired one goes to the
	// live replica, and the one after that finds the dead one unanswered for the timeout.
	if timeouts < 1 || timeouts > 2 {
		t.Errorf("%d requests timed out, want 1 or 2 (until the dead replica is ejected)", timeouts)
	}
	if st.Ejections != 1 || st.ShardOut != 0 || st.Timeouts != uint64(timeouts) || st.Copies != n*shards || st.Unregistered != 0 {
		t.Errorf("stats %+v: want 1 ejection, %d timeouts, %d copies", st, timeouts, n*shards)
	}
}

// TestLabReplicaLatency: four shards, each with a fast replica on w1 and one on w2 that
// answers 20 ms late. With LowestLatency each slow replica is tried once (no estimate yet)
// and then avoided: the requests after the first few complete in well under 20 ms, while
// round robin would make nearly every request wait for a slow replica (each request has
// four shards, each sent to the slow one every other time).
func TestLabReplicaLatency(t *testing.T) {
	const port, shards, slow = 9400, 4, 20 * time.Millisecond
	coord, workers, replicas := replicaLab(t, "sgl", port, shards, func(bin string, w2 *lab.Host) {
		startWorkers(t, bin, w2, w2.IPv4, port, shards, "--delay", slow.String())
	})
	g, err := Open(Config{Interface: coord.Iface, Netns: coord.Path(), Workers: workers, Replicas: replicas,
		ReplicaChoice: LowestLatency, Reduction: Sum, Type: Int64, Elems: 3, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const warm, n = 10, 40
	fast := 0
	for k := range warm + n {
		res, err := g.Scatter(context.Background(), []byte("latency"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != OK || res.Count != shards {
			t.Fatalf("request %d: %+v", k, res)
		}
		if k >= warm && res.Kernel < slow*3/4 {
			fast++
		}
	}
	var est []string
	for i := range shards {
		var sh isg.ShardRec
		if err := g.objs.Replicas.Lookup(uint32(i), &sh); err != nil {
			t.Fatal(err)
		}
		est = append(est, fmt.Sprintf("%v/%v", time.Duration(sh.P50Ns[0]), time.Duration(sh.P50Ns[1])))
		if sh.P50Ns[0] == 0 || sh.P50Ns[1] == 0 || sh.P50Ns[1] < uint64(slow) {
			t.Errorf("shard %d: estimates %v (fast) %v (slow): want both sampled, the slow one at least %v", i, time.Duration(sh.P50Ns[0]), time.Duration(sh.P50Ns[1]), slow)
		}
	}
	t.Logf("%d of %d requests after the first %d completed within %v; estimates fast/slow per shard %v", fast, n, warm, slow*3/4, est)
	// A loaded machine can delay a fast reply now and then; round robin would give ~1 in 16.
	if fast < n*3/4 {
		t.Errorf("%d of %d requests completed within %v, want at least %d", fast, n, slow*3/4, n*3/4)
	}
}
