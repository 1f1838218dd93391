package sg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// WorkerConfig configures the reference worker (kedge sg worker). Each address in Listen
// is one worker (its own socket); Values decides what it answers.
type WorkerConfig struct {
	Listen []netip.AddrPort
	Type   uint8 // TypeI32 or TypeI64
	Elems  int
	// Values, if set, is the constant vector every worker answers. Otherwise element j of
	// worker w's answer to request id is ValueFor(w, id, j).
	Values []int64
	// Float, if its Bits are set, makes the vector floats sent in Float's wire form (Type
	// must be Float.WireType()): FloatValues if set, else FloatValueFor(w, id, j). A
	// value the form cannot carry (a sum's NaN or infinity) is answered with status
	// StatusUnencodable and a zero vector: the gather counts it in worker_errors.
	Float       FloatFormat
	FloatValues []float64
	// Delay before answering: Delay + a draw from Dist scaled by Jitter.
	Delay  time.Duration
	Jitter time.Duration
	Dist   string // "fixed", "uniform" or "exp"
	// Straggle makes a request's reply late with this probability (a straggler, "The Tail
	// at Scale"): it waits StraggleMin + U[0, StraggleMax-StraggleMin) on top of Delay.
	Straggle    float64
	StraggleMin time.Duration
	StraggleMax time.Duration
	// Loss drops a request with this probability; Dup sends the reply twice.
	Loss float64
	Dup  float64
	// Status, if non-zero, is sent in every reply (a worker error).
	Status uint16
	Seed   uint64
	// Threads is how many event loops (OS threads) serve the sockets; 0 = GOMAXPROCS.
	Threads int
	// Parts splits every reply into this many datagrams (a multi-packet reply, PartSlice);
	// 0 or 1: a single datagram, unless MaxDatagram asks for more.
	Parts int
	// MaxDatagram, if set and Parts is not, splits a reply into as few parts as keep each
	// datagram's UDP payload (header included) within it (DefaultMaxDatagram fits an MTU
	// of 1500).
	MaxDatagram int
	// PartLoss drops each part of a multi-packet reply with this probability (the rest of
	// the reply is sent).
	PartLoss float64
}

// DefaultMaxDatagram is the UDP payload of a datagram that fits an MTU of 1500 over IPv6
// (1500 - 40 - 8) and IPv4.
const DefaultMaxDatagram = 1452

// NParts is how many datagrams a reply of cfg takes (Parts, or PartsFor MaxDatagram).
func (cfg WorkerConfig) NParts() int {
	if cfg.Parts > 0 || cfg.MaxDatagram <= HdrLen || cfg.Elems == 0 {
		return max(cfg.Parts, 1)
	}
	return PartsFor(cfg.Elems, ElemSize(cfg.Type), cfg.MaxDatagram-HdrLen)
}

// ValueFor is the reference worker's default answer: element j of worker w for request id.
// Tests recompute it to check aggregates against what each worker sent.
func ValueFor(worker uint16, id uint64, j int) int64 {
	return valueBase(worker, id) + int64(j)
}

// valueBase is ValueFor's element 0: a reply computes it once (a 64-bit division),
// not once per element.
func valueBase(worker uint16, id uint64) int64 {
	return int64(worker)*1000 + int64(id%997)
}

// FloatValueFor is the reference worker's default float answer: ValueFor / 3 (not a
// binary fraction, so a fixed-point sum of it rounds), negative for odd j.
func FloatValueFor(worker uint16, id uint64, j int) float64 {
	x := float64(ValueFor(worker, id, j)) / 3
	if j%2 == 1 {
		x = -x
	}
	return x
}

// StatusUnencodable is the status of a reply whose float vector has no wire form for the
// group's reduction (FloatFormat.Append refused it).
const StatusUnencodable = 0xf1

// WorkerStats counts what a worker did.
type WorkerStats struct {
	Requests  atomic.Uint64
	Replies   atomic.Uint64
	Dropped   atomic.Uint64 // lost on purpose (Loss)
	Straggled atomic.Uint64 // answered late on purpose (Straggle)
	Dups      atomic.Uint64
	Malformed atomic.Uint64
}

// RunWorkers serves until ctx ends. It returns once every socket is open (ready is
// closed then) or with the first error.
//
// The sockets are served by cfg.Threads event loops (default GOMAXPROCS, at most one per
// socket), each on its own locked OS thread with its own epoll instance: one epoll_wait
// reports the ready sockets, one recvmmsg per ready socket takes what it has queued, one
// sendmmsg sends the replies (workerloop.go). A goroutine per socket through Go's netpoller
// cost about a third more CPU per reply (docs/sg.md, "Benchmark").
func RunWorkers(ctx context.Context, cfg WorkerConfig, st *WorkerStats, ready chan<- struct{}) error {
	if len(cfg.Listen) == 0 {
		return errors.New("sg worker: no address to listen on")
	}
	if cfg.Values != nil && len(cfg.Values) != cfg.Elems {
		return fmt.Errorf("sg worker: %d values for %d elements", len(cfg.Values), cfg.Elems)
	}
	if cfg.Elems < 0 {
		return fmt.Errorf("sg worker: %d elements", cfg.Elems)
	}
	if err := cfg.checkFloat(); err != nil {
		return fmt.Errorf("sg worker: %w", err)
	}
	switch cfg.Dist {
	case "", "fixed", "uniform", "exp":
	default:
		return fmt.Errorf("sg worker: unknown delay distribution %q (want fixed, uniform or exp)", cfg.Dist)
	}
	if cfg.Straggle < 0 || cfg.Straggle > 1 || cfg.Straggle > 0 && (cfg.StraggleMin <= 0 || cfg.StraggleMax < cfg.StraggleMin) {
		return fmt.Errorf("sg worker: straggle probability %v, delay %v..%v (want a probability, and 0 < min <= max)",
			cfg.Straggle, cfg.StraggleMin, cfg.StraggleMax)
	}
	if cfg.Threads < 0 {
		return fmt.Errorf("sg worker: %d threads (want 0 = GOMAXPROCS, or more)", cfg.Threads)
	}
	if cfg.Parts < 0 || cfg.MaxDatagram < 0 || cfg.MaxDatagram > 0 && cfg.MaxDatagram <= HdrLen+8 {
		return fmt.Errorf("sg worker: %d parts, max datagram %d bytes (want parts >= 0, max datagram > %d)", cfg.Parts, cfg.MaxDatagram, HdrLen+8)
	}
	if n := cfg.NParts(); n > 1 && (n > PartsMax || cfg.Elems > 0 && !ValidParts(cfg.Elems, n)) {
		return fmt.Errorf("sg worker: a reply of %d elements cannot travel in %d parts (at most %d, none empty)", cfg.Elems, n, PartsMax)
	}
	if st == nil {
		st = &WorkerStats{}
	}
	fds := make([]int, 0, len(cfg.Listen))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, a := range cfg.Listen {
		fd, err := listenUDP(a)
		if err != nil {
			return fmt.Errorf("sg worker: listen on %v: %w", a, err)
		}
		fds = append(fds, fd)
	}
	n := cfg.Threads
	if n == 0 {
		n = runtime.GOMAXPROCS(0)
	}
	n = min(n, len(fds))
	loops := make([]*workerLoop, 0, n)
	defer func() {
		for _, l := range loops {
			l.close()
		}
	}()
	for i := range n {
		var mine []int
		for k := i; k < len(fds); k += n {
			mine = append(mine, fds[k])
		}
		l, err := newWorkerLoop(cfg, st, mine, cfg.Seed+uint64(i))
		if err != nil {
			return fmt.Errorf("sg worker: %w", err)
		}
		loops = append(loops, l)
	}
	if ready != nil {
		close(ready)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(loops))
	for i, l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.run()
		}()
	}
	select {
	case <-ctx.Done():
	case <-firstDone(&wg):
	}
	for _, l := range loops {
		l.stop()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// firstDone is closed when wg's goroutines have all returned (a loop only returns early
// on an error, which RunWorkers then reports).
func firstDone(wg *sync.WaitGroup) <-chan struct{} {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	return c
}

// listenUDP opens a non-blocking UDP socket bound to a.
func listenUDP(a netip.AddrPort) (int, error) {
	fam := unix.AF_INET6
	if a.Addr().Is4() {
		fam = unix.AF_INET
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	var sa unix.Sockaddr
	if fam == unix.AF_INET {
		sa = &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	} else {
		z, _ := strconv.Atoi(a.Addr().Zone()) // a zone by number; names are resolved below
		if z == 0 && a.Addr().Zone() != "" {
			if ifi, err := net.InterfaceByName(a.Addr().Zone()); err == nil {
				z = ifi.Index
			}
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
		sa = &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16(), ZoneId: uint32(z)}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind: %w", err)
	}
	return fd, nil
}

// delay draws how long one reply waits; straggled says the Straggle draw made it late.
// Without Straggle it draws exactly what it did before the straggler mode existed, so a
// seed gives the same delays.
func delay(cfg WorkerConfig, rng *rand.Rand) (d time.Duration, straggled bool) {
	d = cfg.Delay
	switch cfg.Dist {
	case "uniform":
		d += time.Duration(rng.Float64() * float64(cfg.Jitter))
	case "exp":
		d += time.Duration(rng.ExpFloat64() * float64(cfg.Jitter))
	}
	if cfg.Straggle > 0 && rng.Float64() < cfg.Straggle {
		d += cfg.StraggleMin + time.Duration(rng.Float64()*float64(cfg.StraggleMax-cfg.StraggleMin))
		straggled = true
	}
	return d, straggled
}

// BuildReply is the reference worker's reply to request h: one datagram per part.
func BuildReply(h Header, cfg WorkerConfig) [][]byte {
	n := cfg.NParts()
	out := make([][]byte, n)
	for p := range out {
		out[p] = AppendPart(nil, h, cfg, p, n)
	}
	return out
}

// AppendPart appends part p of nparts of the reference worker's reply to request h to b
// (no allocation when b has room for it). nparts 1 is the whole reply in one datagram;
// otherwise the part carries PartSlice's elements (count: an empty payload).
func AppendPart(b []byte, h Header, cfg WorkerConfig, p, nparts int) []byte {
	off, n := 0, cfg.Elems
	if nparts > 1 {
		off, n, _ = PartSlice(cfg.Elems, nparts, p)
	}
	r := Header{Version: Version, Op: OpReply, Group: h.Group, Worker: h.Worker, ReqID: h.ReqID,
		Status: cfg.Status, Part: uint16(p), NParts: uint16(nparts), PayloadLen: uint32(n * ElemSize(cfg.Type))}
	if cfg.Float.Bits != 0 {
		return appendFloatPart(b, r, h, cfg, off, n)
	}
	b = r.Append(b)
	if cfg.Values != nil {
		return AppendVector(b, cfg.Type, cfg.Values[off:off+n])
	}
	// The default vector, element j = base + j, written into room grown once: appending
	// element by element (a capacity check and four or eight byte appends each) was 10%
	// of the worker process's CPU at fan-out 4 with 32 requests outstanding (docs/sg.md,
	// Benchmark and current figures).
	at := len(b)
	b = slices.Grow(b, n*ElemSize(cfg.Type))[:at+n*ElemSize(cfg.Type)]
	out, x := b[at:], valueBase(h.Worker, h.ReqID)+int64(off)
	if cfg.Type == TypeI64 {
		for j := range n {
			binary.BigEndian.PutUint64(out[8*j:], uint64(x+int64(j)))
		}
		return b
	}
	for j := range n {
		binary.BigEndian.PutUint32(out[4*j:], uint32(int32(x+int64(j))))
	}
	return b
}

// checkFloat checks a float worker's format and constant values.
func (cfg WorkerConfig) checkFloat() error {
	if cfg.Float.Bits == 0 {
		if cfg.FloatValues != nil {
			return errors.New("float values for an integer vector")
		}
		return nil
	}
	if err := cfg.Float.Check(); err != nil {
		return err
	}
	if cfg.Type != cfg.Float.WireType() {
		return fmt.Errorf("float%d vectors of reduction %d travel as type %d, not %d", cfg.Float.Bits, cfg.Float.Reduce, cfg.Float.WireType(), cfg.Type)
	}
	if cfg.Elems > AggElems {
		return fmt.Errorf("%d float elements, at most %d", cfg.Elems, AggElems)
	}
	if cfg.FloatValues != nil && len(cfg.FloatValues) != cfg.Elems {
		return fmt.Errorf("%d values for %d elements", len(cfg.FloatValues), cfg.Elems)
	}
	if _, err := cfg.Float.Append(nil, cfg.FloatValues); err != nil {
		return fmt.Errorf("values: %w", err)
	}
	return nil
}

// appendFloatPart appends the reply header r and elements [off, off+n) of a float
// worker's vector; a vector Float cannot carry goes as zeros with StatusUnencodable.
func appendFloatPart(b []byte, r, h Header, cfg WorkerConfig, off, n int) []byte {
	var xs [AggElems]float64
	for j := off; j < off+n; j++ {
		if cfg.FloatValues != nil {
			xs[j-off] = cfg.FloatValues[j]
		} else {
			xs[j-off] = FloatValueFor(h.Worker, h.ReqID, j)
		}
	}
	start := len(b)
	b = r.Append(b)
	b, err := cfg.Float.Append(b, xs[:n])
	if err != nil {
		r.Status = StatusUnencodable
		b = r.Append(b[:start])
		b = append(b, make([]byte, int(r.PayloadLen))...)
	}
	return b
}
