package offload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/vishvananda/netlink"
	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// Fixtures: leader_tick under BPF_PROG_TEST_RUN in a test namespace. Heartbeats leave by
// bpf_clone_redirect out of hb1 and are captured on its peer hb0; tick requests go to tk0
// (the pacer's tick veth stands in). The lease is written by the Leader's own Update (the
// node's hook), through mmap or through map updates, so the fixtures test what the node
// writes, not a hand-made lease.

const (
	hbCluster = 42
	hbSelf    = 1
	hbTerm    = 7
)

var (
	hbSource    = netip.MustParseAddrPort("198.18.1.2:7000")
	hbFollowers = []Target{
		{ID: 2, Addr: netip.MustParseAddrPort("198.18.2.2:7000")},
		{ID: 3, Addr: netip.MustParseAddrPort("198.18.3.2:7001")},
		{ID: 4, Addr: netip.MustParseAddrPort("198.18.4.2:7002")},
	}
	hbSMAC = [6]byte{0x02, 'k', 'l', 'e', 'a', 'd'}
	hbDMAC = [6]byte{0x02, 'k', 'r', 'o', 'u', 't'}
)

type leaderFixture struct {
	t       *testing.T
	ns      *netnsx.Netns
	l       *Leader
	outIfx  int // hb1: heartbeats leave here
	capIfx  int // hb0: captured here
	tickIfx int // tk0: tick requests
	armed   []time.Duration
}

func requireLeader(t testing.TB) {
	t.Helper()
	bpftest.RequireRoot(t)
	if err := pacer.CheckKernel(); err != nil {
		t.Skipf("pacer not supported here: %v", err)
	}
}

func newLeaderFixture(t *testing.T, mmap bool) *leaderFixture {
	return newKeyedLeaderFixture(t, mmap, nil)
}

func newKeyedLeaderFixture(t *testing.T, mmap bool, key *wire.Key) *leaderFixture {
	requireLeader(t)
	if mmap && !HaveMmapableArray() {
		t.Skip("kernel without BPF_F_MMAPABLE arrays")
	}
	f := &leaderFixture{t: t}
	ns, err := netnsx.New(netnsx.OwnedName(fmt.Sprintf("raftl-fx-%v", mmap)))
	if err != nil {
		t.Fatalf("create test namespace: %v", err)
	}
	f.ns = ns
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Errorf("remove test namespace: %v", err)
		}
	})
	nh, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	idx := map[string]int{}
	for _, pair := range [][2]string{{"hb0", "hb1"}, {"tk0", "tk1"}} {
		if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pair[0]}, PeerName: pair[1]}); err != nil {
			t.Fatalf("add veth: %v", err)
		}
		for _, n := range pair {
			l, err := nh.LinkByName(n)
			if err != nil {
				t.Fatal(err)
			}
			if err := nh.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
			idx[n] = l.Attrs().Index
		}
	}
	f.outIfx, f.capIfx, f.tickIfx = idx["hb1"], idx["hb0"], idx["tk0"]

	o := LeaderOptions{ClusterID: hbCluster, Self: hbSelf, Source: hbSource, Followers: hbFollowers,
		Interval: time.Second, Lease: time.Minute, Syscall: !mmap, Key: key}
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	l := &Leader{opts: o, slots: map[uint64]int{}, mmap: mmap}
	l.arm = func(d time.Duration) error { f.armed = append(f.armed, d); return nil }
	spec, err := loadLeader()
	if err != nil {
		t.Fatal(err)
	}
	if !mmap {
		for _, name := range []string{"leader_lease", "leader_state"} {
			spec.Maps[name].Flags &^= unix.BPF_F_MMAPABLE
		}
	}
	cfg := pacer.Config{Backend: pacer.BackendID(pacer.BackendConveyor), Ifindex: uint32(f.tickIfx),
		PeerIfindex: uint32(f.tickIfx), TickIfindex: uint32(f.tickIfx), TickPeerIfindex: uint32(f.tickIfx),
		DevIfindex: 1002, TickBytes: 128, EarlyNs: uint64(50 * time.Microsecond), LostNs: uint64(time.Second)}
	if err := (pacer.Client{Config: cfg}).Bind(spec, nil); err != nil {
		t.Fatal(err)
	}
	if err := bpfx.LoadAndAssign("raft leader", spec, &l.objs, nil); err != nil {
		var le *bpfx.LoadError
		if errors.As(err, &le) {
			t.Log(le.Full())
		}
		t.Fatal(err)
	}
	if err := l.fillAuth(true); err != nil {
		t.Fatal(err)
	}
	if mmap {
		if l.lmem, err = mapMemory(l.objs.LeaderLease); err != nil {
			t.Fatal(err)
		}
		if l.smem, err = mapMemory(l.objs.LeaderState); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	l.initLease()
	if err := l.writeAll(); err != nil {
		t.Fatal(err)
	}
	// Followers 2 and 3 resolved (through hb1), 4 not: user space heartbeats it.
	for i := range 2 {
		l.mu.Lock()
		l.setSlot(i, 1, nextHop{ifindex: f.outIfx, smac: hbSMAC, dmac: hbDMAC})
		l.mu.Unlock()
	}
	f.l = l
	return f
}

// tickFrame is a pacer tick frame for deadline with magic, as the pacer delivers it (128
// bytes).
func tickFrame(deadline uint64, magic uint64) []byte {
	return pacer.TickFrame(pacer.Tick{Magic: magic, DeadlineNs: deadline, SentNs: deadline}, 128)
}

const tickMagic = pacer.TickMagic

func (f *leaderFixture) run(in []byte) uint32 {
	f.t.Helper()
	ctx := make([]byte, 44)
	binary.NativeEndian.PutUint32(ctx[40:], uint32(f.tickIfx))
	opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+bpftest.OutPad+256), Context: ctx, Repeat: 1}
	var ret uint32
	var err error
	if derr := f.ns.Do(func() error { ret, err = f.l.objs.LeaderTick.Run(&opts); return nil }); derr != nil {
		f.t.Fatal(derr)
	}
	if err != nil {
		f.t.Fatalf("run leader_tick: %v", err)
	}
	return ret
}

func (f *leaderFixture) counters() bpftest.Counters {
	f.t.Helper()
	c, err := bpftest.SumPerCPU[leaderRaftLeaderStats](f.l.objs.LeaderCounters)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *leaderFixture) armedNs() uint64 {
	var s pacer.State
	if err := f.l.objs.PacerArming.Lookup(uint32(0), &s); err != nil {
		f.t.Fatal(err)
	}
	return s.ArmedNs
}

func (f *leaderFixture) setArmed(v uint64) {
	if err := f.l.objs.PacerArming.Put(uint32(0), pacer.State{ArmedNs: v}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *leaderFixture) state() leaderRaftLeaderState {
	var s leaderRaftLeaderState
	if err := f.l.objs.LeaderState.Lookup(uint32(0), &s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *leaderFixture) putState(s leaderRaftLeaderState) {
	f.t.Helper()
	if err := f.l.objs.LeaderState.Put(uint32(0), s); err != nil {
		f.t.Fatal(err)
	}
}

// capture opens a packet socket on hb0 in the test namespace.
func (f *leaderFixture) capture() int {
	f.t.Helper()
	var fd int
	err := f.ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(bpfx.Htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: bpfx.Htons(unix.ETH_P_ALL), Ifindex: f.capIfx})
	})
	if err != nil {
		f.t.Fatalf("capture socket: %v", err)
	}
	f.t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		f.t.Fatal(err)
	}
	return fd
}

// heartbeats reads IPv4/UDP frames from fd until the timeout (IPv6 neighbour discovery on
// the fresh veth is skipped).
func heartbeats(t *testing.T, fd int) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 2048)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return out
			}
			t.Fatalf("capture: %v", err)
		}
		fr := append([]byte(nil), buf[:n]...)
		if n >= 34 && binary.BigEndian.Uint16(fr[12:]) == 0x0800 && fr[23] == unix.IPPROTO_UDP {
			out = append(out, fr)
		}
	}
}

// wantHeartbeat is what the node's transport sends for etcd-raft's heartbeat to f.
func wantHeartbeat(t *testing.T, to, term, commit uint64) []byte {
	m := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(hbSelf), To: proto.Uint64(to),
		Term: proto.Uint64(term), Commit: proto.Uint64(commit)}
	var b [wire.PktLen]byte
	p, err := wire.Encode(b[:], hbCluster, m)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), p...)
}

func checkHeartbeat(t *testing.T, fr []byte, f Target, term, commit uint64) {
	t.Helper()
	if [6]byte(fr[0:6]) != hbDMAC || [6]byte(fr[6:12]) != hbSMAC {
		t.Errorf("heartbeat to %d: MACs %x -> %x", f.ID, fr[6:12], fr[0:6])
	}
	checkHeartbeatFrom(t, fr, hbSource, f, term, commit, nil)
}

// checkHeartbeatFrom checks a captured heartbeat frame against what the transport sends.
func checkHeartbeatFrom(t *testing.T, fr []byte, source netip.AddrPort, f Target, term, commit uint64, v *wire.Verifier) {
	t.Helper()
	if len(fr) != hbFrameLen {
		t.Fatalf("heartbeat frame %d bytes, want %d", len(fr), hbFrameLen)
	}
	if err := pktbuild.VerifyChecksums(fr); err != nil {
		t.Errorf("heartbeat to %d: %v", f.ID, err)
	}
	ip := fr[14:]
	src, _ := netip.AddrFromSlice(ip[12:16])
	dst, _ := netip.AddrFromSlice(ip[16:20])
	udp := ip[20:]
	if got := netip.AddrPortFrom(src, binary.BigEndian.Uint16(udp[0:])); got != source {
		t.Errorf("heartbeat to %d from %v, want %v", f.ID, got, source)
	}
	if got := netip.AddrPortFrom(dst, binary.BigEndian.Uint16(udp[2:])); got != f.Addr {
		t.Errorf("heartbeat to %d sent to %v, want %v", f.ID, got, f.Addr)
	}
	if binary.BigEndian.Uint16(udp[6:]) == 0 {
		t.Errorf("heartbeat to %d without a UDP checksum", f.ID)
	}
	payload := udp[8:]
	want := wantHeartbeat(t, f.ID, term, commit)
	if v != nil { // signed: the transport's encoding plus the MAC flag, auth_seq and MAC
		want[6] |= wire.FlagMAC
		copy(want[88:], payload[88:])
	}
	if string(payload) != string(want) {
		t.Errorf("heartbeat to %d differs from the transport's encoding:\n%s", f.ID, bpftest.DiffBytes(payload, want))
	}
	if v == nil {
		v = wire.NewVerifier(nil)
	}
	r := wire.Receiver{Cluster: hbCluster, Self: f.ID, Peers: map[uint64]netip.AddrPort{hbSelf: source}, Verifier: v}
	m, reason := r.Receive(payload, source)
	if reason != wire.OK {
		t.Fatalf("heartbeat to %d refused by the follower's receiver: %v", f.ID, reason)
	}
	if m.GetType() != pb.MsgHeartbeat || m.GetFrom() != hbSelf || m.GetTerm() != term || m.GetCommit() != commit {
		t.Errorf("heartbeat to %d decodes as %v", f.ID, m)
	}
}

func TestFixturesLeaderTick(t *testing.T) {
	for _, mmap := range []bool{true, false} {
		t.Run(map[bool]string{true: "mmap", false: "syscall"}[mmap], func(t *testing.T) {
			f := newLeaderFixture(t, mmap)
			fd := f.capture()
			heartbeats(t, fd) // drain what the link-up sent

			// Lease fresh: committed 50; follower 2 matched 60 (Commit = 50), follower 3
			// matched 17 (Commit = 17), follower 4 has no route (user space sends its).
			f.l.Update(true, hbTerm, 50, map[uint64]uint64{2: 60, 3: 17, 4: 50})
			if len(f.armed) != 1 {
				t.Fatalf("first renewal armed %d ticks, want 1", len(f.armed))
			}
			if !f.l.Suppress(2, hbTerm) || !f.l.Suppress(3, hbTerm) {
				t.Errorf("heartbeats to the resolved followers not suppressed")
			}
			if f.l.Suppress(4, hbTerm) || f.l.Suppress(2, hbTerm+1) || f.l.Suppress(9, hbTerm) {
				t.Errorf("suppressed a heartbeat the kernel does not send (unresolved follower, other term, unknown)")
			}
			now := uint64(pacer.Now())
			f.setArmed(now)
			var d bpftest.Counters
			d = delta(f, func() {
				if ret := f.run(tickFrame(now, tickMagic)); ret != 2 { // TC_ACT_SHOT
					t.Errorf("verdict %d, want TC_ACT_SHOT", ret)
				}
			})
			if diff := d.Diff(bpftest.Counters{"Ticks": 1, "TicksSent": 1, "Heartbeats": 2, "Inactive": 1, "Rearmed": 1}); diff != "" {
				t.Errorf("fresh lease: %s", diff)
			}
			got := heartbeats(t, fd)
			if len(got) != 2 {
				t.Fatalf("fresh lease: %d heartbeats captured, want 2", len(got))
			}
			checkHeartbeat(t, got[0], hbFollowers[0], hbTerm, 50)
			checkHeartbeat(t, got[1], hbFollowers[1], hbTerm, 17)
			st := f.state()
			if st.Rounds != 1 || st.Sent[0] != 1 || st.Sent[1] != 1 || st.Sent[2] != 0 {
				t.Errorf("state after a round: %+v", st)
			}
			if a := f.armedNs(); a != st.NextNs || st.NextNs < now+uint64(time.Second) {
				t.Errorf("next tick armed at %d, next round %d: want now+interval (now %d)", a, st.NextNs, now)
			}

			// The kernel's round on time: user space leaves the heartbeats to it. Overdue
			// by more than half an interval (its tick late: under CPU stress the pacer's
			// came up to 9 ms late): user space sends them too (mmap mode: it reads the
			// state by a load), and again leaves them once the kernel is back on time.
			if !f.l.Suppress(2, hbTerm) {
				t.Errorf("round on time: heartbeat not suppressed")
			}
			onTime := st.NextNs
			st.NextNs = uint64(pacer.Now()) - uint64(f.l.opts.Interval)/2 - 1
			f.putState(st)
			if got := f.l.Suppress(2, hbTerm); got != !mmap {
				t.Errorf("kernel round overdue: suppressed %v, want %v", got, !mmap)
			}
			if s, err := f.l.Stats(); err != nil || (s.Overdue == 1) != mmap {
				t.Errorf("kernel round overdue: Overdue %d (%v)", s.Overdue, err)
			}
			st.NextNs = onTime
			f.putState(st)
			if !f.l.Suppress(2, hbTerm) {
				t.Errorf("round back on time: heartbeat not suppressed")
			}

			// A tick with nothing due (a stale or user-armed tick before the next round):
			// nothing sent, the next round's tick requested again (already armed: coalesced).
			d = delta(f, func() { f.run(tickFrame(now, tickMagic)) })
			if diff := d.Diff(bpftest.Counters{"Ticks": 1, "TicksEarly": 1, "RearmCoalesced": 1}); diff != "" {
				t.Errorf("nothing due: %s", diff)
			}
			if got := heartbeats(t, fd); len(got) != 0 {
				t.Errorf("nothing due: %d heartbeats sent", len(got))
			}

			// The renewal moves commits (follower 3 caught up) without a new tick armed.
			f.l.Update(true, hbTerm, 80, map[uint64]uint64{2: 80, 3: 80})
			if len(f.armed) != 1 {
				t.Errorf("renewal of a running sender armed a tick (%d)", len(f.armed))
			}
			f.forceDue()
			d = delta(f, func() { f.run(tickFrame(f.armedNs(), tickMagic)) })
			if diff := d.Diff(bpftest.Counters{"Ticks": 1, "TicksSent": 1, "Heartbeats": 2, "Inactive": 1, "Rearmed": 1}); diff != "" {
				t.Errorf("second round: %s", diff)
			}
			got = heartbeats(t, fd)
			if len(got) != 2 {
				t.Fatalf("second round: %d heartbeats, want 2", len(got))
			}
			checkHeartbeat(t, got[0], hbFollowers[0], hbTerm, 80)
			checkHeartbeat(t, got[1], hbFollowers[1], hbTerm, 80)

			// Lease expired: nothing sent, no next tick (the sender stops).
			f.l.mu.Lock()
			f.l.setExpires(uint64(pacer.Now()) - 1)
			if err := f.l.flush(); err != nil {
				t.Fatal(err)
			}
			f.l.mu.Unlock()
			f.forceDue()
			f.setArmed(0)
			d = delta(f, func() { f.run(tickFrame(uint64(pacer.Now()), tickMagic)) })
			if diff := d.Diff(bpftest.Counters{"Ticks": 1, "TicksExpired": 1}); diff != "" {
				t.Errorf("expired lease: %s", diff)
			}
			if got := heartbeats(t, fd); len(got) != 0 {
				t.Errorf("expired lease: %d heartbeats sent", len(got))
			}
			if a := f.armedNs(); a != 0 {
				t.Errorf("expired lease: a tick was armed (%d)", a)
			}
			if f.l.Suppress(2, hbTerm) {
				t.Errorf("expired lease: user space still suppresses heartbeats")
			}
			// The renewal after a lapse starts the sender again.
			f.l.Update(true, hbTerm, 80, map[uint64]uint64{2: 80, 3: 80})
			if len(f.armed) != 2 {
				t.Errorf("renewal after a lapse armed %d ticks in all, want 2", len(f.armed))
			}

			// Not leader any more: the lease is dropped at once.
			f.l.Update(false, hbTerm+1, 80, nil)
			f.forceDue()
			d = delta(f, func() { f.run(tickFrame(uint64(pacer.Now()), tickMagic)) })
			if diff := d.Diff(bpftest.Counters{"Ticks": 1, "TicksNoLease": 1}); diff != "" {
				t.Errorf("no lease: %s", diff)
			}
			if got := heartbeats(t, fd); len(got) != 0 {
				t.Errorf("no lease: %d heartbeats sent", len(got))
			}

			// A new term: commits start from zero (a new leadership's progress).
			f.l.Update(true, hbTerm+2, 90, map[uint64]uint64{2: 0, 3: 95})
			f.forceDue()
			f.run(tickFrame(uint64(pacer.Now()), tickMagic))
			got = heartbeats(t, fd)
			if len(got) != 2 {
				t.Fatalf("new term: %d heartbeats, want 2", len(got))
			}
			checkHeartbeat(t, got[0], hbFollowers[0], hbTerm+2, 0)
			checkHeartbeat(t, got[1], hbFollowers[1], hbTerm+2, 90)
		})
	}
}

// forceDue makes the next round due now (as if the interval had passed).
func (f *leaderFixture) forceDue() {
	f.t.Helper()
	st := f.state()
	st.NextNs = uint64(pacer.Now()) - 1
	if err := f.l.objs.LeaderState.Put(uint32(0), st); err != nil {
		f.t.Fatal(err)
	}
}

func delta(f *leaderFixture, fn func()) bpftest.Counters {
	before := f.counters()
	fn()
	return f.counters().Sub(before)
}

func TestFixturesLeaderMalformed(t *testing.T) {
	f := newLeaderFixture(t, HaveMmapableArray())
	fd := f.capture()
	f.l.Update(true, hbTerm, 5, map[uint64]uint64{2: 5, 3: 5})
	heartbeats(t, fd)
	now := uint64(pacer.Now())
	udp := pktbuild.New().IPv4(pktbuild.IPv4{}).UDP(pktbuild.UDP{Src: 1, Dst: 2}).Payload(make([]byte, 40)).Build()
	bad := tickFrame(now, tickMagic^1)
	for _, c := range []struct {
		name string
		in   []byte
		want bpftest.Counters
	}{
		{"bad magic", bad, bpftest.Counters{"RxMalformed": 1}},
		{"truncated tick", tickFrame(now, tickMagic)[:14+20+12], bpftest.Counters{"RxMalformed": 1}},
		{"not a tick (carried)", udp, bpftest.Counters{"Carried": 1}},
		{"bad lease interval", nil, bpftest.Counters{"Ticks": 1, "TicksBadLease": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			if in == nil {
				f.l.mu.Lock()
				f.l.cur.IntervalNs = 1000
				if f.l.mmap {
					f.l.store64(offInterval, 1000)
				}
				if err := f.l.flush(); err != nil {
					t.Fatal(err)
				}
				f.l.mu.Unlock()
				f.forceDue()
				in = tickFrame(uint64(pacer.Now()), tickMagic)
			}
			d := delta(f, func() {
				if ret := f.run(in); ret != 2 {
					t.Errorf("verdict %d, want TC_ACT_SHOT", ret)
				}
			})
			if diff := d.Diff(c.want); diff != "" {
				t.Error(diff)
			}
			if got := heartbeats(t, fd); len(got) != 0 {
				t.Errorf("%d heartbeats sent", len(got))
			}
		})
	}
}

// TestFixturesLeaderSigned: with a cluster key every heartbeat carries RAFT_F_MAC, a fresh
// kernel-channel auth_seq and the MAC the follower's receiver checks; a replayed one is
// refused, and a receiver with another key refuses them all.
func TestFixturesLeaderSigned(t *testing.T) {
	key, err := wire.ParseKey("000102030405060708090a0b0c0d0e0f")
	if err != nil {
		t.Fatal(err)
	}
	f := newKeyedLeaderFixture(t, HaveMmapableArray(), &key)
	fd := f.capture()
	heartbeats(t, fd)
	f.l.Update(true, hbTerm, 9, map[uint64]uint64{2: 9, 3: 4})
	v := wire.NewVerifier(&key)
	var first [][]byte
	for round := range 2 {
		f.forceDue()
		f.run(tickFrame(uint64(pacer.Now()), tickMagic))
		got := heartbeats(t, fd)
		if len(got) != 2 {
			t.Fatalf("round %d: %d heartbeats, want 2", round, len(got))
		}
		checkHeartbeatFrom(t, got[0], hbSource, hbFollowers[0], hbTerm, 9, v)
		checkHeartbeatFrom(t, got[1], hbSource, hbFollowers[1], hbTerm, 4, v)
		for _, fr := range got {
			if seq := binary.BigEndian.Uint64(fr[42+88:]); seq&wire.SeqKernel == 0 {
				t.Errorf("auth_seq %#x not on the kernel channel", seq)
			}
		}
		if round == 0 {
			first = got
		}
	}
	if r := v.Verify(first[0][42:]); r != wire.DropReplay && r != wire.DropStale {
		t.Errorf("replayed heartbeat: %v, want replay", r)
	}
	other, _ := wire.ParseKey("ff0102030405060708090a0b0c0d0e0f")
	if r := wire.NewVerifier(&other).Verify(first[1][42:]); r != wire.DropMAC {
		t.Errorf("heartbeat checked with another key: %v, want mac", r)
	}
}
