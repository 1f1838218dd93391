// Package chaos is the "Deterministic Chaos" benchmark of the hedging capability (thesis
// chapter 4): a UDP server whose stalls depend only on the request id, so every client under
// test meets exactly the same slow requests, and the clients that measure it (baseline,
// app-hedged). It needs no BPF and no lab: give it addresses to bind and send to, on
// loopback or inside a network namespace.
//
// Wire format: a request is a datagram whose first 4 bytes are a big-endian uint32 request id;
// the rest is opaque payload. The response is the request echoed byte for byte, so the id
// is at the same offset.
package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// IDLen is the size of the request id at the start of every datagram.
const IDLen = 4

// maxDatagram bounds what the server reads; longer datagrams are truncated and echoed
// truncated (the benchmark payloads are far smaller).
const maxDatagram = 2048

// Config is the fault model of a server. The zero value is not useful; start from
// DefaultConfig (the thesis's Table 4.1).
type Config struct {
	// StallPct is the percentage (0-100) of ids that stall on first sight at each replica.
	StallPct int
	// Stall is how long a stalled request waits before it is answered.
	Stall time.Duration
	// Fast is how long every other request waits (the normal service time).
	Fast time.Duration
	// TTL is the replay memory: an id seen at a replica less than TTL ago is answered on the
	// fast path there, simulating a hedge that lands on a healthy instance.
	TTL time.Duration
	// MaxEntries caps the replay memory of each replica (0: DefaultMaxEntries). When a
	// generation fills up it is rotated early, so memory stays bounded under any load, at the
	// cost of forgetting ids sooner than TTL (counted in Stats.EarlyRotations).
	MaxEntries int
	// FirstIndex is the replica index of the first address (Stalls): a replica served by
	// another process or host takes its own index, so its stall window is not replica 0's.
	FirstIndex int
}

// DefaultMaxEntries is the replay-memory cap per replica and generation: 2^20 ids is 50 s of
// traffic at 20k req/s, far more than a 1 s TTL needs, and about 40 MiB at worst.
const DefaultMaxEntries = 1 << 20

// DefaultConfig is the thesis setting: 2% of ids stall 400 ms, others take 2 ms, replay
// memory 1 s.
func DefaultConfig() Config {
	return Config{StallPct: 2, Stall: 400 * time.Millisecond, Fast: 2 * time.Millisecond, TTL: time.Second}
}

// Validate checks cfg for n replicas. Stall windows of the replicas must not overlap (see
// Stalls), so (FirstIndex+n)*StallPct must not exceed 100.
func (c Config) Validate(replicas int) error {
	switch {
	case c.StallPct < 0 || c.StallPct > 100:
		return fmt.Errorf("stall percentage %d out of range 0-100", c.StallPct)
	case replicas < 1:
		return errors.New("no replica address given")
	case c.FirstIndex < 0:
		return fmt.Errorf("replica index %d: use 0 or more", c.FirstIndex)
	case (c.FirstIndex+replicas)*c.StallPct > 100:
		if c.FirstIndex > 0 {
			return fmt.Errorf("replicas %d..%d x %d%% stalls exceeds 100%%: a request id would stall on two replicas",
				c.FirstIndex, c.FirstIndex+replicas-1, c.StallPct)
		}
		return fmt.Errorf("%d replicas x %d%% stalls exceeds 100%%: a request id would stall on two replicas", replicas, c.StallPct)
	case c.Stall < 0 || c.Fast < 0:
		return errors.New("negative stall or fast-path delay")
	case c.TTL <= 0:
		return errors.New("replay memory ttl must be positive")
	case c.MaxEntries < 0:
		return errors.New("negative replay memory cap")
	}
	return nil
}

// Stalls reports whether replica r stalls id on first sight: iff (id + r*stallPct) mod 100 <
// stallPct. Replica 0 is the thesis rule (id mod 100 < 2: ids ending in 00 and 01); replica r
// stalls the window of stallPct ids shifted down by r*stallPct (with 2%: replica 1 stalls ids
// ending in 98 and 99, replica 2 those ending in 96 and 97). The windows are disjoint while
// replicas*stallPct <= 100, so a given id stalls on at most one replica and a hedge sent to
// another replica is always fast.
func Stalls(replica int, id uint32, stallPct int) bool {
	return (uint64(id)+uint64(replica)*uint64(stallPct))%100 < uint64(stallPct)
}

// Stats are the counters of one replica.
type Stats struct {
	Addr string `json:"addr"`
	// Requests is every datagram received (including malformed and dropped ones).
	Requests uint64 `json:"requests"`
	// Stalls is requests delayed by Stall (first sight of a stalling id).
	Stalls uint64 `json:"stalls"`
	// Replays is requests whose id was seen within TTL (hedges and retries), served fast.
	Replays uint64 `json:"replays"`
	// ReplaysRescued is the subset of Replays whose id stalls at this replica: the
	// hedges the replay memory rescued.
	ReplaysRescued uint64 `json:"replays_rescued"`
	// Dropped is requests discarded because the replica is in outage.
	Dropped uint64 `json:"dropped"`
	// Malformed is datagrams shorter than the id.
	Malformed uint64 `json:"malformed"`
	// Responses is responses sent; SendErrors those the socket refused.
	Responses  uint64 `json:"responses"`
	SendErrors uint64 `json:"send_errors"`
	// EarlyRotations counts replay-memory generations rotated before TTL because they
	// reached MaxEntries.
	EarlyRotations uint64 `json:"early_rotations"`
}

// Server serves one or more replicas, one UDP socket each, with a replay memory per replica.
type Server struct {
	cfg      Config
	replicas []*replica
	closeMu  sync.Once
	wg       sync.WaitGroup // read loops
}

type replica struct {
	index  int
	conn   *net.UDPConn
	cfg    Config
	outage atomic.Bool
	mem    *replayMemory
	resp   *responder // set by Serve

	requests, stalls, replays, rescued, dropped, malformed, responses, sendErrs atomic.Uint64
}

// Listen binds one UDP socket per address; replica i is addrs[i]. Port 0 picks a free port
// (see Addrs). The sockets are open when Listen returns: requests sent before Serve starts
// wait in the socket buffer.
func Listen(cfg Config, addrs []string) (*Server, error) {
	if err := cfg.Validate(len(addrs)); err != nil {
		return nil, fmt.Errorf("configure chaos server: %w", err)
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	s := &Server{cfg: cfg}
	for i, a := range addrs {
		ua, err := net.ResolveUDPAddr("udp", a)
		if err != nil {
			s.closeConns()
			return nil, fmt.Errorf("resolve replica address %q: %w", a, err)
		}
		c, err := net.ListenUDP("udp", ua)
		if err != nil {
			s.closeConns()
			return nil, fmt.Errorf("listen on %s: %w", a, err)
		}
		// A burst of requests at 20k req/s must not overflow the default socket buffer;
		// the kernel caps this at net.core.rmem_max, which is fine.
		_ = c.SetReadBuffer(4 << 20)
		_ = c.SetWriteBuffer(4 << 20)
		if err := enableRxTimestamps(c); err != nil {
			slog.Debug("no kernel receive timestamps: service time counts from the read", "addr", a, "err", err)
		}
		s.replicas = append(s.replicas, &replica{index: cfg.FirstIndex + i, conn: c, cfg: cfg, mem: newReplayMemory(cfg.TTL, cfg.MaxEntries)})
	}
	return s, nil
}

// Addrs are the bound addresses, in replica order.
func (s *Server) Addrs() []netip.AddrPort {
	out := make([]netip.AddrPort, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = r.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	return out
}

// SetOutage puts replica i into a full outage (every request dropped, scenario (c)) or
// takes it out of it. It can be called while serving.
func (s *Server) SetOutage(i int, down bool) error {
	if i < 0 || i >= len(s.replicas) {
		return fmt.Errorf("set outage: no replica %d (have %d)", i, len(s.replicas))
	}
	s.replicas[i].outage.Store(down)
	return nil
}

// Stats returns the counters of every replica, in replica order.
func (s *Server) Stats() []Stats {
	out := make([]Stats, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = Stats{
			Addr:           r.conn.LocalAddr().String(),
			Requests:       r.requests.Load(),
			Stalls:         r.stalls.Load(),
			Replays:        r.replays.Load(),
			ReplaysRescued: r.rescued.Load(),
			Dropped:        r.dropped.Load(),
			Malformed:      r.malformed.Load(),
			Responses:      r.responses.Load(),
			SendErrors:     r.sendErrs.Load(),
			EarlyRotations: r.mem.earlyRotations.Load(),
		}
	}
	return out
}

// Serve answers requests until ctx is done, then closes the sockets and waits for the read
// loops to end. Responses still pending (a stall in progress) are abandoned. It returns
// nil on cancellation and the first socket error otherwise.
func (s *Server) Serve(ctx context.Context) error {
	defer s.Close()
	for _, r := range s.replicas {
		rs, err := newResponder(r.respond)
		if err != nil {
			for _, r := range s.replicas {
				if r.resp != nil {
					_ = unix.Close(r.resp.efd)
				}
			}
			return fmt.Errorf("serve replica %d: %w", r.index, err)
		}
		r.resp = rs
	}
	errc := make(chan error, 2*len(s.replicas))
	for _, r := range s.replicas {
		go func() {
			if err := r.resp.run(); err != nil {
				errc <- fmt.Errorf("replica %d: %w", r.index, err)
			}
		}()
		s.wg.Go(func() { errc <- r.readLoop() })
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		// nil: a socket was closed by Close; otherwise the error, already wrapped.
	}
	s.Close()
	s.wg.Wait()
	for _, r := range s.replicas {
		r.resp.stop()
	}
	return err
}

// Close closes the sockets; Serve returns soon after.
func (s *Server) Close() {
	s.closeMu.Do(s.closeConns)
}

func (s *Server) closeConns() {
	for _, r := range s.replicas {
		_ = r.conn.Close()
	}
}

// readLoop receives requests and hands each response to the replica's responder with its
// due time, so a stalled request never delays another one. It returns nil when the socket
// is closed.
func (r *replica) readLoop() error {
	buf := make([]byte, maxDatagram)
	oob := make([]byte, unix.CmsgSpace(timespecLen))
	var last time.Time
	for {
		n, oobn, _, from, err := r.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read request on %s: %w", r.conn.LocalAddr(), err)
		}
		r.requests.Add(1)
		if n < IDLen {
			r.malformed.Add(1)
			continue
		}
		if r.outage.Load() {
			r.dropped.Add(1)
			continue
		}
		now := arrival(time.Now(), oob[:oobn])
		// Keep arrivals monotonic, so each response class stays sorted by due time.
		if now.Before(last) {
			now = last
		}
		last = now
		id := binary.BigEndian.Uint32(buf)
		class := r.decide(id, now)
		delay := r.cfg.Fast
		if class == classStall {
			delay = r.cfg.Stall
		}
		resp := make([]byte, n)
		copy(resp, buf[:n])
		r.resp.schedule(class, now.Add(delay), resp, from)
	}
}

// timespecLen is the size of the SCM_TIMESTAMPNS payload.
const timespecLen = int(unsafe.Sizeof(unix.Timespec{}))

// enableRxTimestamps asks the kernel to stamp each datagram when it is received
// (SO_TIMESTAMPNS), so that the service time counts from the request's arrival, not from the
// moment the read loop got to it: on a busy machine the two differ by scheduling delays
// that have nothing to do with the emulated service.
func enableRxTimestamps(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("enable receive timestamps: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return fmt.Errorf("enable receive timestamps: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("enable receive timestamps: %w", serr)
	}
	return nil
}

// arrival is when the datagram whose control messages are oob reached the socket: now (which
// carries the monotonic clock) moved back by the age of its kernel timestamp. Without a
// plausible timestamp (none, from the future, or older than a second: a wall-clock step)
// it is now.
func arrival(now time.Time, oob []byte) time.Time {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return now
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_TIMESTAMPNS ||
			len(m.Data) < timespecLen || timespecLen != 16 {
			continue
		}
		// struct timespec on 64-bit Linux: two native-endian 64-bit fields.
		sec := int64(binary.NativeEndian.Uint64(m.Data))
		nsec := int64(binary.NativeEndian.Uint64(m.Data[8:]))
		age := now.Sub(time.Unix(sec, nsec)) // wall clock on both sides
		if age >= 0 && age < time.Second {
			return now.Add(-age)
		}
	}
	return now
}

// decide returns the response class (fast or stall) of id arriving at now and updates the
// replay memory.
func (r *replica) decide(id uint32, now time.Time) int {
	stalls := Stalls(r.index, id, r.cfg.StallPct)
	if r.mem.seen(id, now) {
		r.replays.Add(1)
		if stalls {
			r.rescued.Add(1)
		}
		return classFast
	}
	if stalls {
		r.stalls.Add(1)
		return classStall
	}
	return classFast
}

func (r *replica) respond(resp []byte, to netip.AddrPort) {
	if _, err := r.conn.WriteToUDPAddrPort(resp, to); err != nil {
		if !errors.Is(err, net.ErrClosed) {
			r.sendErrs.Add(1)
			slog.Debug("send chaos response", "replica", r.index, "to", to, "err", err)
		}
		return
	}
	r.responses.Add(1)
}

// replayMemory remembers when each id was first seen, for TTL. It keeps two generations of
// maps and rotates them every TTL (or when the current one reaches max entries): an id is
// forgotten between TTL and 2*TTL after it was first seen, and memory holds at most two
// generations, whatever the request rate. Lookups check the stored time, so an id older than
// TTL counts as unseen even before its generation is dropped.
type replayMemory struct {
	mu         sync.Mutex
	ttl        time.Duration
	max        int
	cur, prev  map[uint32]time.Time
	curStarted time.Time

	earlyRotations atomic.Uint64
}

func newReplayMemory(ttl time.Duration, maxEntries int) *replayMemory {
	return &replayMemory{ttl: ttl, max: maxEntries, cur: map[uint32]time.Time{}, prev: map[uint32]time.Time{}}
}

// seen reports whether id was first seen less than ttl before now; if not, it records now
// as the id's first sighting. A replay does not refresh the time: what counts is the first
// attempt, as in the thesis's server.
func (m *replayMemory) seen(id uint32, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.curStarted.IsZero() {
		m.curStarted = now
	}
	if now.Sub(m.curStarted) >= m.ttl {
		m.rotate(now)
	}
	if t, ok := m.cur[id]; ok && now.Sub(t) < m.ttl {
		return true
	}
	if t, ok := m.prev[id]; ok && now.Sub(t) < m.ttl {
		return true
	}
	if len(m.cur) >= m.max {
		m.earlyRotations.Add(1)
		m.rotate(now)
	}
	m.cur[id] = now
	return false
}

func (m *replayMemory) rotate(now time.Time) {
	// Reuse the old map's storage: clear keeps its buckets, so steady load allocates nothing.
	clear(m.prev)
	m.prev, m.cur = m.cur, m.prev
	m.curStarted = now
}

// size is the number of ids held (both generations), for tests.
func (m *replayMemory) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.cur) + len(m.prev)
}
