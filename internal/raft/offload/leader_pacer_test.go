package offload

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/pkg/kedge"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestLeaderPacerBackends runs the whole sender - NewLeader with its pacer, route and
// neighbour resolution, renewals through Update - on every pacer backend this kernel has
// (the host: the conveyor; the 6.12 guest: edt and netem too). A "follower" namespace
// captures what arrives: heartbeats every interval while the lease is renewed, none once
// it has lapsed. Only functional checks: times are printed.
func TestLeaderPacerBackends(t *testing.T) {
	requireLeader(t)
	for _, backend := range []string{pacer.BackendEDT, pacer.BackendNetem, pacer.BackendConveyor} {
		t.Run(backend, func(t *testing.T) { testLeaderBackend(t, backend) })
	}
}

func testLeaderBackend(t *testing.T, backend string) {
	leaderNS, err := netnsx.New(netnsx.OwnedName("rl-" + backend[:3] + "-l"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leaderNS.Close() })
	followerNS, err := netnsx.New(netnsx.OwnedName("rl-" + backend[:3] + "-f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { followerNS.Close() })
	lh, err := netlink.NewHandleAt(leaderNS.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Close()
	fh, err := netlink.NewHandleAt(followerNS.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := lh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rl0"}, PeerName: "rl1", PeerNamespace: netlink.NsFd(followerNS.Handle)}); err != nil {
		t.Fatal(err)
	}
	up := func(h *netlink.Handle, name, addr string) netlink.Link {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(addr)
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l0 := up(lh, "rl0", "198.18.9.1/24")
	l1 := up(fh, "rl1", "198.18.9.2/24")
	// The neighbour entry user space's own traffic would have made.
	if err := lh.NeighAdd(&netlink.Neigh{LinkIndex: l0.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("198.18.9.2"), HardwareAddr: l1.Attrs().HardwareAddr}); err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := followerNS.Do(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(bpfx.Htons(unix.ETH_P_ALL))); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: bpfx.Htons(unix.ETH_P_ALL), Ifindex: l1.Attrs().Index})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)

	const interval, lease = 20 * time.Millisecond, 400 * time.Millisecond
	follower := Target{ID: 2, Addr: netip.MustParseAddrPort("198.18.9.2:7000")}
	o := LeaderOptions{ClusterID: hbCluster, Self: hbSelf, Source: netip.MustParseAddrPort("198.18.9.1:7000"),
		Followers: []Target{follower}, Interval: interval, Lease: lease}
	o.Pacer.Netns, o.Pacer.Backend = leaderNS.Handle, backend
	l, err := NewLeader(o)
	if errors.Is(err, kedge.ErrNotSupported) {
		t.Skipf("%s: %v", backend, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	l.mu.Lock()
	active := l.cur.F[0].Active
	l.mu.Unlock()
	if active == 0 {
		t.Fatalf("follower not handed to the kernel (its neighbour is permanent)")
	}

	// Renew every 10ms for 300ms: heartbeats arrive.
	start := time.Now()
	var lastRenewal time.Time
	var got []rxFrame
	for time.Since(start) < 300*time.Millisecond {
		l.Update(true, hbTerm, 3, map[uint64]uint64{2: 3})
		lastRenewal = time.Now()
		got = append(got, recvHeartbeats(t, fd, 10*time.Millisecond)...)
	}
	renewedFor := time.Since(start)
	stopped := lastRenewal
	// Stop renewing (a wedged leader): heartbeats stop after the lease.
	var after []time.Duration
	for _, fr := range recvHeartbeats(t, fd, lease+300*time.Millisecond) {
		after = append(after, fr.at.Sub(stopped))
	}
	if len(got) < 3 {
		t.Fatalf("%s: %d heartbeats in %v of renewals (interval %v)", backend, len(got), renewedFor, interval)
	}
	for _, fr := range got {
		checkHeartbeatFrom(t, fr.b, o.Source, follower, hbTerm, 3, nil)
	}
	tail := recvHeartbeats(t, fd, 300*time.Millisecond)
	st, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d heartbeats in %v of renewals, %d after the last renewal (the last %v after it), %d later; ticks %d sent %d early %d expired %d; pacer late p50 %v max %v",
		backend, len(got), renewedFor.Round(time.Millisecond), len(after), last(after), len(tail), st.Counters.Ticks, st.Counters.TicksSent,
		st.Counters.TicksEarly, st.Counters.TicksExpired, st.Pacer.Precision.P50, st.Pacer.Precision.Max)
	if len(tail) != 0 {
		t.Errorf("%s: %d heartbeats more than %v after the last renewal (lease %v): the sender did not stop", backend, len(tail), lease+300*time.Millisecond, lease)
	}
	if st.Counters.TicksExpired == 0 {
		t.Errorf("%s: no tick found the lease expired", backend)
	}
}

func last(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)-1].Round(time.Millisecond)
}

type rxFrame struct {
	b  []byte
	at time.Time // when recvfrom returned it
}

// recvHeartbeats reads UDP frames from fd for about d (plus one receive timeout).
func recvHeartbeats(t *testing.T, fd int, d time.Duration) []rxFrame {
	t.Helper()
	var out []rxFrame
	end := time.Now().Add(d)
	buf := make([]byte, 2048)
	for time.Now().Before(end) {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			t.Fatalf("capture: %v", err)
		}
		if n >= 34 && buf[12] == 0x08 && buf[13] == 0 && buf[23] == unix.IPPROTO_UDP {
			out = append(out, rxFrame{append([]byte(nil), buf[:n]...), time.Now()})
		}
	}
	return out
}
