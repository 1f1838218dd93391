// Package transport carries etcd-raft messages between kedge raft nodes: small, frequent
// messages as one fixed-size UDP packet each (internal/raft/wire, bpf/include/raft.h), the
// rest as length-prefixed protobuf frames over one TCP connection per peer. docs/raft.md
// section 3 is the specification, including the drop policy: a packet or frame that fails a
// check is counted, logged (rate-limited) and never reaches raft.
package transport

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Frame kinds of the TCP bulk transport.
const (
	kindMessage  = 0
	kindSnapshot = 1
	frameHeader  = 5 // 4-byte length of kind+message, 1-byte kind
)

const (
	sendQueue        = 1024            // per-peer TCP send queue (messages)
	dialTimeout      = time.Second     //
	writeTimeout     = 5 * time.Second // per frame; snapshots get snapWriteTimeout
	snapWriteTimeout = 60 * time.Second
	helloTimeout     = 5 * time.Second
	redialMin        = 50 * time.Millisecond
	redialMax        = time.Second
	logEvery         = 10 * time.Second // at most one drop log line per reason per interval
)

// Bulk drop reasons (beyond wire.Reason's).
const (
	reasonBulkHello  = "bulk_hello"
	reasonBulkSize   = "bulk_size"
	reasonBulkDecode = "bulk_decode"
	reasonBulkPeer   = "bulk_peer"
	reasonBulkMAC    = "bulk_mac" // keyed cluster: handshake or frame tag wrong
)

// Raft is what the transport needs from the node.
type Raft interface {
	Step(ctx context.Context, m *pb.Message) error
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, status raft.SnapshotStatus)
}

// Peer is a remote node.
type Peer struct {
	ID   uint64
	Addr netip.AddrPort // raft address: UDP and TCP
}

// Options configure a transport.
type Options struct {
	ClusterID uint64
	Self      uint64
	Bind      string // host:port for UDP and TCP
	Peers     []Peer // the other nodes (self excluded)
	// Key is the cluster key (nil: none): every UDP packet sent carries a MAC, and every one
	// received must carry a valid one inside its sender's replay window (wire.Verifier) -
	// the checks the XDP program makes, so the behaviour is the same with offload off.
	Key      *wire.Key
	Log      *slog.Logger
	Registry prometheus.Registerer // nil: metrics are not registered
	// PeerClosed (nil: none) is called when the last open bulk connection with a peer -
	// its inbound one and this node's outbound one - ends because the peer closed or reset
	// it (EOF, RST), not because of a timeout or this node's own close: the peer's process
	// is most likely gone (a killed process's sockets close at once). Called from the
	// transport's goroutines; it must not block.
	PeerClosed func(peer uint64)
}

// Transport is one node's endpoint.
type Transport struct {
	opts    Options
	peers   map[uint64]*peer
	udp     *net.UDPConn
	ln      net.Listener
	raft    Raft
	m       *metrics
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	limiter dropLogger
	signer  *wire.Signer
	recv    wire.Receiver
	key     *wire.Key // nil: the cluster has no key

	connsMu sync.Mutex
	conns   map[net.Conn]struct{}
}

type peer struct {
	Peer
	queue     chan *pb.Message
	lastHeard atomic.Int64 // unix nanos of the last message received from this peer
	lastBeat  atomic.Int64 // unix nanos of the last MsgHeartbeat received from this peer

	liveMu sync.Mutex
	live   int // open bulk connections with this peer, both directions (connUp, connDown)
}

// connUp counts an open bulk connection with p (inbound after its hello, outbound after
// its handshake).
func (t *Transport) connUp(p *peer) {
	p.liveMu.Lock()
	p.live++
	p.liveMu.Unlock()
}

// connDown counts one of p's connections ended, byPeer when p closed or reset it; when that
// was the last one open, Options.PeerClosed hears of it.
func (t *Transport) connDown(p *peer, byPeer bool) {
	p.liveMu.Lock()
	p.live--
	last := p.live == 0
	p.liveMu.Unlock()
	if last && byPeer && t.opts.PeerClosed != nil && t.ctx.Err() == nil {
		t.m.peerGone.WithLabelValues(strconv.FormatUint(p.ID, 10)).Inc()
		t.opts.PeerClosed(p.ID)
	}
}

// endedByPeer reports whether a read error means the peer closed or reset the connection
// (not this node's own close, nor a timeout).
func endedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// New binds the UDP socket and the TCP listener; Start begins delivering to r.
func New(opts Options) (*Transport, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	t := &Transport{opts: opts, peers: map[uint64]*peer{}, log: opts.Log, conns: map[net.Conn]struct{}{}}
	for _, p := range opts.Peers {
		t.peers[p.ID] = &peer{Peer: p, queue: make(chan *pb.Message, sendQueue)}
	}
	t.m = newMetrics(opts.Registry)
	if opts.Key != nil && *opts.Key != (wire.Key{}) {
		t.key = opts.Key
	}
	t.signer = wire.NewSigner(opts.Key)
	t.recv = wire.Receiver{Cluster: opts.ClusterID, Self: opts.Self, Peers: map[uint64]netip.AddrPort{},
		Verifier: wire.NewVerifier(opts.Key)}
	for _, p := range opts.Peers {
		t.recv.Peers[p.ID] = p.Addr
	}
	if opts.Registry != nil {
		v := t.recv.Verifier
		opts.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
			Name: "transport_pass_marked_total",
			Help: "UDP packets accepted by the follower program's pass mark: their MAC was verified in XDP and not again in user space."},
			func() float64 { return float64(v.Marked.Load()) }))
	}
	t.limiter.log = opts.Log
	ua, err := net.ResolveUDPAddr("udp", opts.Bind)
	if err != nil {
		return nil, fmt.Errorf("resolve raft address: %w", err)
	}
	if t.udp, err = net.ListenUDP("udp", ua); err != nil {
		return nil, fmt.Errorf("listen raft udp %s: %w (is another node using the port?)", opts.Bind, err)
	}
	if t.ln, err = net.Listen("tcp", opts.Bind); err != nil {
		t.udp.Close()
		return nil, fmt.Errorf("listen raft tcp %s: %w (is another node using the port?)", opts.Bind, err)
	}
	return t, nil
}

// Start runs the receivers and the per-peer senders until Close.
func (t *Transport) Start(r Raft) {
	t.raft = r
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.wg.Add(2)
	go t.readUDP()
	go t.accept()
	for _, p := range t.peers {
		t.wg.Add(1)
		go t.sendLoop(p)
	}
}

// Close stops everything and waits for the goroutines.
func (t *Transport) Close() error {
	if t.cancel != nil {
		t.cancel()
	}
	t.udp.Close()
	t.ln.Close()
	t.connsMu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.connsMu.Unlock()
	t.wg.Wait()
	return nil
}

// LastHeard returns when a message from peer id was last accepted (zero: never).
func (t *Transport) LastHeard(id uint64) time.Time {
	p := t.peers[id]
	if p == nil {
		return time.Time{}
	}
	return unixTime(p.lastHeard.Load())
}

// LastHeartbeat returns when a MsgHeartbeat from peer id was last accepted (zero: never).
func (t *Transport) LastHeartbeat(id uint64) time.Time {
	p := t.peers[id]
	if p == nil {
		return time.Time{}
	}
	return unixTime(p.lastBeat.Load())
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Send hands messages to the wire; it never blocks on the network. Call it only after the
// Ready that produced them was persisted. The appends and acknowledgements of the batch to
// one peer are coalesced first (coalesce).
func (t *Transport) Send(msgs []*pb.Message) {
	var buf [wire.PktLen]byte
	msgs, folded := coalesce(msgs)
	if folded > 0 {
		t.m.coalesced.Add(float64(folded))
	}
	for _, m := range msgs {
		p := t.peers[m.GetTo()]
		if p == nil {
			t.log.Warn("raft transport: message to unknown node dropped", "to", m.GetTo(), "type", m.GetType())
			continue
		}
		if wire.FitsUDP(m) {
			pkt, err := wire.Encode(buf[:], t.opts.ClusterID, m)
			if err == nil {
				t.signer.Sign(pkt)
				_, err = t.udp.WriteToUDPAddrPort(pkt, p.Addr)
			}
			if err != nil {
				t.m.sendErrors.WithLabelValues("udp").Inc()
				t.log.Debug("raft transport: udp send", "to", p.ID, "err", err)
				continue
			}
			t.m.sent.WithLabelValues("udp", m.GetType().String()).Inc()
			continue
		}
		select {
		case p.queue <- m:
		default:
			t.m.sendDropped.WithLabelValues(strconv.FormatUint(p.ID, 10)).Inc()
			t.raft.ReportUnreachable(p.ID)
			if m.GetType() == pb.MsgSnap {
				t.raft.ReportSnapshot(p.ID, raft.SnapshotFailure)
			}
		}
	}
}

func (t *Transport) readUDP() {
	defer t.wg.Done()
	buf := make([]byte, 2048)
	for {
		n, src, err := t.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn("raft transport: udp read", "err", err)
			continue
		}
		m, reason := t.recv.Receive(buf[:n], src)
		if reason != wire.OK {
			t.drop(reason.String(), "udp", src.String(), n)
			continue
		}
		t.deliver("udp", m)
	}
}

func (t *Transport) deliver(transport string, m *pb.Message) {
	now := time.Now().UnixNano()
	p := t.peers[m.GetFrom()]
	p.lastHeard.Store(now)
	if m.GetType() == pb.MsgHeartbeat {
		p.lastBeat.Store(now)
	}
	t.m.received.WithLabelValues(transport, m.GetType().String()).Inc()
	if err := t.raft.Step(t.ctx, m); err != nil && t.ctx.Err() == nil {
		t.log.Debug("raft transport: step", "type", m.GetType(), "from", m.GetFrom(), "err", err)
	}
}

func (t *Transport) drop(reason, transport, src string, n int) {
	t.m.dropped.WithLabelValues(reason).Inc()
	t.limiter.note(reason, transport, src, n)
}

func (t *Transport) track(c net.Conn, add bool) bool {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	if !add {
		delete(t.conns, c)
		return true
	}
	if t.ctx.Err() != nil {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *Transport) accept() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn("raft transport: accept", "err", err)
			time.Sleep(10 * time.Millisecond) // EMFILE and friends: do not spin
			continue
		}
		if !t.track(c, true) {
			c.Close()
			return
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer t.track(c, false)
			defer c.Close()
			t.serveConn(c)
		}()
	}
}

// serveConn reads one inbound bulk connection: hello, then frames.
func (t *Transport) serveConn(c net.Conn) {
	src := c.RemoteAddr().String()
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	hello := make([]byte, wire.HelloLen)
	if _, err := io.ReadFull(c, hello); err != nil {
		t.drop(reasonBulkHello, "tcp", src, 0)
		return
	}
	from, reason := wire.ParseHello(hello, t.opts.ClusterID, t.key != nil)
	p := t.peers[from]
	if reason == wire.OK && (p == nil || p.Addr.Addr() != remoteIP(c)) {
		reason = wire.DropPeer
	}
	if reason != wire.OK {
		t.drop(reasonBulkHello, "tcp", src+" ("+reason.String()+")", len(hello))
		return
	}
	var auth *wire.FrameAuth
	if t.key != nil {
		if auth = t.acceptHandshake(c, hello); auth == nil {
			t.drop(reasonBulkMAC, "tcp", src+" (handshake)", len(hello))
			return
		}
	}
	c.SetReadDeadline(time.Time{})
	t.connUp(p)
	byPeer := false
	defer func() { t.connDown(p, byPeer) }()
	r := bufio.NewReaderSize(c, 64<<10)
	var hdr [frameHeader]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			byPeer = endedByPeer(err) // or we are closing
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:])) - 1
		kind := hdr[4]
		limit := wire.BulkMax
		if kind == kindSnapshot {
			limit = wire.SnapMax
		}
		if n < 0 || n > limit || kind > kindSnapshot {
			t.drop(reasonBulkSize, "tcp", src, n)
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if auth != nil {
			var tag [wire.TagLen]byte
			if _, err := io.ReadFull(r, tag[:]); err != nil {
				return
			}
			if !auth.Check(hdr[:], body, tag[:]) {
				t.drop(reasonBulkMAC, "tcp", src, n)
				return
			}
		}
		m := &pb.Message{}
		if err := proto.Unmarshal(body, m); err != nil || (m.GetType() == pb.MsgSnap) != (kind == kindSnapshot) {
			t.drop(reasonBulkDecode, "tcp", src, n)
			return
		}
		if m.GetFrom() != from || m.GetTo() != t.opts.Self {
			t.drop(reasonBulkPeer, "tcp", src, n)
			return
		}
		t.deliver("tcp", m)
	}
}

// acceptHandshake runs the acceptor's side of the keyed handshake (wire/bulkauth.go) after
// the hello: the dialler's nonce in, a fresh nonce and the acceptor's tag out, the
// dialler's tag in. nil: it failed.
func (t *Transport) acceptHandshake(c net.Conn, hello []byte) *wire.FrameAuth {
	nonceD := make([]byte, wire.NonceLen)
	if _, err := io.ReadFull(c, nonceD); err != nil {
		return nil
	}
	nonceA := make([]byte, wire.NonceLen)
	if _, err := rand.Read(nonceA); err != nil {
		return nil
	}
	hs := wire.NewBulkHandshake(t.key, hello, nonceD, nonceA)
	c.SetWriteDeadline(time.Now().Add(helloTimeout))
	if _, err := c.Write(append(nonceA, hs.AcceptTag[:]...)); err != nil {
		return nil
	}
	tag := make([]byte, wire.TagLen)
	if _, err := io.ReadFull(c, tag); err != nil || !wire.EqualTag(hs.DialTag, tag) {
		return nil
	}
	return hs.FrameAuth()
}

// dialHandshake is the dialler's side: hello and nonce out, the acceptor's nonce and tag
// in (checked: a node without the key cannot pose as the peer), the dialler's tag out.
func (t *Transport) dialHandshake(c net.Conn) (*wire.FrameAuth, error) {
	hello := wire.Hello(t.opts.ClusterID, t.opts.Self, t.key != nil)
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if t.key == nil {
		_, err := c.Write(hello)
		return nil, err
	}
	nonceD := make([]byte, wire.NonceLen)
	if _, err := rand.Read(nonceD); err != nil {
		return nil, fmt.Errorf("bulk handshake nonce: %w", err)
	}
	if _, err := c.Write(append(slices.Clone(hello), nonceD...)); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	resp := make([]byte, wire.NonceLen+wire.TagLen)
	if _, err := io.ReadFull(c, resp); err != nil {
		return nil, fmt.Errorf("bulk handshake: %w", err)
	}
	c.SetReadDeadline(time.Time{})
	hs := wire.NewBulkHandshake(t.key, hello, nonceD, resp[:wire.NonceLen])
	if !wire.EqualTag(hs.AcceptTag, resp[wire.NonceLen:]) {
		return nil, errors.New("bulk handshake: the peer did not prove the cluster key")
	}
	if _, err := c.Write(hs.DialTag[:]); err != nil {
		return nil, err
	}
	return hs.FrameAuth(), nil
}

func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// sendLoop owns the outbound bulk connection to p. It keeps one open whether or not there
// is anything to send: dialled at start and again as soon as the peer closes it, retried
// with a back-off of its own while the peer refuses, so that a message - a new leader's
// first append above all - does not wait for a dial and the keyed handshake (docs/raft.md
// section 3). A message that finds no connection dials at once, as before, unless a
// message's dial failed within the redial back-off.
func (t *Transport) sendLoop(p *peer) {
	defer t.wg.Done()
	var (
		c        net.Conn
		w        *bufio.Writer
		auth     *wire.FrameAuth
		broken   chan struct{} // closed when the peer closed or reset the connection
		nextDial time.Time     // a message's dial failed: the next message dials after this
		backoff  = redialMin   // the messages' redial back-off
		ahead    = redialMin   // the dials ahead of any message: their back-off
		redial   = time.NewTimer(0)
	)
	defer redial.Stop()
	closeConn := func() {
		if c != nil {
			t.track(c, false)
			c.Close()
			c, w, auth = nil, nil, nil
		}
	}
	defer closeConn()
	fail := func(m *pb.Message, err error) {
		t.m.sendErrors.WithLabelValues("tcp").Inc()
		t.log.Debug("raft transport: tcp send", "to", p.ID, "err", err)
		closeConn()
		redial.Reset(0)
		t.raft.ReportUnreachable(p.ID)
		if m.GetType() == pb.MsgSnap {
			t.raft.ReportSnapshot(p.ID, raft.SnapshotFailure)
		}
	}
	// dial opens the connection; stop: the transport is closing.
	dial := func() (stop bool, err error) {
		d := net.Dialer{Timeout: dialTimeout}
		conn, err := d.DialContext(t.ctx, "tcp", p.Addr.String())
		if err == nil {
			if auth, err = t.dialHandshake(conn); err != nil {
				conn.Close()
			}
		}
		if err != nil {
			return false, err
		}
		if !t.track(conn, true) {
			conn.Close()
			return true, nil
		}
		c, w, backoff, ahead = conn, bufio.NewWriterSize(conn, 64<<10), redialMin, redialMin
		broken = make(chan struct{})
		t.connUp(p)
		t.wg.Add(1)
		go t.watchConn(conn, broken, p)
		return false, nil
	}
	for {
		var m *pb.Message
		var gone <-chan struct{} // nil while there is no connection
		if c != nil {
			gone = broken
		}
		select {
		case <-t.ctx.Done():
			return
		case m = <-p.queue:
		case <-gone:
			// The peer went away (a restarted process, a closed socket): a write would
			// still succeed into the dead connection and the message be lost. Redial now.
			closeConn()
			redial.Reset(0)
			continue
		case <-redial.C:
			if c == nil {
				stop, err := dial()
				if stop {
					return
				}
				if err != nil {
					t.log.Debug("raft transport: tcp dial ahead", "to", p.ID, "err", err)
					redial.Reset(ahead)
					ahead = min(2*ahead, redialMax)
				}
			}
			continue
		}
		if c != nil {
			select {
			case <-broken:
				closeConn()
			default:
			}
		}
		if c == nil {
			if time.Now().Before(nextDial) {
				fail(m, errors.New("peer unreachable, waiting to redial"))
				continue
			}
			stop, err := dial()
			if stop {
				return
			}
			if err != nil {
				nextDial = time.Now().Add(backoff)
				backoff = min(2*backoff, redialMax)
				fail(m, err)
				continue
			}
		}
		if err := t.writeFrame(c, w, m, auth); err != nil {
			fail(m, err)
			continue
		}
		// Batch: flush when nothing else is waiting.
		if len(p.queue) == 0 {
			if err := w.Flush(); err != nil {
				fail(m, err)
				continue
			}
		}
		if m.GetType() == pb.MsgSnap {
			if err := w.Flush(); err != nil {
				fail(m, err)
				continue
			}
			t.raft.ReportSnapshot(p.ID, raft.SnapshotFinish)
		}
	}
}

// watchConn reads the outbound connection c (the peer sends nothing on it after the
// handshake) until it ends: EOF or a reset means the peer is gone, and broken tells the
// sender before its next write.
func (t *Transport) watchConn(c net.Conn, broken chan struct{}, p *peer) {
	defer t.wg.Done()
	defer close(broken)
	var b [64]byte
	for {
		if _, err := c.Read(b[:]); err != nil {
			ours := errors.Is(err, net.ErrClosed)
			if !ours {
				t.m.peerClosed.WithLabelValues(strconv.FormatUint(p.ID, 10)).Inc()
			}
			t.connDown(p, !ours && endedByPeer(err))
			return
		}
	}
}

func (t *Transport) writeFrame(c net.Conn, w *bufio.Writer, m *pb.Message, auth *wire.FrameAuth) error {
	body, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshal %v: %w", m.GetType(), err)
	}
	kind, limit, timeout := byte(kindMessage), wire.BulkMax, writeTimeout
	if m.GetType() == pb.MsgSnap {
		kind, limit, timeout = kindSnapshot, wire.SnapMax, snapWriteTimeout
	}
	if len(body) > limit {
		return fmt.Errorf("%v of %d bytes exceeds the %d-byte frame limit", m.GetType(), len(body), limit)
	}
	c.SetWriteDeadline(time.Now().Add(timeout))
	var hdr [frameHeader]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(body)+1))
	hdr[4] = kind
	w.Write(hdr[:])
	if _, err := w.Write(body); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	if auth != nil {
		tag := auth.Tag(hdr[:], body)
		if _, err := w.Write(tag[:]); err != nil {
			return fmt.Errorf("write frame tag: %w", err)
		}
	}
	t.m.sent.WithLabelValues("tcp", m.GetType().String()).Inc()
	return nil
}

// dropLogger writes at most one line per reason per logEvery, with the count since.
type dropLogger struct {
	mu   sync.Mutex
	log  *slog.Logger
	last map[string]time.Time
	n    map[string]int
}

func (d *dropLogger) note(reason, transport, src string, size int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last == nil {
		d.last, d.n = map[string]time.Time{}, map[string]int{}
	}
	d.n[reason]++
	now := time.Now()
	if now.Sub(d.last[reason]) < logEvery {
		return
	}
	d.log.Warn("raft transport: dropped bad packet", "reason", reason, "transport", transport, "src", src,
		"bytes", size, "dropped_since_last_line", d.n[reason])
	d.last[reason], d.n[reason] = now, 0
}

type metrics struct {
	sent, received, dropped, sendDropped, sendErrors, peerClosed, peerGone *prometheus.CounterVec
	coalesced                                                              prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft", Name: name, Help: help}, labels)
		if reg != nil {
			reg.MustRegister(c)
		}
		return c
	}
	m := &metrics{
		sent:        cv("transport_sent_total", "Raft messages sent, by transport and message type.", "transport", "type"),
		received:    cv("transport_received_total", "Raft messages received and given to raft, by transport and type.", "transport", "type"),
		dropped:     cv("transport_dropped_total", "Packets and bulk connections refused by the transport's checks, by reason.", "reason"),
		sendDropped: cv("transport_send_dropped_total", "Bulk messages dropped because the peer's send queue was full.", "peer"),
		sendErrors:  cv("transport_send_errors_total", "Send failures (unreachable peer, write error), by transport.", "transport"),
		peerClosed:  cv("transport_bulk_peer_closed_total", "Outbound bulk connections the peer closed or reset (redialled at the next message, none lost into them).", "peer"),
		peerGone:    cv("transport_peer_gone_total", "Times the last open bulk connection with a peer, inbound or outbound, ended by the peer's close or reset (its process most likely gone; Options.PeerClosed).", "peer"),
	}
	m.coalesced = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft", Name: "transport_coalesced_total",
		Help: "Appends and append acknowledgements folded into another one to the same peer before sending (docs/raft.md section 3)."})
	if reg != nil {
		reg.MustRegister(m.coalesced)
	}
	for r := wire.Reason(1); r < wire.ReasonMax; r++ {
		m.dropped.WithLabelValues(r.String())
	}
	for _, r := range []string{reasonBulkHello, reasonBulkSize, reasonBulkDecode, reasonBulkPeer, reasonBulkMAC} {
		m.dropped.WithLabelValues(r)
	}
	return m
}

// SetPassMark makes the UDP receiver accept m in place of a MAC the follower program verified
// (wire.Verifier.SetPassMark): call it before the program is attached.
func (t *Transport) SetPassMark(m wire.Mark) { t.recv.Verifier.SetPassMark(m) }

// Dropped returns the drop counter of a reason (tests).
func (t *Transport) Dropped(reason string) float64 {
	return counterValue(t.m.dropped.WithLabelValues(reason))
}
