package sg

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// workerNetns runs RunWorkers(cfg) in a fresh namespace with lo up and returns it; the
// workers stop when the test ends.
func workerNetns(t *testing.T, cfg WorkerConfig, st *WorkerStats) *netnsx.Netns {
	t.Helper()
	bpftest.RequireRoot(t)
	ns, err := netnsx.New(netnsx.OwnedName(fmt.Sprintf("sgwrk%d", nsSeq.Add(1))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := ns.LoopbackUp(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	ready := make(chan struct{})
	go func() { errc <- ns.Do(func() error { return RunWorkers(ctx, cfg, st, ready) }) }()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	})
	return ns
}

// exchange sends the datagrams in reqs to dst from one socket in ns and collects what
// comes back until want datagrams arrived or quiet passed without one.
func exchange(t *testing.T, ns *netnsx.Netns, dst netip.AddrPort, reqs [][]byte, want int, quiet time.Duration) [][]byte {
	t.Helper()
	var got [][]byte
	err := ns.Do(func() error {
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		for _, r := range reqs {
			if _, err := c.WriteToUDPAddrPort(r, dst); err != nil {
				return err
			}
		}
		buf := make([]byte, 65536)
		for len(got) < want {
			_ = c.SetReadDeadline(time.Now().Add(quiet))
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return nil // quiet: the caller compares what came
			}
			if from.Port() != dst.Port() {
				return fmt.Errorf("reply from %v, want %v", from, dst)
			}
			got = append(got, append([]byte(nil), buf[:n]...))
		}
		// Nothing more than want may come (duplicates counted once per request).
		_ = c.SetReadDeadline(time.Now().Add(min(quiet/4, 100*time.Millisecond)))
		if n, _, err := c.ReadFromUDPAddrPort(buf); err == nil {
			got = append(got, append([]byte(nil), buf[:n]...))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func workerRequest(worker uint16, id uint64) []byte {
	h := Header{Version: Version, Op: OpRequest, Group: 3, Worker: worker, ReqID: id, PayloadLen: 2}
	return append(h.Append(nil), "hi"...)
}

// TestWorkerReplies: IPv4 and IPv6 sockets over two event loops; a burst larger than one
// recvmmsg batch to one socket is answered in full, each reply byte for byte the reference
// reply (per-worker values and constant values, int32 and int64); malformed datagrams and
// replies sent to a worker are counted and not answered.
func TestWorkerReplies(t *testing.T) {
	var listen []netip.AddrPort
	for i := range 4 {
		listen = append(listen, netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", 18100+i)),
			netip.MustParseAddrPort(fmt.Sprintf("[::1]:%d", 18100+i)))
	}
	for _, cfg := range []WorkerConfig{
		{Listen: listen, Type: TypeI64, Elems: 3, Threads: 2},
		{Listen: listen, Type: TypeI32, Elems: 2, Values: []int64{-7, 1 << 20}, Threads: 1},
	} {
		var st WorkerStats
		ns := workerNetns(t, cfg, &st)
		const burst = 3*workerBatch + 5
		for i, a := range listen {
			var reqs [][]byte
			for k := range burst {
				reqs = append(reqs, workerRequest(uint16(i), uint64(k)<<8|uint64(i)))
			}
			reqs = append(reqs, []byte("not sg"), workerRequest(uint16(i), 1)[:HdrLen-1])
			reply := workerRequest(uint16(i), 5)
			reply[3] = OpReply
			reqs = append(reqs, reply)
			got := exchange(t, ns, a, reqs, burst, 2*time.Second)
			if len(got) != burst {
				t.Fatalf("%v: %d replies to %d requests", a, len(got), burst)
			}
			seen := map[uint64]bool{}
			for _, g := range got {
				h, _, err := ParseHeader(g)
				if err != nil || seen[h.ReqID] {
					t.Fatalf("%v: reply %x: %v (or a second reply to %#x)", a, g, err, h.ReqID)
				}
				seen[h.ReqID] = true
				rh := Header{Worker: uint16(i), ReqID: h.ReqID, Group: 3}
				if want := BuildReply(rh, cfg)[0]; !bytes.Equal(g, want) {
					t.Errorf("%v: reply %x, want %x", a, g, want)
				}
			}
		}
		n := uint64(len(listen))
		if st.Requests.Load() != n*burst || st.Replies.Load() != n*burst || st.Malformed.Load() != 3*n {
			t.Errorf("stats requests %d replies %d malformed %d, want %d %d %d", st.Requests.Load(),
				st.Replies.Load(), st.Malformed.Load(), n*burst, n*burst, 3*n)
		}
	}
}

// TestWorkerFaults: loss 1 answers nothing; dup 1 answers every request twice; a fixed
// delay holds every reply at least that long, exponential jitter delivers them all; a
// straggler's reply waits at least StraggleMin, a seeded fraction of replies straggle, and
// a straggle setting out of range is refused.
func TestWorkerFaults(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:18200")
	reqs := [][]byte{workerRequest(0, 1), workerRequest(0, 2), workerRequest(0, 3)}
	t.Run("loss", func(t *testing.T) {
		var st WorkerStats
		ns := workerNetns(t, WorkerConfig{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 1, Loss: 1}, &st)
		if got := exchange(t, ns, a, reqs, 1, 300*time.Millisecond); len(got) != 0 {
			t.Errorf("%d replies with loss 1", len(got))
		}
		if st.Dropped.Load() != 3 || st.Replies.Load() != 0 {
			t.Errorf("dropped %d replies %d", st.Dropped.Load(), st.Replies.Load())
		}
	})
	t.Run("dup", func(t *testing.T) {
		var st WorkerStats
		ns := workerNetns(t, WorkerConfig{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 1, Dup: 1}, &st)
		if got := exchange(t, ns, a, reqs, 6, 2*time.Second); len(got) != 6 {
			t.Errorf("%d replies to 3 requests with dup 1, want 6", len(got))
		}
		if st.Dups.Load() != 3 || st.Replies.Load() != 3 {
			t.Errorf("dups %d replies %d", st.Dups.Load(), st.Replies.Load())
		}
	})
	t.Run("delay", func(t *testing.T) {
		const d = 30 * time.Millisecond
		ns := workerNetns(t, WorkerConfig{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 1, Delay: d, Dup: 1}, nil)
		start := time.Now()
		got := exchange(t, ns, a, reqs, 6, 2*time.Second)
		if len(got) != 6 {
			t.Fatalf("%d delayed replies, want 6", len(got))
		}
		if el := time.Since(start); el < d {
			t.Errorf("replies after %v, delay %v", el, d)
		}
	})
	t.Run("straggle", func(t *testing.T) {
		// Every reply a straggler: none before StraggleMin.
		const lo = 40 * time.Millisecond
		var st WorkerStats
		ns := workerNetns(t, WorkerConfig{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 1, Straggle: 1,
			StraggleMin: lo, StraggleMax: lo + 10*time.Millisecond}, &st)
		start := time.Now()
		if got := exchange(t, ns, a, reqs, 3, 2*time.Second); len(got) != 3 {
			t.Fatalf("%d straggling replies, want 3", len(got))
		}
		if el := time.Since(start); el < lo || st.Straggled.Load() != 3 {
			t.Errorf("replies after %v (straggle delay at least %v), straggled %d of 3", el, lo, st.Straggled.Load())
		}
	})
	t.Run("straggle-some", func(t *testing.T) {
		// A quarter of 200 (seeded: the same ones every run), every request answered.
		var st WorkerStats
		ns := workerNetns(t, WorkerConfig{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 1, Straggle: 0.25,
			StraggleMin: time.Millisecond, StraggleMax: 5 * time.Millisecond, Seed: 3, Threads: 1}, &st)
		var many [][]byte
		for k := range 200 {
			many = append(many, workerRequest(0, uint64(k)))
		}
		if got := exchange(t, ns, a, many, 200, 2*time.Second); len(got) != 200 {
			t.Errorf("%d of 200 replies", len(got))
		}
		if n := st.Straggled.Load(); n < 25 || n > 75 {
			t.Errorf("%d of 200 replies straggled with probability 0.25", n)
		}
	})
	t.Run("straggle-config", func(t *testing.T) {
		for _, c := range []WorkerConfig{
			{Straggle: 1.5, StraggleMin: time.Millisecond, StraggleMax: time.Millisecond},
			{Straggle: 0.1},
			{Straggle: 0.1, StraggleMin: 2 * time.Millisecond, StraggleMax: time.Millisecond},
		} {
			c.Listen, c.Type, c.Elems = []netip.AddrPort{a}, TypeI64, 1
			if err := RunWorkers(context.Background(), c, nil, make(chan struct{})); err == nil || !strings.Contains(err.Error(), "straggle") {
				t.Errorf("%+v: %v, want a straggle error", c, err)
			}
		}
	})
	t.Run("exp", func(t *testing.T) {
		ns := workerNetns(t, WorkerConfig{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 1,
			Jitter: 2 * time.Millisecond, Dist: "exp", Seed: 7}, nil)
		var many [][]byte
		for k := range 200 {
			many = append(many, workerRequest(0, uint64(k)))
		}
		if got := exchange(t, ns, a, many, 200, 2*time.Second); len(got) != 200 {
			t.Errorf("%d of 200 jittered replies", len(got))
		}
	})
}

// TestWorkerParts: a vector larger than MaxDatagram is split into the fewest parts that
// fit, each part byte for byte AppendPart's (PartSlice's slice), delayed replies too;
// PartLoss 1 sends no part; Parts forces the count.
func TestWorkerParts(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:18300")
	reqs := [][]byte{workerRequest(0, 1), workerRequest(0, 2)}
	for _, cfg := range []WorkerConfig{
		{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 256, MaxDatagram: DefaultMaxDatagram},
		{Listen: []netip.AddrPort{a}, Type: TypeI32, Elems: 10, Parts: 4, Delay: time.Millisecond},
	} {
		n := cfg.NParts()
		if cfg.MaxDatagram > 0 && n != 2 {
			t.Fatalf("256 x int64 in %d parts of at most %d bytes, want 2", n, cfg.MaxDatagram)
		}
		ns := workerNetns(t, cfg, nil)
		got := exchange(t, ns, a, reqs, len(reqs)*n, 2*time.Second)
		if len(got) != len(reqs)*n {
			t.Fatalf("%d datagrams for %d requests of %d parts", len(got), len(reqs), n)
		}
		seen := map[[2]uint64]bool{}
		for _, g := range got {
			h, payload, err := ParseHeader(g)
			if err != nil || int(h.NParts) != n || seen[[2]uint64{h.ReqID, uint64(h.Part)}] || len(g) > max(cfg.MaxDatagram, HdrLen+40) {
				t.Fatalf("part %x: %v (%d bytes, nparts %d, or seen before)", g[:HdrLen], err, len(g), h.NParts)
			}
			seen[[2]uint64{h.ReqID, uint64(h.Part)}] = true
			off, k, _ := PartSlice(cfg.Elems, n, int(h.Part))
			v := DecodeVector(payload, cfg.Type)
			if len(v) != k || v[0] != ValueFor(0, h.ReqID, off) || v[k-1] != ValueFor(0, h.ReqID, off+k-1) {
				t.Fatalf("part %d of %d: %d elements from %d, want %d", h.Part, n, len(v), v[0], k)
			}
			if want := AppendPart(nil, Header{ReqID: h.ReqID, Group: 3}, cfg, int(h.Part), n); !bytes.Equal(g, want) {
				t.Fatalf("part %d differs from AppendPart", h.Part)
			}
		}
	}
	t.Run("part loss", func(t *testing.T) {
		ns := workerNetns(t, WorkerConfig{Listen: []netip.AddrPort{a}, Type: TypeI64, Elems: 4, Parts: 2, PartLoss: 1}, nil)
		if got := exchange(t, ns, a, reqs, 1, 300*time.Millisecond); len(got) != 0 {
			t.Errorf("%d parts sent with part loss 1", len(got))
		}
	})
}
