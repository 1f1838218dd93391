package pping

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// pathProbe measures the shaped path's round trip as processes on its ends see it, while an
// exchange runs: a UDP datagram from the client to an echo socket on the server every
// probeInterval, each timed in this process from its send to its echo's receipt. On an idle
// machine that is the shaped RTT plus microseconds; under load it is also what the delay
// line (a reader in this process) adds by releasing late and what a process adds by waking
// late, which the samples of an RTT source taken in the same interval carry too. A test
// holds a source's median to the shaped RTT or to what the probe measured, whichever is
// higher (pathRef), instead of to a constant that load breaks; the lower bound (no sample
// below the shaped RTT) does not move with it.
type pathProbe struct {
	t          *testing.T
	echo, conn net.PacketConn
	dst        net.Addr
	stop       chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	rtts       []time.Duration
}

const (
	probeInterval = 5 * time.Millisecond
	probePort     = 7999
)

// startPathProbe starts probing from l.client to l.server's port (UDP: no RTT source of
// the monitor tracks it); Stop ends it.
func startPathProbe(t *testing.T, l *testLab, port uint16) *pathProbe {
	t.Helper()
	p := &pathProbe{t: t, stop: make(chan struct{})}
	srv := netip.AddrPortFrom(l.server.IPv4, port)
	if err := l.server.Do(func() (err error) {
		p.echo, err = net.ListenPacket("udp4", srv.String())
		return err
	}); err != nil {
		t.Fatalf("path probe: echo socket on %s: %v", srv, err)
	}
	if err := l.client.Do(func() (err error) {
		p.conn, err = net.ListenPacket("udp4", netip.AddrPortFrom(l.client.IPv4, 0).String())
		return err
	}); err != nil {
		p.echo.Close()
		t.Fatalf("path probe: client socket: %v", err)
	}
	p.dst = net.UDPAddrFromAddrPort(srv)
	t.Cleanup(func() { p.Stop() })
	start := time.Now()
	p.wg.Add(3)
	go func() { // the echo
		defer p.wg.Done()
		buf := make([]byte, 64)
		for {
			n, from, err := p.echo.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = p.echo.WriteTo(buf[:n], from)
		}
	}()
	go func() { // the receiver: each echo carries its send time (since start)
		defer p.wg.Done()
		buf := make([]byte, 64)
		for {
			n, _, err := p.conn.ReadFrom(buf)
			if err != nil {
				return
			}
			if n != 8 {
				continue
			}
			rtt := time.Since(start) - time.Duration(binary.LittleEndian.Uint64(buf))
			p.mu.Lock()
			p.rtts = append(p.rtts, rtt)
			p.mu.Unlock()
		}
	}()
	go func() { // the sender
		defer p.wg.Done()
		tick := time.NewTicker(probeInterval)
		defer tick.Stop()
		var b [8]byte
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			binary.LittleEndian.PutUint64(b[:], uint64(time.Since(start)))
			if _, err := p.conn.WriteTo(b[:], p.dst); err != nil && !errors.Is(err, net.ErrClosed) {
				p.t.Logf("path probe: send: %v", err)
			}
		}
	}()
	return p
}

// Stop ends the probe, waiting for the echoes of the last probes (at most a shaped RTT plus
// the delay line's lateness; a probe lost or later than that is not counted), and returns
// the RTTs measured, sorted.
func (p *pathProbe) Stop() []time.Duration {
	select {
	case <-p.stop:
	default:
		close(p.stop)
		time.Sleep(4 * shapedRTT) // the echoes in flight; nothing to poll for
		p.conn.Close()
		p.echo.Close()
		p.wg.Wait()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	slices.Sort(p.rtts)
	return slices.Clone(p.rtts)
}

// pathRef is the reference an RTT source's median is held to beside the shaped RTT: the
// probe's 90th percentile over the exchange (0 with fewer than ten probes). A sample of a
// source is an RTT plus a peer's turnaround (the QUIC server's next packet, a delayed ACK),
// so its median is compared with the probes' upper range, not their median.
func pathRef(rtts []time.Duration) time.Duration {
	if len(rtts) < 10 {
		return 0
	}
	return rtts[len(rtts)*9/10]
}

// logPath logs the probe's RTTs of an exchange.
func logPath(t *testing.T, name string, rtts []time.Duration) {
	t.Helper()
	if len(rtts) == 0 {
		t.Logf("%s: path probe: no echo", name)
		return
	}
	t.Logf("%s: path probe: %d RTTs, min %v median %v p90 %v max %v", name, len(rtts), rtts[0], rtts[(len(rtts)-1)/2], pathRef(rtts), rtts[len(rtts)-1])
}
