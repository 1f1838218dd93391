// Package sgbench is `kedge bench sg`: kedge's in-kernel scatter-gather against user-space
// baselines written as well as we can, in one harness, side by side, on the same workers.
package sgbench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	isg "github.com/kedge-dev/kedge/internal/sg"
	"github.com/kedge-dev/kedge/pkg/sg"
	"golang.org/x/sys/unix"
)

// Methods are the default methods, in the order they run in each round.
var Methods = []string{"kedge", "kedge-flat", "kedge-bp", "naive", "mmsg", "epoll", "busypoll", "iouring"}

// AllMethods are Methods and the ones run only when asked for (--methods).
var AllMethods = append(slices.Clone(Methods), "kedge-sock", "kedge-nopoll")

// IsKedge tells kedge's methods from the baselines. kedge: pkg/sg's default, the ring
// buffer's wake-up (irq_work) wakes the reader, which waits in the Go runtime's poller,
// and the scatter's runs grow 8, 8, 16, 32, 64 copies; kedge-flat: the same with equal
// runs of 64 (ScatterFirstBatch 64, the scatter before session 6); kedge-bp: BusyPoll,
// spinning on the ring; kedge-sock: WakeSocket, the reply that completes a request is
// passed to the coordinator socket and wakes the reader (docs/sg.md, "Delivery"; the
// quiet run of session 5 measured no gain, so it is no longer a default method);
// kedge-nopoll: PollSpin off, the ring's reader sleeps as soon as it has read the ring
// (the control for the polling reader, docs/sg.md, "Delivery").
func IsKedge(method string) bool {
	return method == "kedge" || method == "kedge-flat" || method == "kedge-sock" || method == "kedge-bp" || method == "kedge-nopoll"
}

// ClientOptions configure one client run (one method, one fan-out).
type ClientOptions struct {
	Method    string
	Interface string
	Workers   []netip.AddrPort
	Elems     int
	// Type is the workers' element type, "int64" (default) or "int32".
	Type        string
	LatRequests int           // unloaded phase: one request at a time
	Outstanding int           // loaded phase: requests in flight
	Duration    time.Duration // loaded phase length
	Timeout     time.Duration
	// The tail scenario (tail.go): Replicas[i], if set, is shard i's second replica
	// (Workers[i] its first); Resend and the rest are pkg/sg's re-send settings, for kedge
	// and for the user-space re-send baseline alike (Resend 0: off). KeepLatencies returns
	// every loaded request's latency.
	Replicas       []netip.AddrPort
	Resend         time.Duration
	MaxResends     int
	ResendQuantile float64
	ResendMin      time.Duration
	ResendRatio    float64
	ResendBurst    int
	KeepLatencies  bool
}

// ClientResult is what a client measured.
type ClientResult struct {
	Method      string    `json:"method"`
	Fanout      int       `json:"fanout"`
	LatenciesUS []float64 `json:"latencies_us"`
	LatTimeouts int       `json:"lat_timeouts"`
	Completed   int64     `json:"completed"`
	Timeouts    int64     `json:"timeouts"`
	LoadedSec   float64   `json:"loaded_s"`
	CPUUserSec  float64   `json:"cpu_user_s"`
	CPUSysSec   float64   `json:"cpu_sys_s"`
	Mismatches  int64     `json:"mismatches"` // aggregates that differ from the workers' values
	// Latencies of the loaded phase's requests (every requester's), percentiles in us.
	LoadedP50US float64 `json:"loaded_p50_us"`
	LoadedP99US float64 `json:"loaded_p99_us"`
	// Every loaded request's latency (us, sorted; KeepLatencies) and the re-send counters
	// over the loaded phase (kedge: the group's Stats; the user-space baseline: its own).
	LoadedLatenciesUS []float64     `json:"loaded_latencies_us,omitempty"`
	Resends           *ResendCounts `json:"resends,omitempty"`
	// The re-send delay (the estimate, clamped) sampled every DelaySample of the loaded
	// phase: its 10th, 50th and 90th percentiles and its largest, in us.
	Delay *DelayQuantiles `json:"delay,omitempty"`
}

// DelaySample is how often a tail client samples its re-send delay.
const DelaySample = 5 * time.Millisecond

// DelayQuantiles summarise a client's sampled re-send delays (us).
type DelayQuantiles struct {
	P10US float64 `json:"p10_us"`
	P50US float64 `json:"p50_us"`
	P90US float64 `json:"p90_us"`
	MaxUS float64 `json:"max_us"`
}

// delayQuantiles of samples (us); nil without any.
func delayQuantiles(us []float64) *DelayQuantiles {
	if len(us) == 0 {
		return nil
	}
	slices.Sort(us)
	return &DelayQuantiles{P10US: bench.Percentile(us, 10), P50US: bench.Percentile(us, 50), P90US: bench.Percentile(us, 90), MaxUS: us[len(us)-1]}
}

// ResendCounts are a client's re-send counters over its loaded phase: copies scattered,
// copies re-sent to the same worker (retries) or to another replica (hedges), shards a
// hedge answered first, copies the budget refused, second replies of re-sent shards.
type ResendCounts struct {
	Copies      int64 `json:"copies"`
	Retries     int64 `json:"retries"`
	Hedges      int64 `json:"hedges"`
	HedgesWon   int64 `json:"hedges_won"`
	Refused     int64 `json:"refused"`
	LateReplies int64 `json:"late_replies"`
	// Rounds sent, their summed lateness after the due time (ns), copies to a worker whose
	// earlier re-send went unanswered, first re-sends counted above the estimate (kedge:
	// the group's Stats; the user-space baseline: its own, the same way).
	Rounds   int64 `json:"rounds,omitempty"`
	LateNs   int64 `json:"late_ns,omitempty"`
	Again    int64 `json:"again,omitempty"`
	Censored int64 `json:"censored,omitempty"`
}

func (a ResendCounts) sub(b ResendCounts) ResendCounts {
	return ResendCounts{Copies: a.Copies - b.Copies, Retries: a.Retries - b.Retries, Hedges: a.Hedges - b.Hedges,
		HedgesWon: a.HedgesWon - b.HedgesWon, Refused: a.Refused - b.Refused, LateReplies: a.LateReplies - b.LateReplies,
		Rounds: a.Rounds - b.Rounds, LateNs: a.LateNs - b.LateNs, Again: a.Again - b.Again, Censored: a.Censored - b.Censored}
}

func (a ResendCounts) add(b ResendCounts) ResendCounts {
	return a.sub(ResendCounts{}.sub(b))
}

// requester sends one request and returns its aggregate (sum of element 0) or an error.
type requester interface {
	// do sends request id (kedge: pkg/sg picks the id and returns it) and waits for it.
	do(id uint64) (sum int64, used uint64, complete bool, err error)
	close()
}

// RunClient runs the phases of one client: setup, "ready" on out, wait for a line on in,
// unloaded latencies, "loaded" on out, wait for a line, loaded throughput, "done" on out,
// wait for a line, then the result as JSON. The lines let the driver attach a syscall
// counter to the loaded phase only.
func RunClient(ctx context.Context, o ClientOptions, in io.Reader, out io.Writer) (*ClientResult, error) {
	res := &ClientResult{Method: o.Method, Fanout: len(o.Workers)}
	c, err := setupClient(o)
	if err != nil {
		return nil, err
	}
	defer c.cleanup()
	newReq := c.newReq
	rd := bufio.NewReader(in)
	wait := func(say string) error {
		fmt.Fprintln(out, say)
		_, err := rd.ReadString('\n')
		return err
	}
	if err := wait("ready"); err != nil {
		return nil, err
	}
	var seq atomic.Uint64
	seq.Store(uint64(time.Now().UnixNano()) & (1<<40 - 1) << 10)
	r, err := newReq()
	if err != nil {
		return nil, err
	}
	for range o.LatRequests {
		id := seq.Add(1 << 10)
		start := time.Now()
		sum, id, ok, err := r.do(id)
		if err != nil {
			return nil, err
		}
		if !ok {
			res.LatTimeouts++
			continue
		}
		res.LatenciesUS = append(res.LatenciesUS, float64(time.Since(start).Nanoseconds())/1e3)
		if !c.unchecked && sum != want(o.Workers, id) {
			res.Mismatches++
		}
	}
	r.close()
	if err := wait("loaded"); err != nil {
		return nil, err
	}
	reqs := make([]requester, o.Outstanding)
	for i := range reqs {
		if reqs[i], err = newReq(); err != nil {
			return nil, err
		}
	}
	var rc0 ResendCounts
	if c.counts != nil {
		if rc0, err = c.counts(); err != nil {
			return nil, err
		}
	}
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	deadline := start.Add(o.Duration)
	var delays []float64
	delayDone := make(chan struct{})
	if c.delay != nil {
		go func() {
			defer close(delayDone)
			t := time.NewTicker(DelaySample)
			defer t.Stop()
			for now := range t.C {
				if !now.Before(deadline) || ctx.Err() != nil {
					return
				}
				if d, err := c.delay(); err == nil {
					delays = append(delays, float64(d.Nanoseconds())/1e3)
				}
			}
		}()
	} else {
		close(delayDone)
	}
	var completed, timeouts, mism atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(reqs))
	lats := make([][]float64, len(reqs))
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]float64, 0, 1<<16)
			defer func() { lats[i] = lat }()
			for {
				t0 := time.Now()
				if !t0.Before(deadline) || ctx.Err() != nil {
					return
				}
				id := seq.Add(1 << 10)
				sum, id, ok, err := r.do(id)
				if err != nil {
					errc <- err
					return
				}
				if !ok {
					timeouts.Add(1)
					continue
				}
				lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
				completed.Add(1)
				if !c.unchecked && sum != want(o.Workers, id) {
					mism.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	res.LoadedSec = time.Since(start).Seconds()
	<-delayDone
	res.Delay = delayQuantiles(delays)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	close(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	if c.counts != nil {
		rc1, err := c.counts()
		if err != nil {
			return nil, err
		}
		d := rc1.sub(rc0)
		res.Resends = &d
	}
	for _, r := range reqs {
		r.close()
	}
	all := slices.Concat(lats...)
	if len(all) > 0 {
		slices.Sort(all)
		res.LoadedP50US = bench.Percentile(all, 50)
		res.LoadedP99US = bench.Percentile(all, 99)
	}
	if o.KeepLatencies {
		res.LoadedLatenciesUS = all
	}
	res.Completed, res.Timeouts, res.Mismatches = completed.Load(), timeouts.Load(), res.Mismatches+mism.Load()
	res.CPUUserSec = tv(ru1.Utime) - tv(ru0.Utime)
	res.CPUSysSec = tv(ru1.Stime) - tv(ru0.Stime)
	if err := wait("done"); err != nil {
		return nil, err
	}
	return res, nil
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// want is the sum of element 0 over every worker for request id (isg.ValueFor).
func want(ws []netip.AddrPort, id uint64) int64 {
	var s int64
	for w := range ws {
		s += isg.ValueFor(uint16(w), id, 0)
	}
	return s
}

func setup(o ClientOptions) (func() (requester, error), func(), error) {
	c, err := setupClient(o)
	if err != nil {
		return nil, nil, err
	}
	return c.newReq, c.cleanup, nil
}

// client is what a method needs: its requesters, its cleanup and, for the tail
// scenario's methods, its re-send counters.
type client struct {
	newReq  func() (requester, error)
	cleanup func()
	counts  func() (ResendCounts, error)  // nil: not counted
	delay   func() (time.Duration, error) // the re-send delay now; nil: not sampled
	// unchecked: the method reduces nothing (floor), so no aggregate is compared.
	unchecked bool
}

func setupClient(o ClientOptions) (*client, error) {
	if IsKedge(o.Method) || IsTailKedge(o.Method) {
		cfg := sg.Config{Interface: o.Interface, Workers: o.Workers, Reduction: sg.Sum, Type: o.elemType(),
			Elems: o.Elems, Timeout: o.Timeout, InFlight: max(o.Outstanding, 1), BusyPoll: o.Method == "kedge-bp", WakeSocket: o.Method == "kedge-sock"}
		switch o.Method {
		case "kedge-flat":
			cfg.ScatterFirstBatch = isg.DefaultBatch
		case "kedge-nopoll":
			cfg.PollSpin = -1
		}
		o.tailConfig(&cfg)
		g, err := sg.Open(cfg)
		if err != nil {
			return nil, err
		}
		c := &client{newReq: func() (requester, error) { return &kedgeReq{g: g}, nil }, cleanup: func() { g.Close() }}
		if IsTailKedge(o.Method) {
			c.counts = func() (ResendCounts, error) {
				st, err := g.Stats()
				return ResendCounts{Copies: int64(st.Copies), Retries: int64(st.Retries), Hedges: int64(st.Hedges), HedgesWon: int64(st.HedgesWon),
					Refused: int64(st.ResendRefused), LateReplies: int64(st.LateReplies), Rounds: int64(st.ResendRounds),
					LateNs: int64(st.ResendLateNs), Again: int64(st.ResendAgain), Censored: int64(st.ResendCensored)}, err
			}
			if o.Resend > 0 {
				c.delay = func() (time.Duration, error) {
					rs, err := g.ResendState()
					return rs.Delay, err
				}
			}
		}
		return c, nil
	}
	if IsFloor(o.Method) {
		return floorClient(o)
	}
	if IsTailUser(o.Method) {
		p := newResendPolicy(o)
		return &client{newReq: func() (requester, error) { return newHedgeReq(o, p) }, cleanup: func() {},
			counts: func() (ResendCounts, error) { return p.c.load(), nil }, delay: func() (time.Duration, error) { return p.next(), nil }}, nil
	}
	if !slices.Contains(AllMethods, o.Method) {
		return nil, fmt.Errorf("unknown method %q (want one of %v or %v)", o.Method, AllMethods, TailMethods)
	}
	if o.Method == "iouring" {
		return &client{newReq: func() (requester, error) { return newUringReq(o) }, cleanup: func() {}}, nil
	}
	return &client{newReq: func() (requester, error) { return newSockReq(o) }, cleanup: func() {}}, nil
}

// elemType is the workers' element type (Type; default int64).
func (o ClientOptions) elemType() sg.ElemType {
	if o.Type == "int32" {
		return sg.Int32
	}
	return sg.Int64
}

type kedgeReq struct{ g *sg.Group }

func (k *kedgeReq) do(uint64) (int64, uint64, bool, error) {
	res, err := k.g.Scatter(context.Background(), []byte("bench"))
	if err != nil {
		return 0, 0, false, err
	}
	if res.Status != sg.OK {
		return 0, res.ID, false, nil
	}
	return res.Values[0], res.ID, true, nil
}

func (k *kedgeReq) close() {}

// sockReq is one unconnected UDP socket of a baseline.
type sockReq struct {
	o     ClientOptions
	fd    int
	epfd  int
	dsts  []unix.Sockaddr
	buf   []byte
	hdrs  []isg.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6
	rbufs [][]byte
	reqs  [][]byte // per worker: the request with its worker index (as kedge's scatter writes it)
	seen  []bool
	acc   []int64 // the aggregate of the replies so far
	size  int     // element size
	v6    bool
}

func newSockReq(o ClientOptions) (*sockReq, error) {
	v6 := !o.Workers[0].Addr().Unmap().Is4()
	s := &sockReq{o: o, epfd: -1, v6: v6, acc: make([]int64, o.Elems), size: o.elemType().Size()}
	fam := unix.AF_INET
	if v6 {
		fam = unix.AF_INET6
	}
	flags := unix.SOCK_DGRAM | unix.SOCK_CLOEXEC
	if o.Method == "epoll" || o.Method == "busypoll" {
		flags |= unix.SOCK_NONBLOCK
	}
	fd, err := unix.Socket(fam, flags, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	s.fd = fd
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	if o.Method == "naive" || o.Method == "mmsg" {
		tv := unix.NsecToTimeval(o.Timeout.Nanoseconds())
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	if o.Method == "busypoll" {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BUSY_POLL, 50); err != nil {
			return nil, fmt.Errorf("SO_BUSY_POLL: %w", err)
		}
	}
	if o.Method == "epoll" {
		if s.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
			return nil, err
		}
		if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return nil, err
		}
	}
	for _, w := range o.Workers {
		if v6 {
			s.dsts = append(s.dsts, &unix.SockaddrInet6{Port: int(w.Port()), Addr: w.Addr().As16()})
		} else {
			s.dsts = append(s.dsts, &unix.SockaddrInet4{Port: int(w.Port()), Addr: w.Addr().Unmap().As4()})
		}
	}
	s.buf = make([]byte, 65536)
	s.seen = make([]bool, len(o.Workers))
	const batch = 64
	s.rbufs = make([][]byte, batch)
	for i := range s.rbufs {
		s.rbufs[i] = make([]byte, 2048)
	}
	return s, nil
}

func (s *sockReq) close() {
	unix.Close(s.fd)
	if s.epfd >= 0 {
		unix.Close(s.epfd)
	}
}

// request fills every worker's copy of request id: the same bytes kedge's scatter sends
// (worker index per copy).
func (s *sockReq) request(id uint64) {
	if s.reqs == nil {
		s.reqs = make([][]byte, len(s.dsts))
		for i := range s.reqs {
			h := isg.Header{Version: isg.Version, Op: isg.OpRequest, Worker: uint16(i), PayloadLen: 5}
			s.reqs[i] = append(h.Append(nil), "bench"...)
		}
	}
	for _, r := range s.reqs {
		binary.BigEndian.PutUint64(r[8:], id)
	}
}

// take checks one datagram: a reply to id from a worker not seen yet adds to sum.
// The whole vector is reduced (element-wise sum into s.acc), as kedge's gather does; sum is
// element 0 of the aggregate, what the client checks.
func (s *sockReq) take(d []byte, id uint64, sum *int64, got *int) {
	h, p, err := isg.ParseHeader(d)
	if err != nil || h.Op != isg.OpReply || h.ReqID != id || int(h.Worker) >= len(s.seen) || s.seen[h.Worker] ||
		len(p) != s.o.Elems*s.size {
		return // another request's reply (an earlier timeout), or not ours
	}
	s.seen[h.Worker] = true
	if *got == 0 {
		clear(s.acc)
	}
	if s.size == 8 {
		for i := range s.acc {
			s.acc[i] += int64(binary.BigEndian.Uint64(p[i*8:]))
		}
	} else {
		for i := range s.acc {
			s.acc[i] += int64(int32(binary.BigEndian.Uint32(p[i*4:])))
		}
	}
	*sum = s.acc[0]
	*got++
}

func (s *sockReq) do(id uint64) (int64, uint64, bool, error) {
	sum, ok, err := s.exchange(id)
	return sum, id, ok, err
}

func (s *sockReq) exchange(id uint64) (int64, bool, error) {
	clear(s.seen)
	s.request(id)
	n := len(s.o.Workers)
	var err error
	switch s.o.Method {
	case "naive":
		for i, d := range s.dsts {
			if err = unix.Sendto(s.fd, s.reqs[i], 0, d); err != nil {
				return 0, false, fmt.Errorf("sendto worker %d: %w", i, err)
			}
		}
	default:
		if err = s.sendmmsg(); err != nil {
			return 0, false, err
		}
	}
	var sum int64
	got := 0
	deadline := time.Now().Add(s.o.Timeout)
	for got < n {
		if time.Now().After(deadline) {
			return sum, false, nil
		}
		switch s.o.Method {
		case "naive":
			k, _, err := unix.Recvfrom(s.fd, s.buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return 0, false, fmt.Errorf("recvfrom: %w", err)
			}
			s.take(s.buf[:k], id, &sum, &got)
		case "mmsg":
			if err := s.recvBatch(unix.MSG_WAITFORONE, id, &sum, &got); err != nil {
				return 0, false, err
			}
		case "epoll":
			var ev [1]unix.EpollEvent
			if _, err := unix.EpollWait(s.epfd, ev[:], int(time.Until(deadline).Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
				return 0, false, fmt.Errorf("epoll_wait: %w", err)
			}
			if err := s.recvBatch(unix.MSG_DONTWAIT, id, &sum, &got); err != nil {
				return 0, false, err
			}
		case "busypoll":
			if err := s.recvBatch(unix.MSG_DONTWAIT, id, &sum, &got); err != nil {
				return 0, false, err
			}
		}
	}
	return sum, true, nil
}

func (s *sockReq) recvBatch(flags int, id uint64, sum *int64, got *int) error {
	k, err := s.recvmmsg(flags)
	if err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return nil
		}
		return fmt.Errorf("recvmmsg: %w", err)
	}
	for i := 0; i < k; i++ {
		s.take(s.rbufs[i][:s.hdrs[i].Len], id, sum, got)
	}
	return nil
}
