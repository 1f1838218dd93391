package pping

import (
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/lab"
)

// bulkServer sends size bytes on every accepted connection, then closes it. info receives
// the server socket's TCP_INFO just before the close (the sender's own RTT estimate).
func bulkServer(t *testing.T, h *lab.Host, addr netip.Addr, size int, info chan<- *unix.TCPInfo) netip.AddrPort {
	t.Helper()
	return serveTCP(t, h, addr, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for left := size; left > 0; left -= len(buf) {
			if _, err := c.Write(buf[:min(left, len(buf))]); err != nil {
				return
			}
		}
		var ti *unix.TCPInfo
		if raw, err := c.(*net.TCPConn).SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) { ti, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		}
		info <- ti
	})
}

// shape puts a token bucket of rate bit/s on h's interface, so a download lasts long enough
// for several rate-limited samples, and removes it when the test ends.
func shape(t *testing.T, h *lab.Host, rate uint64) {
	t.Helper()
	nl, err := netlink.NewHandleAt(h.Handle)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(nl.Close)
	bytesPerS := rate / 8
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: h.IfIndex, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       bytesPerS, Limit: tbfLimit, Buffer: netlink.Xmittime(bytesPerS, tbfBurst),
	}
	if err := nl.QdiscAdd(q); err != nil {
		t.Fatalf("add tbf on %s: %v", h.HostName, err)
	}
	t.Cleanup(func() { _ = nl.QdiscDel(q) })
}

// The token bucket shape() installs: queue and burst in bytes, and the largest delay they
// add at the download's 100 Mbit/s.
const (
	tbfLimit, tbfBurst = 100_000, 20_000
	downloadRate       = 100e6
	tbfMaxDelay        = time.Duration((tbfLimit + tbfBurst) * 8 * float64(time.Second) / downloadRate)
)

// TestNetnsDownload (fault 6 of issue 10): the client downloads 20 MB from the server
// (100 Mbit/s, so about 1.7 s), the monitor on the client's interface with the default
// configuration. The client sends nothing but ACKs, so every sample comes from its pure
// ACKs (HostACKs): the server's next segment echoes them. Before HostACKs this gave no
// sample at all (ts_local, match_none). The median sample must not exceed the largest
// delay the tbf can add (its queue and burst at its rate, 9.6 ms) plus 1 ms; without
// HostACKs nothing is stored at egress.
func TestNetnsDownload(t *testing.T) {
	l := newTestLab(t)
	shape(t, l.server, downloadRate)
	for _, tc := range []struct {
		name     string
		hostACKs bool
	}{{"default", true}, {"host-acks-off", false}} {
		addrs := []netip.Addr{l.server.IPv4, l.server.IPv6}
		if !tc.hostACKs {
			addrs = addrs[:1]
		}
		for _, srv := range addrs {
			t.Run(tc.name+"/"+srv.String(), func(t *testing.T) {
				m, col := monitorOn(t, l.client, func(c *Config) {
					*c = DefaultConfig()
					c.MaxFlows = 1024
					c.HostACKs = tc.hostACKs
				})
				info := make(chan *unix.TCPInfo, 1)
				to := bulkServer(t, l.server, srv, 20<<20, info)
				start := time.Now()
				conn := dialTCP(t, l.client, to.String())
				n, err := io.Copy(io.Discard, conn)
				conn.Close()
				took := time.Since(start)
				if err != nil || n != 20<<20 {
					t.Fatalf("download: %d bytes, %v", n, err)
				}
				ti := <-info
				mine := func(e *RTTEvent) bool { return e.Flow.Src == to && e.Flow.IDType == IDTCPTimestamp }
				all := waitAllRead(t, m, col)
				if !tc.hostACKs {
					if got := col.rtts(mine); len(got) != 0 || all[HookEgress].TsStored != 0 {
						t.Errorf("host ACKs off: %d samples, %d stored at egress; want none", len(got), all[HookEgress].TsStored)
					}
					return
				}
				// One identifier stored per 100 ms (-r): about 17 over the download; an echo
				// is lost when a newer ACK reached the server before it sent, or discarded
				// (match_ack_idle). Before HostACKs there were none.
				if got := len(col.rtts(mine)); got < 2 {
					t.Fatalf("%d samples of the download, want at least 2 (counters %+v)", got, all)
				}
				var p []time.Duration
				for _, e := range col.rtts(mine) {
					p = append(p, e.RTT)
				}
				srtt := time.Duration(ti.Rtt) * time.Microsecond
				for _, r := range p {
					if r <= 0 || r > took {
						t.Errorf("sample %v outside (0, the download's %v]", r, took)
					}
				}
				// The path's RTT is the tbf queue (at most its limit and burst at its rate)
				// plus tens of microseconds of veth and stacks.
				if md := bench.MedianDuration(p); md > tbfMaxDelay+time.Millisecond && !emulated {
					t.Errorf("median sample %v above the tbf queue's %v + 1 ms", md, tbfMaxDelay)
				}
				t.Logf("%s: %d MB in %v, %d samples, median %v (min %v max %v); sender srtt %v min_rtt %v; counters: egress ts_stored %d, ingress match_rtt %d match_ack_idle %d",
					srv, n>>20, took, len(p), bench.MedianDuration(p), slices.Min(p), slices.Max(p), srtt, time.Duration(ti.Min_rtt)*time.Microsecond,
					all[HookEgress].TsStored, all[HookIngress].MatchRtt, all[HookIngress].MatchAckIdle)
			})
		}
	}
}

// TestNetnsIdleSender: the server sends 256 KB, pauses 200 ms (an application with nothing
// to send), and so on, four times. The first segment after a pause echoes the TSval of the
// client's last ACK, sent 200 ms earlier: that is the application's pause, not the path, and
// must not become a sample (match_ack_idle counts it, or, when that TSval was not stored,
// match_miss or match_none).
func TestNetnsIdleSender(t *testing.T) {
	l := newTestLab(t)
	m, col := monitorOn(t, l.client, func(c *Config) { c.HostACKs = true })
	const pause, chunks = 200 * time.Millisecond, 4
	to := serveTCP(t, l.server, l.server.IPv4, func(c net.Conn) {
		chunk := make([]byte, 256<<10)
		for i := range chunks {
			if i > 0 {
				time.Sleep(pause) // the application's pause under test
			}
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	conn := dialTCP(t, l.client, to.String())
	n, err := io.Copy(io.Discard, conn)
	conn.Close()
	if err != nil || n != chunks*256<<10 {
		t.Fatalf("download: %d bytes, %v", n, err)
	}
	all := waitAllRead(t, m, col)
	for _, e := range col.rtts(func(e *RTTEvent) bool { return e.RTT >= pause/2 }) {
		t.Errorf("sample %v contains the sender's %v pause", e.RTT, pause)
	}
	t.Logf("ingress match_rtt %d, match_ack_idle %d, match_miss %d; egress ts_stored %d", all[HookIngress].MatchRtt,
		all[HookIngress].MatchAckIdle, all[HookIngress].MatchMiss, all[HookEgress].TsStored)
}

// waitAllRead waits until the collector holds every sample the kernel took (each segment
// passed the programs before the socket read it; the ring buffer is read asynchronously)
// and returns the counters.
func waitAllRead(t *testing.T, m *Monitor, col *collector) [hookCount]Counters {
	t.Helper()
	var all [hookCount]Counters
	waitFor(t, "every sample read", func() bool {
		var err error
		all, err = m.Counters()
		return err == nil && uint64(len(col.rtts(func(*RTTEvent) bool { return true }))) ==
			all[HookIngress].MatchRtt+all[HookEgress].MatchRtt+all[HookSockops].MatchRtt
	})
	return all
}
