package hedge

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestAdaptiveDelayFollowsLatency: with delay {quantile 0.95, min 1ms, max 50ms} the kernel's
// timer sets the delay to the p95 of the latencies it measured over its window. The server
// first answers in about 1 ms, then in about 8 ms; the delay must move from max (too few
// samples yet) to about 1 ms and then to about 8 ms, with no user-space process involved.
func TestAdaptiveDelayFollowsLatency(t *testing.T) {
	requireRoot(t)
	l := hedgeLab(t, "ad")
	srv := l.Host("srv1")
	svc := netip.AddrPortFrom(srv.IPv4, 9999)
	// On the host: a 1 ms then an 8 ms server, conveyor. In an emulated (TCG) matrix guest a
	// 1 ms server was measured at p95 12.8 ms and the conveyor is not paced in real time, so
	// there the contrast is 1 ms -> 40 ms, through netem, with ranges to match: the test
	// still proves the in-kernel timer computes and applies the quantile on that kernel.
	backend, maxDelay, slowReply := BackendConveyor, 50*time.Millisecond, 8*time.Millisecond
	fastRange, slowRange := [2]time.Duration{time.Millisecond, 5 * time.Millisecond}, [2]time.Duration{7500 * time.Microsecond, 20 * time.Millisecond}
	if inGuest() {
		backend, maxDelay, slowReply = BackendNetem, 200*time.Millisecond, 40*time.Millisecond
		fastRange, slowRange = [2]time.Duration{time.Millisecond, 30 * time.Millisecond}, [2]time.Duration{38 * time.Millisecond, 150 * time.Millisecond}
	}
	s := startRecServer(t, srv, svc, time.Millisecond)
	const tick = 200 * time.Millisecond
	h := startHedger(t, l, &Config{
		Interface: "eth0",
		Tick:      Duration(tick), // window: 10 ticks = 2 s
		Services: []ServiceConfig{{
			Name: "adaptive", Address: svc.String(),
			Delay: DelaySpec{Quantile: 0.95, Min: time.Millisecond, Max: maxDelay, MinSamples: 20},
		}},
	}, backend)

	delayNow := func() (time.Duration, *Snapshot) {
		snap, err := h.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return snap.Services[0].DelayNow, snap
	}
	if d, _ := delayNow(); d != maxDelay {
		t.Errorf("delay before any sample = %v, want max (%v)", d, maxDelay)
	}

	// A client sending sequential requests until the test ends.
	var conn *net.UDPConn
	if err := l.Host("client").Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(svc))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		buf, req := make([]byte, 2048), make([]byte, 32)
		pace := time.NewTicker(2 * time.Millisecond) // at most 500 req/s: samples, not load
		defer pace.Stop()
		for id := uint32(1); ; id++ {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			binary.BigEndian.PutUint32(req, id)
			if _, err := conn.Write(req); err != nil {
				return
			}
			_ = conn.SetReadDeadline(time.Now().Add(maxDelay + 200*time.Millisecond))
			for {
				n, err := conn.Read(buf)
				if err != nil || (n >= 4 && binary.BigEndian.Uint32(buf) == id) {
					break
				}
			}
		}
	}()
	t.Cleanup(func() { close(stop); conn.Close(); <-stopped })

	// waitDelay polls until the delay is in [lo, hi] and returns it and how long it took.
	waitDelay := func(phase string, lo, hi time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		deadline := start.Add(15 * time.Second)
		for {
			d, snap := delayNow()
			if d >= lo && d <= hi {
				ss := snap.Services[0]
				t.Logf("%s: delay %v after %v (latency p50 %v p95 %v p99 %v, window %d samples)",
					phase, d, time.Since(start).Round(time.Millisecond), ss.LatencyP50, ss.LatencyP95, ss.LatencyP99, ss.Window)
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: delay %v, want it in [%v, %v] within 15s (latency p95 %v, window %d samples)",
					phase, d, lo, hi, snap.Services[0].LatencyP95, snap.Services[0].Window)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The ranges leave room for scheduling noise on a loaded machine (the p95 of a 1 ms
	// service is about 1.3 ms on an idle one, and 4 ms was seen with the CPUs oversubscribed
	// five times); the deadline too. The second range cannot be met while more than 5% of
	// the window is faster than 7.5 ms, nor the first while more than 5% is slower than 5 ms.
	fast := waitDelay("server answers in 1ms", fastRange[0], fastRange[1])
	s.reply.Store(int64(slowReply))
	slow := waitDelay("server answers in "+slowReply.String(), slowRange[0], slowRange[1])
	if slow <= fast {
		t.Errorf("delay did not grow: %v -> %v", fast, slow)
	}
}
