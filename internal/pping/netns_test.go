package pping

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
)

// Integration tests: real traffic between two lab hosts (client, server) on a bridge, the
// monitor on the client's eth0, RTTs compared with what the applications measured.
//
// Tolerance. pping's RTT is the time between the request leaving the client's interface
// and the reply arriving at it; the application's adds its own socket and scheduling time
// on the client. So for the same request 0 < pping <= app + 50 us (the two clocks are read
// at different places), and app - pping is the client's user-space overhead: the median
// of that difference must stay below 1 ms. Servers that answer with a known delay (DNS)
// make the RTTs long enough that the match itself is unambiguous.
const (
	clockSlack     = 50 * time.Microsecond
	maxAppOverhead = time.Millisecond
)

// emulated reports a kernel-matrix guest (tools/vmtest): qemu emulates the CPU there, so
// user-space overheads are milliseconds and only the ordering checks mean anything.
var emulated = os.Getenv("VMTEST_KERNEL") != ""

type testLab struct {
	*lab.Lab
	client, server *lab.Host
}

func newTestLab(t *testing.T) *testLab { return labOf(t, "pp", lab.Bridge) }

// labOf brings up a lab of a client and a server on fabric, removed when the test ends.
func labOf(t *testing.T, name string, fabric lab.Fabric) *testLab {
	t.Helper()
	bpftest.RequireRoot(t)
	l, err := lab.Up(lab.Spec{Name: name, Fabric: fabric, Hosts: []string{"client", "server"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	return &testLab{Lab: l, client: l.Host("client"), server: l.Host("server")}
}

// collector is a Sink that keeps everything.
type collector struct {
	mu   sync.Mutex
	evs  []Event
	reps []*AggReport
}

func (c *collector) Event(e Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evs = append(c.evs, e)
	return nil
}

func (c *collector) Aggregate(r *AggReport) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reps = append(c.reps, r)
	return nil
}

// rtts returns the RTT events that satisfy keep.
func (c *collector) rtts(keep func(*RTTEvent) bool) []*RTTEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*RTTEvent
	for _, ev := range c.evs {
		if e, ok := ev.(*RTTEvent); ok && keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// waitFor polls until cond holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// monitorOn loads a monitor, attaches it to the client's eth0 and runs it into a collector
// until the test ends.
func monitorOn(t *testing.T, h *lab.Host, mod func(*Config)) (*Monitor, *collector) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.RateLimit = 0
	cfg.MaxFlows = 1024
	if mod != nil {
		mod(&cfg)
	}
	m, err := Load(cfg)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := m.Attach(h.Handle, h.IfIndex, bpfx.TCAuto); err != nil {
		m.Close()
		t.Fatalf("attach: %v", err)
	}
	if xdp := strings.Contains(m.AttachMode(), "xdp"); xdp != (cfg.IngressHook == IngressXDP) {
		m.Close()
		t.Fatalf("attached as %q with ingress hook %v", m.AttachMode(), cfg.IngressHook)
	}
	t.Logf("monitor attached: %s", m.AttachMode())
	col := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, col) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m, col
}

// compare checks pping's samples against the application's RTTs of the same requests.
func compare(t *testing.T, what string, app, pp []time.Duration) {
	t.Helper()
	var diffs []time.Duration
	for i := range app {
		if pp[i] <= 0 || pp[i] > app[i]+clockSlack {
			t.Errorf("%s %d: pping %v, application %v: want 0 < pping <= app + %v", what, i, pp[i], app[i], clockSlack)
		}
		diffs = append(diffs, app[i]-pp[i])
	}
	if m := bench.MedianDuration(diffs); m > maxAppOverhead && !emulated {
		t.Errorf("%s: median app - pping = %v, want < %v", what, m, maxAppOverhead)
	}
	t.Logf("%s: %d requests, median RTT app %v, pping %v", what, len(app), bench.MedianDuration(app), bench.MedianDuration(pp))
}

// eachIngress runs test once with the TC and once with the XDP ingress program; hook sets
// the monitor configuration's ingress hook.
func eachIngress(t *testing.T, test func(t *testing.T, hook func(*Config))) {
	for _, h := range []IngressHook{IngressTC, IngressXDP} {
		t.Run(h.String(), func(t *testing.T) { test(t, func(c *Config) { c.IngressHook = h }) })
	}
}

func TestNetnsICMP(t *testing.T) {
	l := newTestLab(t)
	eachIngress(t, func(t *testing.T, hook func(*Config)) { testNetnsICMP(t, l, hook) })
}

func testNetnsICMP(t *testing.T, l *testLab, hook func(*Config)) {
	_, col := monitorOn(t, l.client, hook)
	for _, dst := range []netip.Addr{l.server.IPv4, l.server.IPv6} {
		t.Run(dst.String(), func(t *testing.T) {
			const n = 5
			out, err := l.client.Run("busybox", "ping", "-c", strconv.Itoa(n), "-i", "0.2", dst.String())
			if err != nil {
				t.Fatalf("ping: %v", err)
			}
			// busybox prints "seq=3 ttl=64 time=0.071 ms": per-sequence RTTs in us.
			app := map[uint64]time.Duration{}
			for _, m := range regexp.MustCompile(`seq=(\d+) .*time=([0-9.]+) ms`).FindAllStringSubmatch(out, -1) {
				seq, _ := strconv.ParseUint(m[1], 10, 16)
				ms, _ := strconv.ParseFloat(m[2], 64)
				app[seq] = time.Duration(ms * float64(time.Millisecond))
			}
			if len(app) != n {
				t.Fatalf("ping output has %d replies, want %d:\n%s", len(app), n, out)
			}
			mine := func(e *RTTEvent) bool {
				return e.Flow.Src.Addr() == dst && e.Flow.IDType == IDICMPEcho
			}
			waitFor(t, "ICMP samples", func() bool { return len(col.rtts(mine)) >= n })
			var a, p []time.Duration
			for _, e := range col.rtts(mine) {
				// busybox ping prints ms with 3 decimals: add its rounding to the slack.
				a = append(a, app[e.ID]+time.Microsecond)
				p = append(p, e.RTT)
			}
			compare(t, "ping "+dst.String(), a, p)
		})
	}
}

// dnsServer answers every query after delay: same id, QR and RA set, no answers.
func dnsServer(t *testing.T, h *lab.Host, addr netip.Addr, delay time.Duration) netip.AddrPort {
	t.Helper()
	var conn *net.UDPConn
	err := h.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 53)))
		return err
	})
	if err != nil {
		t.Fatalf("listen DNS on %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			resp := slices.Clone(buf[:n])
			resp[2] |= 0x80   // QR
			resp[3] = 0x80    // RA, NOERROR
			time.Sleep(delay) // the server's think time, part of the RTT
			_, _ = conn.WriteToUDPAddrPort(resp, from)
		}
	}()
	return conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// dnsQuery is a query for kedge.test. A with the given id.
func dnsQuery(id uint16) []byte {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; one question
	q = append(q, 5, 'k', 'e', 'd', 'g', 'e', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1)
	return q
}

func TestNetnsDNS(t *testing.T) {
	l := newTestLab(t)
	_, col := monitorOn(t, l.client, nil)
	const delay = 2 * time.Millisecond
	for _, srv := range []netip.Addr{l.server.IPv4, l.server.IPv6} {
		t.Run(srv.String(), func(t *testing.T) {
			to := dnsServer(t, l.server, srv, delay)
			var conn *net.UDPConn
			if err := l.client.Do(func() (err error) {
				conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			app := map[uint64]time.Duration{}
			buf := make([]byte, 512)
			for i := range 10 {
				id := uint16(0x1000 + i*7)
				start := time.Now()
				if _, err := conn.Write(dnsQuery(id)); err != nil {
					t.Fatal(err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				n, err := conn.Read(buf)
				if err != nil || n < 2 || binary.BigEndian.Uint16(buf) != id {
					t.Fatalf("query %d: %v", i, err)
				}
				app[uint64(id)] = time.Since(start)
			}
			mine := func(e *RTTEvent) bool { return e.Flow.Src == to && e.Flow.IDType == IDDNS }
			waitFor(t, "DNS samples", func() bool { return len(col.rtts(mine)) >= len(app) })
			var a, p []time.Duration
			for _, e := range col.rtts(mine) {
				if e.RTT < delay {
					t.Errorf("DNS id %#x: pping %v, below the server's %v think time", e.ID, e.RTT, delay)
				}
				a, p = append(a, app[e.ID]), append(p, e.RTT)
			}
			compare(t, "DNS "+srv.String(), a, p)
		})
	}
	t.Run("dig", func(t *testing.T) {
		if _, err := exec.LookPath("dig"); err != nil {
			t.Skip("dig not installed (Debian: dnsutils)")
		}
		to := dnsServer(t, l.server, l.server.IPv4, delay)
		dns := func(e *RTTEvent) bool { return e.Flow.Src == to && e.Flow.IDType == IDDNS }
		before := len(col.rtts(dns)) // the subtests' queries above came from the same address
		// -u: dig's query time in microseconds from the precise clock. (Its default, msec,
		// reads CLOCK_REALTIME_COARSE: a tick's error either way, so a loaded machine saw
		// pping 313.06 ms against dig's 311 ms.) dig reads the clock before it sends and
		// after it receives, so the wire RTT pping measures is at most that; +time only
		// says when dig gives up, long enough for a loaded machine.
		out, err := l.client.Run("dig", "-u", "@"+l.server.IPv4.String(), "kedge.test", "A", "+tries=1", "+time=10")
		if err != nil {
			t.Fatalf("dig: %v", err)
		}
		m := regexp.MustCompile(`Query time: (\d+) usec`).FindStringSubmatch(out)
		idm := regexp.MustCompile(`->>HEADER<<-.* id: (\d+)`).FindStringSubmatch(out)
		if m == nil || idm == nil {
			t.Fatalf("dig output without a query time in usec or a query id:\n%s", out)
		}
		us, _ := strconv.Atoi(m[1])
		id, _ := strconv.ParseUint(idm[1], 10, 16)
		waitFor(t, "dig's sample", func() bool { return len(col.rtts(dns)) > before })
		e, dig := col.rtts(dns)[before], time.Duration(us)*time.Microsecond
		if e.ID != id {
			t.Fatalf("pping's sample has DNS id %d, dig's query %d", e.ID, id)
		}
		// dig's microseconds are truncated: one more.
		if e.RTT < delay || e.RTT > dig+time.Microsecond {
			t.Errorf("pping %v for dig's query, dig says %v: want %v (the server's think time) <= pping <= dig", e.RTT, dig, delay)
		}
		t.Logf("dig: query id %d, query time %v, pping %v", id, dig, e.RTT)
	})
}

// listenTCP listens on addr (any port) in h's namespace until the test ends.
func listenTCP(t *testing.T, h *lab.Host, addr netip.Addr) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := h.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialTCP connects from h's namespace.
func dialTCP(t *testing.T, h *lab.Host, to string) net.Conn {
	t.Helper()
	var conn net.Conn
	if err := h.Do(func() (err error) {
		conn, err = net.Dial("tcp", to)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return conn
}

// serveTCP accepts connections on addr (any port) in h's namespace and runs handle on each
// (which may return early: the connection is closed after it). When the test ends the
// listener and every connection still open are closed and the handlers waited for, so no
// socket outlives the test.
func serveTCP(t *testing.T, h *lab.Host, addr netip.Addr, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	ln := listenTCP(t, h, addr)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// echoServer echoes every TCP read back. It copies through a buffer: io.Copy between two
// TCP connections splices through a pipe from the net package's pool, which outlives the
// test until a later garbage collection happens to drop it (TestNetnsTCP run alone ended
// with that pipe's two descriptors open, and the fd-leak check in TestMain failed).
func echoServer(t *testing.T, h *lab.Host, addr netip.Addr) netip.AddrPort {
	t.Helper()
	return serveTCP(t, h, addr, func(c net.Conn) {
		_, _ = io.Copy(struct{ io.Writer }{c}, struct{ io.Reader }{c})
	})
}

func TestNetnsTCP(t *testing.T) {
	l := newTestLab(t)
	eachIngress(t, func(t *testing.T, hook func(*Config)) { testNetnsTCP(t, l, hook) })
}

func testNetnsTCP(t *testing.T, l *testLab, hook func(*Config)) {
	_, col := monitorOn(t, l.client, hook)
	for _, srv := range []netip.Addr{l.server.IPv4, l.server.IPv6} {
		t.Run(srv.String(), func(t *testing.T) {
			to := echoServer(t, l.server, srv)
			conn := dialTCP(t, l.client, to.String())
			defer conn.Close()
			var app []time.Duration
			msg, buf := make([]byte, 100), make([]byte, 100)
			for range 30 {
				// A new TSval (1 ms clock) for every request, so each can be sampled.
				time.Sleep(2 * time.Millisecond)
				start := time.Now()
				if _, err := conn.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(conn, buf); err != nil {
					t.Fatal(err)
				}
				app = append(app, time.Since(start))
			}
			mine := func(e *RTTEvent) bool { return e.Flow.Src == to && e.Flow.IDType == IDTCPTimestamp }
			// The first request carries the TSval of the handshake's last ACK (the flow
			// starts mid-flow without -s, waiting for a new TSval), so expect at least
			// all but a few requests.
			waitFor(t, "TCP samples", func() bool { return len(col.rtts(mine)) >= len(app)-3 })
			var p []time.Duration
			for _, e := range col.rtts(mine) {
				if e.RTT <= 0 || e.RTT > slices.Max(app)+clockSlack {
					t.Errorf("TCP sample %v outside (0, max app RTT %v]", e.RTT, slices.Max(app))
				}
				p = append(p, e.RTT)
			}
			// TCP samples cannot be paired with requests (the TSval is not visible to the
			// application), so compare medians.
			if d := bench.MedianDuration(app) - bench.MedianDuration(p); d < -clockSlack || (d > maxAppOverhead && !emulated) {
				t.Errorf("median app %v - median pping %v = %v, want in [%v, %v]", bench.MedianDuration(app), bench.MedianDuration(p), d, -clockSlack, maxAppOverhead)
			}
			t.Logf("TCP %s: %d requests, %d samples, median RTT app %v, pping %v", srv, len(app), len(p), bench.MedianDuration(app), bench.MedianDuration(p))
		})
	}
}

// TestNetnsLocalFilter: the server pings the client. By default the client's monitor does
// not time the client's own answers (ePPing's local filter); with -l it does, matching on
// egress.
func TestNetnsLocalFilter(t *testing.T) {
	l := newTestLab(t)
	for _, tc := range []struct {
		local bool
		want  string
	}{{false, "TsLocal"}, {true, "MatchRtt"}} {
		t.Run(fmt.Sprintf("include-local=%v", tc.local), func(t *testing.T) {
			m, col := monitorOn(t, l.client, func(c *Config) { c.IncludeLocal = tc.local })
			before, err := m.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.server.Run("busybox", "ping", "-c", "3", "-i", "0.1", l.client.IPv4.String()); err != nil {
				t.Fatal(err)
			}
			after, err := m.Counters()
			if err != nil {
				t.Fatal(err)
			}
			local := after[HookIngress].TsLocal - before[HookIngress].TsLocal
			egressMatch := after[HookEgress].MatchRtt - before[HookEgress].MatchRtt
			if tc.local {
				waitFor(t, "egress-matched samples", func() bool {
					return len(col.rtts(func(e *RTTEvent) bool { return e.MatchOnEgress })) == 3
				})
				if local != 0 || egressMatch != 3 {
					t.Errorf("ts_local %d, egress match_rtt %d; want 0 and 3", local, egressMatch)
				}
			} else if local != 3 || egressMatch != 0 {
				t.Errorf("ts_local %d, egress match_rtt %d; want 3 and 0", local, egressMatch)
			}
		})
	}
}

// TestNetnsAggregate: 5 pings, aggregated per /32 so client and server (one /24 in the lab)
// are subnets of their own; the monitor is on the client. The server is on the remote side:
// what left for it (tx) is exactly the 5 requests, what arrived from it (rx) the 5 replies
// plus, possibly, its multicast (IGMP reports of a fresh interface); it has the 5 RTTs. The
// client is on the local side: rx is exactly the replies, tx the requests plus possibly its
// own multicast.
func TestNetnsAggregate(t *testing.T) {
	l := newTestLab(t)
	eachIngress(t, func(t *testing.T, hook func(*Config)) {
		const n, payload = 5, 56
		m, col := monitorOn(t, l.client, func(c *Config) { hook(c); c.Aggregate = time.Hour; c.AggPrefixV4 = 32 })
		if _, err := l.client.Run("busybox", "ping", "-c", strconv.Itoa(n), "-s", strconv.Itoa(payload), "-i", "0.1", l.server.IPv4.String()); err != nil {
			t.Fatal(err)
		}
		rep, err := m.CollectAggregate()
		if err != nil {
			t.Fatal(err)
		}
		const frame = 14 + 20 + 8 + payload // Ethernet, IPv4, ICMP echo header, data
		pings := Traffic{OtherPkts: n, OtherBytes: n * frame}
		got := map[string]SubnetStats{}
		for _, s := range rep.Subnets {
			got[s.Prefix.String()+" "+s.Side.String()] = s
		}
		server, client := netip.PrefixFrom(l.server.IPv4, 32).String()+" remote", netip.PrefixFrom(l.client.IPv4, 32).String()+" local"
		plusMulticast := func(tr Traffic) bool {
			return tr.TcpTsPkts+tr.TcpNotsPkts == 0 && tr.OtherPkts >= n && tr.OtherPkts < 2*n && tr.OtherBytes-pings.OtherBytes < n*frame
		}
		if got[server].Tx != pings || got[client].Rx != pings || !plusMulticast(got[server].Rx) || !plusMulticast(got[client].Tx) ||
			got[server].Count != n || got[client].Count != 0 {
			t.Fatalf("IPv4 report %+v, want %s with tx %+v, rx that and at most %d multicast packets and %d RTTs, %s the other way round",
				got, server, pings, n-1, n, client)
		}
		s := got[server]
		if p50 := s.Quantile(0.5); p50 < time.Duration(s.Min) || p50 > time.Duration(s.Max) {
			t.Errorf("median %v outside [%v, %v]", p50, time.Duration(s.Min), time.Duration(s.Max))
		}
		if n := len(col.rtts(func(*RTTEvent) bool { return true })); n != 0 {
			t.Errorf("%d per-sample events in aggregation mode", n)
		}
		t.Logf("aggregate %s: %d samples, min %v p50 %v max %v; rx %d pkts %d B, tx %d pkts %d B", s.Prefix, s.Count,
			time.Duration(s.Min), s.Quantile(0.5), time.Duration(s.Max), s.Rx.Packets(), s.Rx.Bytes(), s.Tx.Packets(), s.Tx.Bytes())
	})
}

// TestNetnsAggregateOneSubnet: the same pings aggregated per /24, which holds both the
// client and the server. The subnet appears once per side, and each side keeps the two
// directions apart - remote: tx the 5 requests, rx the 5 replies (plus the server's
// multicast), with the 5 RTTs; local: rx the replies, tx the requests (plus the client's
// multicast) - where keys by source and destination alone would count every packet in both
// rx and tx of the one subnet.
func TestNetnsAggregateOneSubnet(t *testing.T) {
	l := newTestLab(t)
	const n, payload = 5, 56
	subnet := netip.PrefixFrom(l.client.IPv4, 24).Masked()
	if !subnet.Contains(l.server.IPv4) {
		t.Fatalf("client %s and server %s are not in one /24", l.client.IPv4, l.server.IPv4)
	}
	m, _ := monitorOn(t, l.client, func(c *Config) { c.Aggregate = time.Hour; c.AggPrefixV4 = 24 })
	if _, err := l.client.Run("busybox", "ping", "-c", strconv.Itoa(n), "-s", strconv.Itoa(payload), "-i", "0.1", l.server.IPv4.String()); err != nil {
		t.Fatal(err)
	}
	rep, err := m.CollectAggregate()
	if err != nil {
		t.Fatal(err)
	}
	const frame = 14 + 20 + 8 + payload
	pings := Traffic{OtherPkts: n, OtherBytes: n * frame}
	plusMulticast := func(tr Traffic) bool {
		return tr.TcpTsPkts+tr.TcpNotsPkts == 0 && tr.OtherPkts >= n && tr.OtherPkts < 2*n && tr.OtherBytes-pings.OtherBytes < n*frame
	}
	var remote, local *SubnetStats
	for i := range rep.Subnets {
		s := &rep.Subnets[i]
		if s.Prefix != subnet {
			continue
		}
		if s.Side == SideRemote {
			remote = s
		} else {
			local = s
		}
	}
	if remote == nil || local == nil {
		t.Fatalf("report %+v: want %s on both sides", rep.Subnets, subnet)
	}
	if remote.Tx != pings || !plusMulticast(remote.Rx) || remote.Count != n {
		t.Errorf("%s remote: rx %+v tx %+v, %d RTTs; want tx %+v, rx that plus multicast, %d RTTs", subnet, remote.Rx, remote.Tx, remote.Count, pings, n)
	}
	if local.Rx != pings || !plusMulticast(local.Tx) || local.Count != 0 {
		t.Errorf("%s local: rx %+v tx %+v, %d RTTs; want rx %+v, tx that plus multicast, no RTTs", subnet, local.Rx, local.Tx, local.Count, pings)
	}
}

func TestNetnsMetrics(t *testing.T) {
	l := newTestLab(t)
	m, err := Load(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Attach(l.client.Handle, l.client.IfIndex, bpfx.TCAuto); err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	mt := NewMetrics(m, col)
	ctx, cancel := context.WithCancel(context.Background())
	addr, err := mt.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, mt) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	if _, err := l.client.Run("busybox", "ping", "-c", "3", "-i", "0.15", l.server.IPv4.String()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "3 samples", func() bool { return len(col.rtts(func(*RTTEvent) bool { return true })) >= 3 })
	resp, err := http.Get(fmt.Sprintf("http://%s/metrics", addr))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`kedge_pping_rtt_seconds_count{id_type="icmp_echo",protocol="ICMP",source="icmp"} 3`,
		`kedge_pping_counter_total{counter="match_rtt",hook="ingress"} 3`,
		`kedge_pping_counter_total{counter="ts_stored",hook="egress"} 3`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestNetnsXDPBusy: an interface that already has an XDP program (here kedge's own XDP_PASS
// helper, held by this process) refuses pping's XDP ingress program; the error names the
// program, its mode and its holder, and says what to do - not "the driver may not support
// XDP".
func TestNetnsXDPBusy(t *testing.T) {
	l := newTestLab(t)
	pass, err := bpfx.AttachXDPPass(l.client.Handle, l.client.IfIndex)
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	cfg := DefaultConfig()
	cfg.IngressHook = IngressXDP
	m, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	err = m.Attach(l.client.Handle, l.client.IfIndex, bpfx.TCAuto)
	if err == nil {
		t.Fatal("attached beside another XDP program")
	}
	busy := (*bpfx.XDPBusyError)(nil)
	if !errors.As(err, &busy) {
		t.Fatalf("error %v is not an XDPBusyError", err)
	}
	for _, want := range []string{`"kedge_xdp_pass"`, "native mode", fmt.Sprintf("held by pid %d", os.Getpid()),
		"--ingress-hook tc", "end its holder", "eth0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "may not support XDP") {
		t.Errorf("error %q blames the driver", err)
	}
	t.Log(err)
}
