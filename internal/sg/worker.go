package sg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
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
	// Delay before answering: Delay + a draw from Dist scaled by Jitter.
	Delay  time.Duration
	Jitter time.Duration
	Dist   string // "fixed", "uniform" or "exp"
	// Loss drops a request with this probability; Dup sends the reply twice.
	Loss float64
	Dup  float64
	// Status, if non-zero, is sent in every reply (a worker error).
	Status uint16
	Seed   uint64
}

// ValueFor is the reference worker's default answer: element j of worker w for request id.
// Tests recompute it to check aggregates against what each worker sent.
func ValueFor(worker uint16, id uint64, j int) int64 {
	return int64(worker)*1000 + int64(j) + int64(id%997)
}

// WorkerStats counts what a worker did.
type WorkerStats struct {
	Requests  atomic.Uint64
	Replies   atomic.Uint64
	Dropped   atomic.Uint64 // lost on purpose (Loss)
	Dups      atomic.Uint64
	Malformed atomic.Uint64
}

// RunWorkers serves until ctx ends. It returns once every socket is open (ready is
// closed then) or with the first error.
func RunWorkers(ctx context.Context, cfg WorkerConfig, st *WorkerStats, ready chan<- struct{}) error {
	if len(cfg.Listen) == 0 {
		return errors.New("sg worker: no address to listen on")
	}
	if cfg.Values != nil && len(cfg.Values) != cfg.Elems {
		return fmt.Errorf("sg worker: %d values for %d elements", len(cfg.Values), cfg.Elems)
	}
	switch cfg.Dist {
	case "", "fixed", "uniform", "exp":
	default:
		return fmt.Errorf("sg worker: unknown delay distribution %q (want fixed, uniform or exp)", cfg.Dist)
	}
	if st == nil {
		st = &WorkerStats{}
	}
	conns := make([]*net.UDPConn, 0, len(cfg.Listen))
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, a := range cfg.Listen {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		if err != nil {
			return fmt.Errorf("sg worker: listen on %v: %w", a, err)
		}
		conns = append(conns, c)
	}
	if ready != nil {
		close(ready)
	}
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(c, cfg, st, cfg.Seed+uint64(i))
		}()
	}
	<-ctx.Done()
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	conns = nil
	return nil
}

func serve(c *net.UDPConn, cfg WorkerConfig, st *WorkerStats, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x6b53))
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		h, _, err := ParseHeader(buf[:n])
		if err != nil || h.Op != OpRequest {
			st.Malformed.Add(1)
			continue
		}
		st.Requests.Add(1)
		if cfg.Loss > 0 && rng.Float64() < cfg.Loss {
			st.Dropped.Add(1)
			continue
		}
		reply := BuildReply(h, cfg)
		send := func() {
			_, _ = c.WriteToUDPAddrPort(reply, from)
			st.Replies.Add(1)
			if cfg.Dup > 0 && rng.Float64() < cfg.Dup {
				_, _ = c.WriteToUDPAddrPort(reply, from)
				st.Dups.Add(1)
			}
		}
		if d := delay(cfg, rng); d > 0 {
			time.AfterFunc(d, send)
		} else {
			send()
		}
	}
}

func delay(cfg WorkerConfig, rng *rand.Rand) time.Duration {
	d := cfg.Delay
	switch cfg.Dist {
	case "uniform":
		d += time.Duration(rng.Float64() * float64(cfg.Jitter))
	case "exp":
		d += time.Duration(rng.ExpFloat64() * float64(cfg.Jitter))
	}
	return d
}

// BuildReply is the reference worker's reply to request h.
func BuildReply(h Header, cfg WorkerConfig) []byte {
	v := cfg.Values
	if v == nil {
		v = make([]int64, cfg.Elems)
		for j := range v {
			v[j] = ValueFor(h.Worker, h.ReqID, j)
		}
	}
	payload := AppendVector(nil, cfg.Type, v)
	r := Header{Version: Version, Op: OpReply, Group: h.Group, Worker: h.Worker, ReqID: h.ReqID,
		Status: cfg.Status, NParts: 1, PayloadLen: uint32(len(payload))}
	return append(r.Append(make([]byte, 0, HdrLen+len(payload))), payload...)
}
