package transport

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/rafttest"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// recorder is a Raft that records what the transport delivers.
type recorder struct {
	mu   sync.Mutex
	msgs []*pb.Message
	snap []raft.SnapshotStatus
}

func (r *recorder) Step(_ context.Context, m *pb.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	return nil
}
func (r *recorder) ReportUnreachable(uint64) {}
func (r *recorder) ReportSnapshot(_ uint64, s raft.SnapshotStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snap = append(r.snap, s)
}
func (r *recorder) got() []*pb.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pb.Message(nil), r.msgs...)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const cluster = 9

// pair starts transports for nodes 1 and 2 on loopback; peer 1's address is the given
// socket's when conn is set (so a test can send from "node 1" by hand).
func newNode(t *testing.T, self uint64, peers []Peer) (*Transport, *recorder) {
	t.Helper()
	return newKeyedNode(t, self, peers, nil)
}

func newKeyedNode(t *testing.T, self uint64, peers []Peer, key *wire.Key) (*Transport, *recorder) {
	t.Helper()
	var bind string
	for _, p := range peers {
		if p.ID == self {
			bind = p.Addr.String()
		}
	}
	var others []Peer
	for _, p := range peers {
		if p.ID != self {
			others = append(others, p)
		}
	}
	tr, err := New(Options{ClusterID: cluster, Self: self, Bind: bind, Peers: others, Key: key,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	tr.Start(r)
	t.Cleanup(func() { tr.Close() })
	return tr, r
}

func freeAddrPort(t *testing.T) netip.AddrPort { return rafttest.FreeAddr(t) }

// TestBadPacketsNeverReachRaft sends, from the peer's own address and from a stranger's,
// one packet per refusal reason and one good heartbeat: only the heartbeat is stepped, every
// other packet is counted under its reason.
func TestBadPacketsNeverReachRaft(t *testing.T) {
	a1, a2 := freeAddrPort(t), freeAddrPort(t)
	// Node 1 is played by a raw socket bound to its address.
	sock, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(a1))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	tr, rec := newNode(t, 2, []Peer{{1, a1}, {2, a2}})

	hb := func(from, to uint64) []byte {
		p, err := wire.Encode(make([]byte, wire.PktLen), cluster, &pb.Message{Type: pb.MsgHeartbeat.Enum(),
			From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(3), Commit: proto.Uint64(5)})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign, err := wire.Encode(make([]byte, wire.PktLen), cluster+1, &pb.Message{Type: pb.MsgHeartbeat.Enum(),
		From: proto.Uint64(1), To: proto.Uint64(2)})
	if err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		conn   *net.UDPConn
		p      []byte
		reason wire.Reason
	}{
		{sock, hb(1, 2)[:50], wire.DropShort},
		{sock, append(hb(1, 2), 0), wire.DropLong},
		{sock, foreign, wire.DropCluster},
		{sock, hb(1, 3), wire.DropTo},
		{sock, hb(7, 2), wire.DropPeer},     // unknown sender id
		{stranger, hb(1, 2), wire.DropPeer}, // right id, wrong source address
	}
	dst := net.UDPAddrFromAddrPort(a2)
	for _, b := range bad {
		if _, err := b.conn.WriteToUDP(b.p, dst); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sock.WriteToUDP(hb(1, 2), dst); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the good heartbeat", func() bool { return len(rec.got()) == 1 })
	want := map[wire.Reason]float64{}
	for _, b := range bad {
		want[b.reason]++
	}
	waitUntil(t, "every drop counted", func() bool {
		for r, n := range want {
			if tr.Dropped(r.String()) != n {
				return false
			}
		}
		return true
	})
	time.Sleep(50 * time.Millisecond) // nothing else may arrive late
	if got := rec.got(); len(got) != 1 || got[0].GetType() != pb.MsgHeartbeat || got[0].GetFrom() != 1 || got[0].GetCommit() != 5 {
		t.Fatalf("stepped %v, want only the good heartbeat", got)
	}
	if tr.LastHeard(1).IsZero() {
		t.Error("LastHeard(1) not set by the good heartbeat")
	}
}

// TestBulkAndUDPDelivery: two real transports; small messages go by UDP, appends with
// entries and snapshots by TCP, all arrive intact; a snapshot send is reported finished.
func TestBulkAndUDPDelivery(t *testing.T) {
	peers := []Peer{{1, freeAddrPort(t)}, {2, freeAddrPort(t)}}
	t1, r1 := newNode(t, 1, peers)
	t2, r2 := newNode(t, 2, peers)
	_ = t2
	msgs := []*pb.Message{
		{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1)},
		{Type: pb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1),
			Entries: []*pb.Entry{{Index: proto.Uint64(1), Term: proto.Uint64(1), Data: make([]byte, 100000)}}},
		{Type: pb.MsgSnap.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1),
			Snapshot: &pb.Snapshot{Data: make([]byte, 3<<20), Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(10), Term: proto.Uint64(1)}}},
		{Type: pb.MsgVote.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(2)},
	}
	t1.Send(msgs)
	waitUntil(t, "all four messages", func() bool { return len(r2.got()) == 4 })
	for _, want := range msgs {
		found := false
		for _, m := range r2.got() {
			if proto.Equal(m, want) || (m.GetType() == want.GetType() && len(m.GetEntries()) == len(want.GetEntries()) &&
				len(m.GetSnapshot().GetData()) == len(want.GetSnapshot().GetData())) {
				found = true
			}
		}
		if !found {
			t.Errorf("%v did not arrive intact", want.GetType())
		}
	}
	waitUntil(t, "snapshot reported", func() bool {
		r1.mu.Lock()
		defer r1.mu.Unlock()
		return len(r1.snap) == 1 && r1.snap[0] == raft.SnapshotFinish
	})
	if v := counterValue(t1.m.sent.WithLabelValues("udp", "MsgHeartbeat")); v != 1 {
		t.Errorf("heartbeats sent by udp: %v", v)
	}
	if v := counterValue(t1.m.sent.WithLabelValues("tcp", "MsgApp")); v != 1 {
		t.Errorf("appends sent by tcp: %v", v)
	}
}

// TestBadBulkConnections: a wrong hello, a frame over the limit and a frame claiming another
// sender close the connection, are counted, and deliver nothing.
func TestBadBulkConnections(t *testing.T) {
	a1, a2 := freeAddrPort(t), freeAddrPort(t)
	tr, rec := newNode(t, 2, []Peer{{1, a1}, {2, a2}})
	frame := func(kind byte, n int) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(n+1))
		return append(b, kind)
	}
	body, _ := proto.Marshal(&pb.Message{Type: pb.MsgApp.Enum(), From: proto.Uint64(3), To: proto.Uint64(2)})
	cases := []struct {
		name   string
		send   []byte
		reason string
	}{
		{"foreign hello", wire.Hello(cluster+1, 1, false), reasonBulkHello},
		{"unknown peer", wire.Hello(cluster, 5, false), reasonBulkHello},
		{"oversized frame", append(wire.Hello(cluster, 1, false), frame(kindMessage, wire.BulkMax+1)...), reasonBulkSize},
		{"wrong sender", append(append(wire.Hello(cluster, 1, false), frame(kindMessage, len(body))...), body...), reasonBulkPeer},
	}
	for _, c := range cases {
		conn, err := net.Dial("tcp", a2.String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(c.send)
		// The node closes the connection: the read ends.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Errorf("%s: connection not closed", c.name)
		}
		conn.Close()
	}
	want := map[string]float64{reasonBulkHello: 2, reasonBulkSize: 1, reasonBulkPeer: 1}
	waitUntil(t, "bulk drops counted", func() bool {
		for r, n := range want {
			if tr.Dropped(r) != n {
				return false
			}
		}
		return true
	})
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("stepped %v from bad connections", got)
	}
}

// TestKeyedTransport: with a cluster key, two transports talk; a sender at the right address
// with an unsigned, a tampered, a replayed or another key's packet reaches no Step and is
// counted under its reason; a node with another key is not heard.
func TestKeyedTransport(t *testing.T) {
	key, other := wire.Key{1, 2, 3}, wire.Key{9}
	a1, a2, a3 := freeAddrPort(t), freeAddrPort(t), freeAddrPort(t)
	sock, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(a3))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	peers := []Peer{{1, a1}, {2, a2}, {3, a3}}
	t1, _ := newKeyedNode(t, 1, peers, &key)
	t2, r2 := newKeyedNode(t, 2, peers, &key)

	t1.Send([]*pb.Message{{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(4)}})
	waitUntil(t, "the signed heartbeat", func() bool { return len(r2.got()) == 1 })

	hb := func(k *wire.Key) []byte {
		p, err := wire.Encode(make([]byte, wire.PktLen), cluster, &pb.Message{Type: pb.MsgHeartbeat.Enum(),
			From: proto.Uint64(3), To: proto.Uint64(2), Term: proto.Uint64(4)})
		if err != nil {
			t.Fatal(err)
		}
		wire.NewSigner(k).Sign(p)
		return p
	}
	good := hb(&key)
	tampered := hb(&key)
	tampered[40] ^= 1 // log_term
	bad := []struct {
		p      []byte
		reason wire.Reason
	}{
		{hb(nil), wire.DropMAC},
		{hb(&other), wire.DropMAC},
		{tampered, wire.DropMAC},
		{good, wire.OK},
		{good, wire.DropReplay},
	}
	dst := net.UDPAddrFromAddrPort(a2)
	for _, b := range bad {
		if _, err := sock.WriteToUDP(b.p, dst); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "drops counted", func() bool {
		return t2.Dropped("mac") == 3 && t2.Dropped("replay") == 1
	})
	waitUntil(t, "the good packet", func() bool { return len(r2.got()) == 2 })

	// A node with another key: its heartbeat is dropped as "mac".
	t3 := func() *Transport {
		sock.Close()
		tr, _ := newKeyedNode(t, 3, peers, &other)
		return tr
	}()
	t3.Send([]*pb.Message{{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(3), To: proto.Uint64(2), Term: proto.Uint64(4)}})
	waitUntil(t, "other key's heartbeat dropped", func() bool { return t2.Dropped("mac") == 4 })
	if got := r2.got(); len(got) != 2 {
		t.Fatalf("stepped %d messages, want 2", len(got))
	}
}

// TestKeyedBulk: with a cluster key, bulk messages and snapshots travel over the
// authenticated handshake and tagged frames; a dialler without the key, one that sends an
// unkeyed hello, and a keyed connection with a tampered frame deliver nothing and are
// counted; a node with another key cannot send to the cluster over TCP either.
func TestKeyedBulk(t *testing.T) {
	key, other := wire.Key{7, 7, 7}, wire.Key{8}
	a1, a2, a3 := freeAddrPort(t), freeAddrPort(t), freeAddrPort(t)
	peers := []Peer{{1, a1}, {2, a2}, {3, a3}}
	t1, _ := newKeyedNode(t, 1, peers, &key)
	t2, r2 := newKeyedNode(t, 2, peers, &key)
	big := &pb.Message{Type: pb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1),
		Entries: []*pb.Entry{{Index: proto.Uint64(1), Term: proto.Uint64(1), Data: make([]byte, 200000)}}}
	t1.Send([]*pb.Message{big, big})
	waitUntil(t, "two keyed appends", func() bool { return len(r2.got()) == 2 })

	// Raw connections from 127.0.0.1 as node 1 (its address: the transport checks the IP).
	body, _ := proto.Marshal(&pb.Message{Type: pb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2)})
	hdr := binary.BigEndian.AppendUint32(nil, uint32(len(body)+1))
	hdr = append(hdr, kindMessage)
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", a2.String())
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	closed := func(name string, conn net.Conn) {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			if _, err := conn.Read(make([]byte, 64)); err != nil {
				return
			}
		}
	}
	// 1: an unkeyed hello.
	conn := dial()
	conn.Write(append(append(wire.Hello(cluster, 1, false), hdr...), body...))
	closed("unkeyed", conn)
	conn.Close()
	// 2: a keyed hello from someone without the key: the acceptor's tag cannot be
	// checked by it, and the tag it makes up is wrong.
	conn = dial()
	hello := wire.Hello(cluster, 1, true)
	conn.Write(append(slices.Clone(hello), make([]byte, wire.NonceLen)...))
	resp := make([]byte, wire.NonceLen+wire.TagLen)
	if _, err := io.ReadFull(conn, resp); err != nil {
		t.Fatalf("keyed hello: no handshake answer: %v", err)
	}
	hs := wire.NewBulkHandshake(&other, hello, make([]byte, wire.NonceLen), resp[:wire.NonceLen])
	conn.Write(hs.DialTag[:])
	closed("wrong key", conn)
	conn.Close()
	// 3: the right handshake, then a frame whose tag does not match (body altered).
	conn = dial()
	conn.Write(append(slices.Clone(hello), make([]byte, wire.NonceLen)...))
	if _, err := io.ReadFull(conn, resp); err != nil {
		t.Fatal(err)
	}
	hs = wire.NewBulkHandshake(&key, hello, make([]byte, wire.NonceLen), resp[:wire.NonceLen])
	if !wire.EqualTag(hs.AcceptTag, resp[wire.NonceLen:]) {
		t.Fatal("the node's handshake tag does not verify with the cluster key")
	}
	conn.Write(hs.DialTag[:])
	fa := hs.FrameAuth()
	tag := fa.Tag(hdr, body)
	altered := slices.Clone(body)
	altered[len(altered)-1] ^= 1
	conn.Write(append(append(slices.Clone(hdr), altered...), tag[:]...))
	closed("tampered frame", conn)
	conn.Close()
	waitUntil(t, "bulk drops counted", func() bool {
		return t2.Dropped(reasonBulkHello) == 1 && t2.Dropped(reasonBulkMAC) == 2
	})

	// A node with another key: its dial fails the handshake (it cannot verify node 2); it
	// dials ahead of its message too, and again after each failure, so at least once.
	t3, _ := newKeyedNode(t, 3, peers, &other)
	t3.Send([]*pb.Message{{Type: pb.MsgApp.Enum(), From: proto.Uint64(3), To: proto.Uint64(2), Term: proto.Uint64(1),
		Entries: []*pb.Entry{{Index: proto.Uint64(1), Term: proto.Uint64(1)}}}})
	waitUntil(t, "other key's dial refused", func() bool { return t2.Dropped(reasonBulkMAC) >= 3 })
	if got := r2.got(); len(got) != 2 {
		t.Fatalf("stepped %d messages, want the 2 keyed appends", len(got))
	}
}

// TestBulkPeerRestart: a peer that restarts closes the bulk connection; the next message
// goes over a new one instead of into the dead one (where a write still succeeds and the
// message is lost: a new leader's first append after a failover, seen as 10-20 ms of
// "commit" in bench raft's failover phases).
func TestBulkPeerRestart(t *testing.T) {
	peers := []Peer{{1, freeAddrPort(t)}, {2, freeAddrPort(t)}}
	t1, _ := newNode(t, 1, peers)
	t2, r2 := newNode(t, 2, peers)
	app := func(i uint64) *pb.Message {
		return &pb.Message{Type: pb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1),
			Entries: []*pb.Entry{{Index: proto.Uint64(i), Term: proto.Uint64(1), Data: []byte("x")}}}
	}
	t1.Send([]*pb.Message{app(1)})
	waitUntil(t, "the first append", func() bool { return len(r2.got()) == 1 })
	t2.Close()
	closed := t1.m.peerClosed.WithLabelValues("2")
	waitUntil(t, "the peer's close seen", func() bool { return counterValue(closed) == 1 })
	_, r2b := newNode(t, 2, peers)
	t1.Send([]*pb.Message{app(2)})
	waitUntil(t, "the append after the restart", func() bool { return len(r2b.got()) == 1 })
	if v := counterValue(t1.m.sendErrors.WithLabelValues("tcp")); v != 0 {
		t.Errorf("tcp send errors: %v, want 0 (the dead connection was not written to)", v)
	}
}

// TestBulkDialsAhead: each node opens its bulk connection to a peer before it has anything
// to send, and again as soon as a restarted peer is back, so that a new leader's first
// append does not wait for a dial and the keyed handshake.
func TestBulkDialsAhead(t *testing.T) {
	peers := []Peer{{1, freeAddrPort(t)}, {2, freeAddrPort(t)}}
	t1, _ := newNode(t, 1, peers)
	t2, _ := newNode(t, 2, peers)
	conns := func(tr *Transport) int {
		tr.connsMu.Lock()
		defer tr.connsMu.Unlock()
		return len(tr.conns)
	}
	// Each holds its own outbound connection and the peer's inbound one.
	waitUntil(t, "both connections open with nothing sent", func() bool { return conns(t1) == 2 && conns(t2) == 2 })
	t2.Close()
	waitUntil(t, "the peer's close seen", func() bool { return conns(t1) == 0 })
	t2b, _ := newNode(t, 2, peers)
	waitUntil(t, "both connections open again after the restart", func() bool { return conns(t1) == 2 && conns(t2b) == 2 })
	if v := counterValue(t1.m.sendErrors.WithLabelValues("tcp")); v != 0 {
		t.Errorf("tcp send errors: %v, want 0 (dials ahead of a message count none)", v)
	}
}

// TestPeerClosed: when a peer's process goes, its sockets close, and the transport reports
// the peer once its last bulk connection (inbound and outbound) has ended by the peer's close
// or reset (Options.PeerClosed) - not for one connection of two, not for its own close, not
// for a peer that never answered. The failover's fast path (pkg/raft/kernelpaths gone.go)
// starts from it.
func TestPeerClosed(t *testing.T) {
	peers := []Peer{{1, freeAddrPort(t)}, {2, freeAddrPort(t)}}
	var mu sync.Mutex
	var heard []uint64
	tr, err := New(Options{ClusterID: cluster, Self: 1, Bind: peers[0].Addr.String(), Peers: peers[1:],
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		PeerClosed: func(id uint64) { mu.Lock(); heard = append(heard, id); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	tr.Start(&recorder{})
	got := func() []uint64 { mu.Lock(); defer mu.Unlock(); return slices.Clone(heard) }
	live := func() int { p := tr.peers[2]; p.liveMu.Lock(); defer p.liveMu.Unlock(); return p.live }

	t2, _ := newNode(t, 2, peers)
	waitUntil(t, "both connections with the peer open", func() bool { return live() == 2 })
	t2.Close()
	waitUntil(t, "the peer reported gone", func() bool { return len(got()) > 0 })
	// A restarted peer is seen again; the dials that found it down in between reported nothing.
	_, _ = newNode(t, 2, peers)
	waitUntil(t, "both connections open again", func() bool { return live() == 2 })
	if g := got(); !slices.Equal(g, []uint64{2}) {
		t.Errorf("PeerClosed calls %v, want [2] (once, for the closed peer)", g)
	}
	// The rule itself: one connection of two ending reports nothing; the last one ending by
	// this node's own close reports nothing.
	p := tr.peers[2]
	p.liveMu.Lock()
	p.live += 2 // two more, as if open
	p.liveMu.Unlock()
	tr.connDown(p, true)
	tr.connDown(p, false)
	if g := got(); len(g) != 1 {
		t.Errorf("PeerClosed calls %v after connections ended with others open: want none new", g)
	}
	tr.Close()
	if g := got(); len(g) != 1 {
		t.Errorf("PeerClosed calls %v after this node's own close: want none new", g)
	}
}
