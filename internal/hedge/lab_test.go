package hedge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pacer"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates namespaces and loads BPF programs")
	}
	if err := checkKernel(); err != nil {
		t.Skipf("hedger: %v", err)
	}
}

// stallServer answers requests (4-byte big-endian id first) by echoing them, after
// stall for ids that stallIf selects, at once otherwise. It stops with the test.
type stallServer struct {
	conn    *net.UDPConn
	served  atomic.Int64
	stallIf func(id uint32) bool
	stall   time.Duration
}

func startServer(t *testing.T, h *lab.Host, addr netip.Addr, port int, stallIf func(uint32) bool, stall time.Duration) *stallServer {
	t.Helper()
	s := &stallServer{stallIf: stallIf, stall: stall}
	err := h.Do(func() (err error) {
		s.conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, uint16(port))))
		return err
	})
	if err != nil {
		t.Fatalf("listen on %s: %v", h.HostName, err)
	}
	t.Cleanup(func() { s.conn.Close() })
	go func() {
		for {
			buf := make([]byte, 2048)
			n, from, err := s.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			s.served.Add(1)
			id := binary.BigEndian.Uint32(buf)
			reply := func() { _, _ = s.conn.WriteToUDPAddrPort(buf[:n], from) }
			if s.stallIf != nil && s.stallIf(id) {
				time.AfterFunc(s.stall, reply)
			} else {
				reply()
			}
		}
	}()
	return s
}

// client sends sequential requests and checks every response; it returns latencies and
// the number of extra datagrams that arrived (duplicates reaching the application).
type clientResult struct {
	lat   []time.Duration
	extra int
}

// clientSocket opens a UDP client socket inside h: connected to the service, or unconnected.
func clientSocket(t *testing.T, h *lab.Host, to netip.AddrPort, connected bool) *net.UDPConn {
	t.Helper()
	var conn *net.UDPConn
	err := h.Do(func() (err error) {
		if connected {
			conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		} else {
			conn, err = net.ListenUDP("udp", nil)
		}
		return err
	})
	if err != nil {
		t.Fatalf("client socket: %v", err)
	}
	return conn
}

func runClient(t *testing.T, h *lab.Host, to netip.AddrPort, connected bool, ids []uint32, timeout time.Duration) clientResult {
	t.Helper()
	conn := clientSocket(t, h, to, connected)
	defer conn.Close()
	var res clientResult
	buf := make([]byte, 2048)
	req := make([]byte, 32)
	for _, id := range ids {
		binary.BigEndian.PutUint32(req, id)
		start := time.Now()
		var err error
		if connected {
			_, err = conn.Write(req)
		} else {
			_, err = conn.WriteToUDPAddrPort(req, to)
		}
		if err != nil {
			t.Fatalf("send id %d: %v", id, err)
		}
		for {
			_ = conn.SetReadDeadline(start.Add(timeout))
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("id %d: no response within %v: %v", id, timeout, err)
			}
			if !connected && netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != to {
				t.Fatalf("id %d: response from %s, client addressed %s (not rewritten)", id, from, to)
			}
			if n < 4 || binary.BigEndian.Uint32(buf) != id {
				res.extra++ // a late duplicate of an earlier request
				continue
			}
			res.lat = append(res.lat, time.Since(start))
			break
		}
	}
	// Anything arriving after the last response is a duplicate the kernel let through.
	_ = conn.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
	for {
		if _, _, err := conn.ReadFromUDPAddrPort(buf); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("drain: %v", err)
			}
			break
		}
		res.extra++
	}
	return res
}

func hedgeLab(t *testing.T, name string) *lab.Lab {
	t.Helper()
	l, err := lab.Up(lab.Spec{Name: name, Fabric: lab.Bridge, Hosts: []string{"client", "srv1", "srv2"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	return l
}

func startHedger(t *testing.T, l *lab.Lab, cfg *Config, backend string) *Hedger {
	t.Helper()
	h, err := Start(cfg, Options{Netns: l.Host("client").Handle, Backend: backend})
	if err != nil {
		var le interface{ Full() string }
		if errors.As(err, &le) {
			t.Log(le.Full())
		}
		t.Fatalf("start hedger: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("close hedger: %v", err)
		}
	})
	return h
}

func ids(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// TestHedgeRescuesStalledRequests is the central scenario: srv1 stalls every 10th request
// for 300 ms, the hedge goes to srv2 after 10 ms, the client (unmodified, connected or not)
// gets exactly one response per request, and answered requests are never hedged.
func TestHedgeRescuesStalledRequests(t *testing.T) {
	requireRoot(t)
	for _, backend := range []string{BackendConveyor, BackendNetem, BackendEDT} {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			for _, v := range scenarioVariants(backend) {
				for _, path := range []string{pathStored, pathClone, pathStoredOnly} {
					if path == pathStoredOnly && v != scenarioVariants(backend)[0] {
						continue // one variant per backend is enough for the pacer without carry
					}
					t.Run(fmt.Sprintf("%s/connected=%v/%s", v.fam, v.connected, path), func(t *testing.T) {
						testRescue(t, backend, v.fam, v.connected, path)
					})
				}
			}
		})
	}
}

// inGuest reports whether the test runs in a kernel-matrix guest (tools/vmtest).
func inGuest() bool { return bpftest.InGuest() }

// requireBackend skips when the kernel lacks what a backend needs, except in a
// kernel-matrix guest: the Debian kernels there must have netem and fq, so a missing
// backend fails. The conveyor is timing-driven and tested on the host only.
func requireBackend(t *testing.T, backend string) {
	t.Helper()
	if backend == BackendConveyor {
		if inGuest() {
			t.Skip("conveyor: its fillers are paced by tbf in real time; emulated (TCG) guests are tested with netem and edt, the host with the conveyor")
		}
		return
	}
	if err := qdiscWorks(backend); err != nil {
		if inGuest() {
			t.Fatalf("backend %s unavailable in a matrix kernel that should have it: %v", backend, err)
		}
		t.Skipf("backend %s: this kernel cannot run it: %v", backend, err)
	}
}

// qdiscWorks builds a throw-away pacer with the backend (bpf_skb_set_tstamp checked for
// edt), its client side in a throw-away namespace too (never the caller's).
func qdiscWorks(backend string) error {
	ns, err := netnsx.New(netnsx.OwnedName("qprobe"))
	if err != nil {
		return err
	}
	defer ns.Close()
	p, err := pacer.New(pacer.Options{Netns: ns.Handle, Name: "qprobe-pacer", Backend: backend})
	if err != nil {
		return err
	}
	return p.Close()
}

type variant struct {
	fam       string
	connected bool
}

func scenarioVariants(backend string) []variant {
	if backend == BackendConveyor {
		return []variant{{"ipv4", true}, {"ipv4", false}, {"ipv6", true}, {"ipv6", false}}
	}
	return []variant{{"ipv4", true}, {"ipv6", false}}
}

// The data paths a lab test runs: stored (store_limit 512, below the MTU's largest payload:
// the clone path stays for larger requests, so the pacer carries), clone (store_limit 0:
// every request cloned), and stored-only (the default store limit, the MTU's largest
// payload: no clone path, the pacer without carry, on the conveyor no fillers).
const (
	pathStored     = "stored"
	pathClone      = "clone"
	pathStoredOnly = "stored-only"
)

// storeLimit is a lab service's store limit on path (nil: the default).
func storeLimit(path string) *int {
	var n int
	switch path {
	case pathStored:
		n = 512
	case pathStoredOnly:
		return nil
	}
	return &n
}

func testRescue(t *testing.T, backend, fam string, connected bool, path string) {
	stored := path != pathClone
	l := hedgeLab(t, "hr")
	srv1, srv2 := l.Host("srv1"), l.Host("srv2")
	a1, a2 := srv1.IPv4, srv2.IPv4
	if fam == "ipv6" {
		a1, a2 = srv1.IPv6, srv2.IPv6
	}
	const stall = 300 * time.Millisecond
	stallIf := func(id uint32) bool { return id%10 == 0 }
	s1 := startServer(t, srv1, a1, 9999, stallIf, stall)
	s2 := startServer(t, srv2, a2, 9999, nil, 0)
	svc := netip.AddrPortFrom(a1, 9999)
	cfg := &Config{
		Interface: "eth0",
		Services: []ServiceConfig{{
			Name: "t", Address: svc.String(),
			Replicas:   []string{netip.AddrPortFrom(a2, 9999).String()},
			Delay:      DelaySpec{Fixed: 10 * time.Millisecond},
			Budget:     BudgetSpec{Ratio: 1, Burst: 100},
			StoreLimit: storeLimit(path),
		}},
	}
	h := startHedger(t, l, cfg, backend)
	const n = 60
	res := runClient(t, l.Host("client"), svc, connected, ids(n, 1000), time.Second)
	// On a busy machine a normal request can take longer than the delay and is then hedged
	// too, legitimately; so can one that takes longer than the delay less the pacer's early
	// margin (half a pass: netem's, or the conveyor's filler queue for clones, 5 ms at the
	// default 10 ms period), which an emulated guest's responses do. A request answered well
	// within that never is.
	slowAfter := 10*time.Millisecond - h.Calibration.Target/2 - time.Millisecond
	stalled, slow, unrescued := 0, 0, 0
	for i, d := range res.lat {
		id := uint32(1000 + i)
		switch {
		case stallIf(id):
			stalled++
			if d >= stall {
				unrescued++
				if !inGuest() {
					t.Errorf("id %d: %v - the stall was not rescued by a hedge", id, d)
				}
			}
		case d >= slowAfter:
			slow++
		}
	}
	if res.extra != 0 {
		t.Errorf("the client received %d extra datagrams; want exactly one response per request", res.extra)
	}
	snap, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	c := snap.Services[0].Counters
	t.Logf("backend %s calibration %+v precision %+v counters %v dl %v", snap.Backend, snap.Calibration, snap.Services[0].Precision, c, snap.DelayLine)
	if c["requests"] != n || c["responses"] != n {
		t.Errorf("requests %d responses %d, want %d each", c["requests"], c["responses"], n)
	}
	hedges := c["hedges_sent"]
	// In an emulated (TCG) guest a tick, or a clone out of the delay line, can come later
	// than the far-overdue cutoff (120 ms seen with netem on 6.1, the pacer's watchdog
	// re-arming a tick): the stalled request is then dropped unhedged, and counted. On real
	// CPUs every stall is rescued (asserted above).
	if overdue := c["overdue_dropped"]; unrescued > 0 {
		t.Logf("%d stalled requests not rescued, overdue_dropped %d (emulated guest)", unrescued, overdue)
		if uint64(unrescued) > overdue {
			t.Errorf("%d stalled requests not rescued but only %d dropped as overdue", unrescued, overdue)
		}
		stalled -= unrescued
	}
	if hedges < uint64(stalled) || hedges > uint64(stalled+slow) {
		t.Errorf("hedges_sent = %d, want the %d stalled requests plus at most the %d slow ones", hedges, stalled, slow)
	}
	if won := c["hedges_won"]; won < uint64(stalled) || won > hedges || c["responses_rewritten"] != won {
		t.Errorf("hedges_won %d responses_rewritten %d, want equal, >= %d stalled and <= %d hedges", won, c["responses_rewritten"], stalled, hedges)
	}
	// Every request not hedged is dropped unsent once its deadline comes: its clone at the
	// delay line's exit, or its stored cell at a tick.
	if stored {
		if c["stored"] != n || c["clones"] != 0 || c["tick_hedges"] != hedges {
			t.Errorf("stored %d clones %d tick_hedges %d, want %d stored, none cloned, every hedge (%d) from a tick",
				c["stored"], c["clones"], c["tick_hedges"], n, hedges)
		}
		// A tick later than the far-overdue cutoff sends nothing (a slow guest's first ticks).
		if got := c["stored_answered"] + c["overdue_dropped"]; got != n-hedges {
			t.Errorf("stored_answered %d + overdue_dropped %d = %d, want %d (every request not hedged)",
				c["stored_answered"], c["overdue_dropped"], got, n-hedges)
		}
		// Without a clone path nothing circulates: no conveyor fillers, no carried packet.
		if fillers, carried := snap.Calibration.Fillers, snap.DelayLine["carried_in"]; path == pathStoredOnly &&
			(fillers != 0 || carried != 0 || snap.DelayLine["filler_passes"] != 0) {
			t.Errorf("stored-only: %d fillers, %d filler passes, %d carried packets; want none", fillers,
				snap.DelayLine["filler_passes"], carried)
		}
	} else {
		if c["clones"] != n || c["stored"] != 0 {
			t.Errorf("clones %d stored %d, want every request cloned (store_limit 0)", c["clones"], c["stored"])
		}
		// A clone out of the delay line later than the far-overdue cutoff sends nothing
		// either (a slow guest's, as on the stored path).
		if got := c["clones_answered"] + c["overdue_dropped"]; got != n-hedges {
			t.Errorf("clones_answered %d + overdue_dropped %d = %d, want %d (every request not hedged)",
				c["clones_answered"], c["overdue_dropped"], got, n-hedges)
		}
	}
	// The losing responses of hedged requests come back later and must be dropped.
	deadline := time.Now().Add(2 * time.Second)
	for {
		snap, _ = h.Stats()
		if snap.Services[0].Counters["duplicates_dropped"] == hedges || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := snap.Services[0].Counters["duplicates_dropped"]; got != hedges {
		t.Errorf("duplicates_dropped = %d, want %d (one per hedged request)", got, hedges)
	}
	if got := s2.served.Load(); got != int64(hedges) {
		t.Errorf("srv2 served %d requests, want %d (only hedges)", got, hedges)
	}
	_ = s1
}
