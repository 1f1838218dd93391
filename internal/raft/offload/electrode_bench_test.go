package offload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raft/rafttest"
	"github.com/kedge-dev/kedge/internal/raft/transport"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// BenchmarkAppendSend measures what Electrode's broadcast would save kedge's leader: the
// user-space CPU of sending one append to N followers (etcd-raft's bcastAppend: one MsgApp
// per follower, each marshalled and written to that follower's TCP connection by the
// transport), for N = 1, 2, 4. Each iteration is one round of appendsPerRound appends to
// each N in turn (alternating, so the figures are side by side); the metrics are the
// medians over the rounds. Followers are sinks in a child process (loopback TCP, bytes
// discarded), so the figure is the leader process's own CPU (getrusage), which on loopback
// includes the kernel's TCP work of both ends' send path. docs/raft.md "Electrode:
// broadcast and quorum wait". Figures only; make test runs one round. For figures, five
// rounds on a quiet machine:
//
//	flock -x /tmp/kedge-quiet.lock go test -count=1 -run '^$' -bench AppendSend -benchtime=5x -v ./internal/raft/offload
func BenchmarkAppendSend(b *testing.B) {
	const (
		appendsPerRound = 5000
		entry           = 128 // bytes of one entry: a kv put's JSON is about this
	)
	b.Logf("load average at start %v", bench.LoadAvg())
	followers := []int{1, 2, 4}
	var addrs []string
	for range 4 {
		addrs = append(addrs, rafttest.FreeAddr(b).String())
	}
	sink := exec.Command(os.Args[0], "-test.run=^TestElectrodeSink$")
	sink.Env = append(os.Environ(), "KEDGE_ELECTRODE_SINK="+strings.Join(addrs, ","))
	stdin, err := sink.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := sink.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := sink.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); sink.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); !strings.HasPrefix(line, "listening") {
		b.Fatalf("sink: %q", line)
	}
	// Two regimes: saturated (appends as fast as the transport takes them: its sender
	// batches frames into one write per connection) and paced (one append per 200 us,
	// each written and flushed on its own: a write system call per follower per append).
	for _, pace := range []time.Duration{0, 200 * time.Microsecond} {
		regime := "saturated"
		if pace > 0 {
			regime = fmt.Sprintf("paced-%dus", pace.Microseconds())
		}
		b.Run(regime, func(b *testing.B) {
			cpu := map[int][]float64{}
			for range b.N {
				for _, n := range followers {
					d, err := sendAppends(addrs[:n], appendsPerRound, entry, pace)
					if err != nil {
						b.Fatal(err)
					}
					cpu[n] = append(cpu[n], float64(d.Nanoseconds())/appendsPerRound)
				}
			}
			b.ReportMetric(0, "ns/op") // an iteration is a round of every N: its wall time means nothing
			for _, n := range followers {
				med := bench.Median(cpu[n])
				b.ReportMetric(med, fmt.Sprintf("cpu-ns/append-%d-followers", n))
				b.Logf("%s, followers %d: leader CPU per append, median of %d rounds of %d: %.0f ns (min %.0f, max %.0f); over one follower: %+.0f ns",
					regime, n, b.N, appendsPerRound, med, slices.Min(cpu[n]), slices.Max(cpu[n]), med-bench.Median(cpu[1]))
			}
		})
	}
	b.Logf("load average at end %v", bench.LoadAvg())
}

// sendAppends sends count appends (one MsgApp per follower each, pace apart; 0: as fast as
// the transport takes them) through a fresh transport and returns the process CPU time it
// took, until every frame was written.
func sendAppends(peers []string, count, entry int, pace time.Duration) (time.Duration, error) {
	reg := prometheus.NewRegistry()
	var ps []transport.Peer
	for i, a := range peers {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			return 0, err
		}
		ps = append(ps, transport.Peer{ID: uint64(i + 2), Addr: ap})
	}
	tr, err := transport.New(transport.Options{ClusterID: 42, Self: 1, Bind: "127.0.0.1:0", Peers: ps, Registry: reg})
	if err != nil {
		return 0, err
	}
	defer tr.Close()
	tr.Start(nopRaft{})
	data := make([]byte, entry)
	msgs := func(i uint64) []*pb.Message {
		var m []*pb.Message
		for _, p := range ps {
			m = append(m, &pb.Message{Type: pb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(p.ID),
				Term: proto.Uint64(5), LogTerm: proto.Uint64(5), Index: proto.Uint64(i - 1), Commit: proto.Uint64(i - 1),
				Entries: []*pb.Entry{{Term: proto.Uint64(5), Index: proto.Uint64(i), Data: data}}})
		}
		return m
	}
	// Warm up: connections dialled, buffers grown.
	tr.Send(msgs(1))
	if err := waitSent(reg, len(ps)); err != nil {
		return 0, err
	}
	before := rusage()
	next := time.Now()
	for i := range count {
		if pace > 0 {
			next = next.Add(pace)
			time.Sleep(time.Until(next)) // pacing the appends, not synchronisation
		}
		tr.Send(msgs(uint64(i + 2)))
		if pace == 0 && i%64 == 63 { // one Ready's worth at a time: the queue holds 1024
			if err := waitSent(reg, len(ps)*(i+2)); err != nil {
				return 0, err
			}
		}
	}
	if err := waitSent(reg, len(ps)*(count+1)); err != nil {
		return 0, err
	}
	return rusage() - before, nil
}

func waitSent(reg *prometheus.Registry, want int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if sentApps(reg) >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d appends written", sentApps(reg), want)
		}
		time.Sleep(100 * time.Microsecond) // polling the transport's counter
	}
}

func sentApps(reg *prometheus.Registry) int {
	mfs, _ := reg.Gather()
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "kedge_raft_transport_sent_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabel(m, "type", "MsgApp") && hasLabel(m, "transport", "tcp") {
				n += int(m.GetCounter().GetValue())
			}
		}
	}
	return n
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

func rusage() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type nopRaft struct{}

func (nopRaft) Step(context.Context, *pb.Message) error    { return nil }
func (nopRaft) ReportUnreachable(uint64)                   {}
func (nopRaft) ReportSnapshot(uint64, raft.SnapshotStatus) {}

// TestElectrodeSink is BenchmarkAppendSend's follower side (a child process): it accepts TCP on
// every address of KEDGE_ELECTRODE_SINK and discards what arrives, until stdin closes.
func TestElectrodeSink(t *testing.T) {
	addrs := os.Getenv("KEDGE_ELECTRODE_SINK")
	if addrs == "" {
		t.Skip("the benchmark's child process")
	}
	for _, a := range strings.Split(addrs, ",") {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go io.Copy(io.Discard, c)
			}
		}()
	}
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
}
