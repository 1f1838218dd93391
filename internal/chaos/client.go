package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
)

// Mode selects a client implementation.
type Mode string

const (
	// ModeBaseline sends a request and blocks until its response or the timeout: no
	// mitigation. Run under the kernel hedger it is the kernel-hedged client (thesis §4.3.3).
	ModeBaseline Mode = "baseline"
	// ModeAppHedge hedges in user space: a second copy after Delay, first answer wins.
	ModeAppHedge Mode = "apphedge"
)

// ClientConfig describes one client run: Warmup requests (discarded) then N measured ones,
// each waiting for its answer before the next is sent (a closed loop, as in the thesis).
type ClientConfig struct {
	// Target is the server (replica) address, host:port.
	Target string
	// Alt, if set, is where app hedges go instead of Target (a second replica).
	Alt string
	// Connected uses connect(2)ed sockets (send/recv) instead of one unconnected socket
	// (sendto/recvfrom). The kernel hedger must work with both, so the baseline offers both.
	Connected bool
	// N measured requests and Warmup requests before them, over all loops.
	N, Warmup int
	// BaseID is the first request id. Ids run BaseID, BaseID+1, ... per loop (see Concurrency).
	BaseID uint32
	// Timeout bounds the wait for a response, from the first send of the request.
	Timeout time.Duration
	// Delay is the hedge delay of ModeAppHedge.
	Delay time.Duration
	// Concurrency runs that many independent sequential loops with disjoint id ranges:
	// loop k starts at BaseID + k*span, span being its share of Warmup+N rounded up to a
	// multiple of 100 so that every loop meets the same stall pattern.
	Concurrency int
	// PayloadLen is the datagram length (>= IDLen; 0 means 32). Bytes after the id are zero.
	PayloadLen int
}

// DefaultClientConfig is the thesis setting (Table 4.1) against target.
func DefaultClientConfig(target string) ClientConfig {
	return ClientConfig{Target: target, N: 5000, Warmup: 200, Timeout: time.Second,
		Delay: 10 * time.Millisecond, Concurrency: 1, PayloadLen: 32}
}

// Sample is the outcome of one measured request. A timed-out request has OK false and
// Latency equal to the time it waited.
type Sample struct {
	ID      uint32
	Latency time.Duration
	OK      bool
}

// ClientResult is what a client run measured.
type ClientResult struct {
	// Samples holds the measured requests, loop by loop, each loop in send order.
	Samples []Sample
	// HedgesSent counts hedge copies sent during the measured requests (0 for the baseline,
	// which cannot see the kernel's hedges).
	HedgesSent int
	// LateDuplicates counts responses that arrived for an id other than the one awaited.
	LateDuplicates int
	// Duplicates counts those of them whose request had been answered already: the second
	// answer of a request reaching the application. The others answer a request the
	// client had given up on (timed out): late, not twice.
	Duplicates int
	// Elapsed is the wall time of the measured requests (the longest loop).
	Elapsed time.Duration
}

// Timeouts is the number of samples that timed out.
func (r ClientResult) Timeouts() int {
	n := 0
	for _, s := range r.Samples {
		if !s.OK {
			n++
		}
	}
	return n
}

// Series converts r to the bench schema. hedgesKnown is false for the baseline client, whose
// hedges (if any) are the kernel's business; backend says where hedges went ("" for none).
func (r ClientResult) Series(name, client, backend string, hedgesKnown bool) bench.Series {
	s := bench.Series{
		Name: name, Client: client, Backend: backend,
		IDs:            make([]uint32, len(r.Samples)),
		LatenciesUS:    make([]float64, len(r.Samples)),
		OK:             make([]bool, len(r.Samples)),
		Timeouts:       r.Timeouts(),
		LateDuplicates: r.LateDuplicates,
		Duplicates:     r.Duplicates,
		ElapsedS:       r.Elapsed.Seconds(),
	}
	for i, smp := range r.Samples {
		s.IDs[i] = smp.ID
		s.LatenciesUS[i] = float64(smp.Latency.Nanoseconds()) / 1e3
		s.OK[i] = smp.OK
	}
	if hedgesKnown {
		h := r.HedgesSent
		s.HedgesSent = &h
	}
	return s
}

// Validate checks cfg for mode and fills defaults.
func (c *ClientConfig) Validate(mode Mode) error {
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.PayloadLen == 0 {
		c.PayloadLen = 32
	}
	switch {
	case mode != ModeBaseline && mode != ModeAppHedge:
		return fmt.Errorf("unknown client mode %q (want %s or %s)", mode, ModeBaseline, ModeAppHedge)
	case c.Target == "":
		return errors.New("no target address")
	case c.N < 1 || c.Warmup < 0:
		return fmt.Errorf("request counts n=%d warmup=%d: need n >= 1, warmup >= 0", c.N, c.Warmup)
	case c.Concurrency < 1 || c.Concurrency > c.N:
		return fmt.Errorf("concurrency %d out of range 1-%d (n)", c.Concurrency, c.N)
	case c.Timeout <= 0:
		return errors.New("timeout must be positive")
	case mode == ModeAppHedge && (c.Delay <= 0 || c.Delay >= c.Timeout):
		return fmt.Errorf("hedge delay %v must be positive and below the timeout %v", c.Delay, c.Timeout)
	case mode == ModeBaseline && c.Alt != "":
		return errors.New("the baseline client does not hedge: --alt is for apphedge")
	case c.PayloadLen < IDLen || c.PayloadLen > maxDatagram:
		return fmt.Errorf("payload length %d out of range %d-%d", c.PayloadLen, IDLen, maxDatagram)
	}
	if span := uint64(c.Concurrency) * loopSpan(c.N+c.Warmup, c.Concurrency); uint64(c.BaseID)+span > 1<<32 {
		return fmt.Errorf("ids from %d for %d requests overflow 32 bits", c.BaseID, c.N+c.Warmup)
	}
	return nil
}

// loopSpan is the id range of each of c loops sharing total requests.
func loopSpan(total, c int) uint64 {
	per := (total + c - 1) / c
	return uint64((per + 99) / 100 * 100)
}

// share splits total into c parts differing by at most one, the larger first.
func share(total, c, k int) int {
	n := total / c
	if k < total%c {
		n++
	}
	return n
}

// loop is one sequential client: it sends a request and returns when it is answered or
// has timed out. Implementations own their sockets, which are opened by the constructor in
// the calling goroutine (so in its network namespace); start runs first in the goroutine
// that then drives the loop.
type loop interface {
	start() error
	// do sends request pkt (its id already written) and waits; it returns whether the
	// response came, and when (measured from the first send).
	do(pkt []byte, id uint32) (time.Duration, bool, error)
	// counters since the last reset.
	hedges() int
	lateDuplicates() int
	strayIDs() []uint32
	reset()
	close() error
}

// RunClient runs Warmup+N requests against cfg.Target in mode and returns the measured part.
// It stops early, with ctx's error, when ctx is done.
//
// The sockets are created in the calling goroutine before any loop starts: to measure inside
// a network namespace, call RunClient from a goroutine locked to a thread in it.
func RunClient(ctx context.Context, mode Mode, cfg ClientConfig) (ClientResult, error) {
	if err := cfg.Validate(mode); err != nil {
		return ClientResult{}, fmt.Errorf("configure %s client: %w", mode, err)
	}
	target, alt, err := resolvePair(cfg.Target, cfg.Alt)
	if err != nil {
		return ClientResult{}, fmt.Errorf("configure %s client: %w", mode, err)
	}
	loops := make([]loop, 0, cfg.Concurrency)
	defer func() {
		for _, l := range loops {
			_ = l.close()
		}
	}()
	for range cfg.Concurrency {
		var l loop
		if mode == ModeBaseline {
			l, err = newBaselineLoop(target, cfg.Connected, cfg.Timeout)
		} else {
			l, err = newHedgeLoop(target, alt, cfg.Connected, cfg.Timeout, cfg.Delay)
		}
		if err != nil {
			return ClientResult{}, fmt.Errorf("start %s client: %w", mode, err)
		}
		loops = append(loops, l)
	}
	span := loopSpan(cfg.N+cfg.Warmup, cfg.Concurrency)
	results := make([]ClientResult, cfg.Concurrency)
	errs := make([]error, cfg.Concurrency)
	var wg sync.WaitGroup
	for k, l := range loops {
		wg.Go(func() {
			if errs[k] = l.start(); errs[k] != nil {
				return
			}
			first := cfg.BaseID + uint32(uint64(k)*span)
			results[k], errs[k] = runLoop(ctx, l, first, share(cfg.Warmup, cfg.Concurrency, k),
				share(cfg.N, cfg.Concurrency, k), cfg.PayloadLen)
		})
	}
	wg.Wait()
	var out ClientResult
	for k, r := range results {
		if errs[k] != nil {
			return ClientResult{}, fmt.Errorf("run %s client loop %d: %w", mode, k, errs[k])
		}
		out.Samples = append(out.Samples, r.Samples...)
		out.HedgesSent += r.HedgesSent
		out.LateDuplicates += r.LateDuplicates
		out.Duplicates += r.Duplicates
		out.Elapsed = max(out.Elapsed, r.Elapsed)
	}
	return out, nil
}

func runLoop(ctx context.Context, l loop, first uint32, warmup, n, payloadLen int) (ClientResult, error) {
	pkt := make([]byte, payloadLen)
	var res ClientResult
	res.Samples = make([]Sample, 0, n)
	var start time.Time
	answered := make([]bool, warmup+n) // by id - first
	for i := range warmup + n {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if i == warmup {
			l.reset()
			start = time.Now()
		}
		id := first + uint32(i)
		binary.BigEndian.PutUint32(pkt, id)
		lat, ok, err := l.do(pkt, id)
		if err != nil {
			return res, fmt.Errorf("request %d: %w", id, err)
		}
		answered[i] = ok
		if i >= warmup {
			res.Samples = append(res.Samples, Sample{ID: id, Latency: lat, OK: ok})
		}
	}
	res.Elapsed = time.Since(start)
	res.HedgesSent, res.LateDuplicates = l.hedges(), l.lateDuplicates()
	for _, s := range l.strayIDs() {
		if i := s - first; i < uint32(len(answered)) && answered[i] {
			res.Duplicates++
		}
	}
	return res, nil
}

// lateLog is a loop's record of responses to another request than the one awaited: how
// many, and the ids of those that carried one (runLoop tells duplicates from late answers).
type lateLog struct {
	late   int
	strays []uint32
}

// stray records response b.
func (g *lateLog) stray(b []byte) {
	g.late++
	if len(b) >= IDLen {
		g.strays = append(g.strays, binary.BigEndian.Uint32(b))
	}
}

func (g *lateLog) lateDuplicates() int { return g.late }
func (g *lateLog) strayIDs() []uint32  { return g.strays }

// resolvePair resolves the target and the optional alternate; both must be of one family
// since the hedging client sends to both from one socket.
func resolvePair(target, alt string) (netip.AddrPort, netip.AddrPort, error) {
	t, err := resolveUDP(target)
	if err != nil {
		return t, t, err
	}
	if alt == "" {
		return t, t, nil
	}
	a, err := resolveUDP(alt)
	if err != nil {
		return t, a, err
	}
	if a.Addr().Is4() != t.Addr().Is4() {
		return t, a, fmt.Errorf("target %s and alternate %s are of different address families", t, a)
	}
	return t, a, nil
}
