package offload

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/kedge-dev/kedge/pkg/kedge"
	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// TestMain checks for leaked descriptors and removes the kedge binary the lab tests built.
func TestMain(m *testing.M) {
	code := bpftest.CheckFDLeaks(m)
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}

// The fixtures' cluster: this node is 2, the leader 1 at leader4/leader6, another peer 3.
const (
	fxCluster = 42
	fxSelf    = 2
	fxLeader  = 1
	fxOther   = 3
	fxTerm    = 5
	fxPort    = 7000
)

var (
	self4   = netip.MustParseAddrPort("10.77.0.2:7000")
	leader4 = netip.MustParseAddrPort("10.77.0.1:7000")
	other4  = netip.MustParseAddrPort("10.77.0.3:7000")
	self6   = netip.MustParseAddrPort("[fd00:77::2]:7000")
	leader6 = netip.MustParseAddrPort("[fd00:77::1]:7000")
	macSelf = pktbuild.MAC{0x02, 0, 0, 0, 0, 0x02}
	macGw   = pktbuild.MAC{0x02, 0, 0, 0, 0, 0xfe}
)

// msg is the raft message of a fixture, with defaults for the usual heartbeat.
type msg struct {
	typ                  pb.MessageType
	from, to, term, comm uint64
	ctx                  []byte
	cluster              uint64
}

func heartbeatMsg() msg {
	return msg{typ: pb.MsgHeartbeat, from: fxLeader, to: fxSelf, term: fxTerm, comm: 17, ctx: nil, cluster: fxCluster}
}

// message is a raft message with the non-zero fields set, as wire.Decode returns them.
func message(typ pb.MessageType, from, to, term, commit uint64, ctx []byte) *pb.Message {
	m := &pb.Message{Type: typ.Enum(), To: proto.Uint64(to), Context: ctx}
	for _, f := range []struct {
		dst **uint64
		v   uint64
	}{{&m.From, from}, {&m.Term, term}, {&m.Commit, commit}} {
		if f.v != 0 {
			*f.dst = proto.Uint64(f.v)
		}
	}
	return m
}

func (m msg) payload(t testing.TB) []byte {
	t.Helper()
	var b [wire.PktLen]byte
	p, err := wire.Encode(b[:], m.cluster, message(m.typ, m.from, m.to, m.term, m.comm, m.ctx))
	if err != nil {
		t.Fatalf("encode fixture: %v", err)
	}
	return bytes.Clone(p)
}

// frame builds Ethernet/IP/UDP around payload from src to dst.
func frame(src, dst netip.AddrPort, ipID uint16, payload []byte) []byte {
	b := pktbuild.New().Ether(pktbuild.Ether{Src: macGw, Dst: macSelf})
	if src.Addr().Is4() {
		b = b.IPv4(pktbuild.IPv4{Src: src.Addr(), Dst: dst.Addr(), TTL: 63, ID: ipID})
	} else {
		b = b.IPv6(pktbuild.IPv6{Src: src.Addr(), Dst: dst.Addr(), HopLimit: 63})
	}
	return b.UDP(pktbuild.UDP{Src: src.Port(), Dst: dst.Port()}).Payload(payload).Build()
}

// reply is the frame the program must send back for a heartbeat from src to dst.
func reply(t testing.TB, src, dst netip.AddrPort, ipID uint16, term uint64, ctx []byte) []byte {
	t.Helper()
	var b [wire.PktLen]byte
	p, err := wire.Encode(b[:], fxCluster, message(pb.MsgHeartbeatResp, fxSelf, fxLeader, term, 0, ctx))
	if err != nil {
		t.Fatalf("encode reply: %v", err)
	}
	bl := pktbuild.New().Ether(pktbuild.Ether{Src: macSelf, Dst: macGw})
	if src.Addr().Is4() {
		bl = bl.IPv4(pktbuild.IPv4{Src: dst.Addr(), Dst: src.Addr(), TTL: 64, ID: ipID})
	} else {
		bl = bl.IPv6(pktbuild.IPv6{Src: dst.Addr(), Dst: src.Addr(), HopLimit: 64})
	}
	return bl.UDP(pktbuild.UDP{Src: dst.Port(), Dst: src.Port()}).Payload(p).Build()
}

func loadFixture(t *testing.T, opts FollowerOptions) *Follower {
	t.Helper()
	bpftest.RequireRoot(t)
	if err := Probe(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	opts.ClusterID, opts.Self, opts.RaftAddr = fxCluster, fxSelf, self4
	if opts.Peers == nil {
		opts.Peers = []wire.AuthPeer{{ID: fxLeader, Addr: leader4}, {ID: fxOther, Addr: other4}}
	}
	f, err := newFollower(opts)
	if err != nil {
		t.Fatalf("load follower: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func counters(f *Follower) func() (bpftest.Counters, error) {
	return func() (bpftest.Counters, error) {
		cs, err := f.Stats()
		if err != nil {
			return nil, err
		}
		out := bpftest.Counters{}
		for _, c := range cs {
			out[c.Name] = int64(c.Value)
		}
		return out, nil
	}
}

// verifyReply checks the reply's checksums and that the leader's transport would accept it:
// wire.Decode as node 1 gives the MsgHeartbeatResp etcd-raft's follower sends.
func verifyReply(term uint64, ctx []byte) func(testing.TB, bpftest.Result) {
	return func(t testing.TB, r bpftest.Result) {
		out := r.Out
		t.Helper()
		if err := pktbuild.VerifyChecksums(out); err != nil {
			t.Errorf("reply checksums: %v", err)
		}
		m, reason := wire.Decode(out[len(out)-wire.PktLen:], fxCluster, fxLeader)
		if reason != wire.OK {
			t.Fatalf("leader refuses the reply: %v", reason)
		}
		want := message(pb.MsgHeartbeatResp, fxSelf, fxLeader, term, 0, ctx)
		if !proto.Equal(m, want) {
			t.Errorf("reply decodes as %v, want %v", m, want)
		}
	}
}

func TestFollowerFixtures(t *testing.T) {
	// Detect is also the election timeout of the pre-vote lease (prevote.h).
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Detect: time.Hour})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	r := bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}
	hb := heartbeatMsg()
	withCtx := hb
	withCtx.ctx = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	mod := func(m msg, fn func(*msg)) msg { fn(&m); return m }
	answered := bpftest.Counters{"rx": 1, "hb_answered": 1, "detect_armed": 1}
	passed := func(c string) bpftest.Counters { return bpftest.Counters{"rx": 1, c: 1} }
	dropped := func(r wire.Reason) bpftest.Counters { return bpftest.Counters{"rx": 1, "drop_" + r.String(): 1} }
	good := frame(leader4, self4, 77, hb.payload(t))

	cases := []bpftest.Case{
		{Name: "heartbeat answered", In: good, WantRet: bpftest.XDPTx,
			WantOut: reply(t, leader4, self4, 77, fxTerm, nil), Check: verifyReply(fxTerm, nil), WantCounters: answered},
		{Name: "heartbeat with read context answered, context echoed", In: frame(leader4, self4, 78, withCtx.payload(t)), WantRet: bpftest.XDPTx,
			WantOut: reply(t, leader4, self4, 78, fxTerm, withCtx.ctx), Check: verifyReply(fxTerm, withCtx.ctx), WantCounters: answered},
		{Name: "stale term passed", In: frame(leader4, self4, 1, mod(hb, func(m *msg) { m.term = fxTerm - 1 }).payload(t)),
			WantRet: bpftest.XDPPass, WantCounters: passed("hb_stale_term")},
		{Name: "newer term passed (term change is durable: user space)", In: frame(leader4, self4, 1, mod(hb, func(m *msg) { m.term = fxTerm + 1 }).payload(t)),
			WantRet: bpftest.XDPPass, WantCounters: passed("hb_new_term")},
		{Name: "wrong leader passed", In: frame(other4, self4, 1, mod(hb, func(m *msg) { m.from = fxOther }).payload(t)),
			WantRet: bpftest.XDPPass, WantCounters: passed("hb_leader")},
		{Name: "unknown peer dropped", In: frame(netip.MustParseAddrPort("10.77.0.99:7000"), self4, 1, mod(hb, func(m *msg) { m.from = 99 }).payload(t)),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropPeer)},
		{Name: "leader id from another address dropped", In: frame(other4, self4, 1, hb.payload(t)),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropPeer)},
		{Name: "leader id from another port dropped", In: frame(netip.AddrPortFrom(leader4.Addr(), 7001), self4, 1, hb.payload(t)),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropPeer)},
		{Name: "mac without a cluster key dropped", In: frame(leader4, self4, 1, func() []byte { p := hb.payload(t); p[6] |= wire.FlagMAC; return p }()),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropFlags)},
		{Name: "truncated raft header dropped", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: leader4.Addr(), Dst: self4.Addr()}).
			UDP(pktbuild.UDP{Src: fxPort, Dst: fxPort}).Payload(hb.payload(t)[:60]).Build(),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropShort)},
		{Name: "frame cut inside the raft header dropped", In: pktbuild.Truncate(good, len(good)-10),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropShort)},
		{Name: "long payload dropped", In: frame(leader4, self4, 1, append(hb.payload(t), 0, 0, 0, 0)),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropLong)},
		{Name: "bad magic dropped", In: frame(leader4, self4, 1, func() []byte { p := hb.payload(t); p[0] ^= 0xff; return p }()),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropMagic)},
		{Name: "bad version dropped", In: frame(leader4, self4, 1, func() []byte { p := hb.payload(t); p[4] = 9; return p }()),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropVersion)},
		{Name: "nonzero context padding dropped", In: frame(leader4, self4, 1, func() []byte { p := hb.payload(t); p[72+15] = 1; return p }()),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropCtx)},
		{Name: "wrong cluster dropped", In: frame(leader4, self4, 1, mod(hb, func(m *msg) { m.cluster = 43 }).payload(t)),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropCluster)},
		{Name: "addressed to another node dropped", In: frame(leader4, self4, 1, mod(hb, func(m *msg) { m.to = fxOther }).payload(t)),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropTo)},
		{Name: "message type not allowed on udp dropped", In: frame(leader4, self4, 1, func() []byte { p := hb.payload(t); p[5] = 2; return p }()),
			WantRet: bpftest.XDPDrop, WantCounters: dropped(wire.DropType)},
		{Name: "append probe passed to user space", In: frame(leader4, self4, 1, mod(hb, func(m *msg) { m.typ = pb.MsgApp }).payload(t)),
			WantRet: bpftest.XDPPass, WantCounters: passed("passed_type")},
		{Name: "vote passed to user space", In: frame(other4, self4, 1, mod(hb, func(m *msg) { m.typ = pb.MsgVote; m.from = fxOther; m.term = fxTerm + 1; m.comm = 0 }).payload(t)),
			WantRet: bpftest.XDPPass, WantCounters: passed("passed_type")},
		{Name: "pre-vote within the leader's lease dropped", In: frame(other4, self4, 1, mod(hb, func(m *msg) { m.typ = pb.MsgPreVote; m.from = fxOther; m.term = fxTerm + 1; m.comm = 0 }).payload(t)),
			WantRet: bpftest.XDPDrop, WantCounters: passed("pv_dropped")},
		{Name: "udp to another port untouched", In: frame(leader4, netip.AddrPortFrom(self4.Addr(), 7001), 1, hb.payload(t)),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"not_raft": 1}},
		{Name: "tcp to the raft port untouched", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: leader4.Addr(), Dst: self4.Addr()}).
			TCP(pktbuild.TCP{Src: 40000, Dst: fxPort}).Payload(hb.payload(t)).Build(),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"not_raft": 1}},
		{Name: "arp untouched", In: pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build(),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"not_raft": 1}},
		{Name: "malformed ip header untouched", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: leader4.Addr(), Dst: self4.Addr(), IHL: new(3)}).
			UDP(pktbuild.UDP{Src: fxPort, Dst: fxPort}).Payload(hb.payload(t)).Build(),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"not_raft": 1}},
	}
	r.Run(t, cases)

	// The heartbeat map holds what the answered heartbeats said.
	got, err := f.Heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	if got.Leader != fxLeader || got.Term != fxTerm || got.Commit != 17 || got.Count != 2 || got.Arrival <= 0 || got.Arrival > Monotonic() {
		t.Errorf("heartbeat map %+v, want leader %d term %d commit 17 count 2 and an arrival in the past", got, fxLeader, fxTerm)
	}
}

func TestFollowerFixturesIPv6(t *testing.T) {
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Peers: []wire.AuthPeer{{ID: fxLeader, Addr: leader6}}})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader6, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	hb := heartbeatMsg()
	hb.ctx = []byte("abcdefghijklmnop")
	bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}.Run(t, []bpftest.Case{
		{Name: "heartbeat over ipv6 answered", In: frame(leader6, self6, 0, hb.payload(t)), WantRet: bpftest.XDPTx,
			WantOut: reply(t, leader6, self6, 0, fxTerm, hb.ctx), Check: verifyReply(fxTerm, hb.ctx),
			WantCounters: bpftest.Counters{"rx": 1, "hb_answered": 1}},
		{Name: "leader id from its ipv4 address dropped", In: frame(leader4, self4, 0, hb.payload(t)), WantRet: bpftest.XDPDrop,
			WantCounters: bpftest.Counters{"rx": 1, "drop_peer": 1}},
	})
}

// The leader's address as mirrored is checked too (defence in depth beside the allowlist):
// a node whose mirror names another address for the leader answers nothing.
func TestFollowerLeaderAddressMismatch(t *testing.T) {
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader6, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}.Run(t, []bpftest.Case{
		{Name: "allowed, but not the mirrored leader address", In: frame(leader4, self4, 0, heartbeatMsg().payload(t)),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"rx": 1, "hb_leader_addr": 1}},
	})
}

// With a cluster key: signed heartbeats are answered with a reply the leader's verifier
// accepts (kernel channel, bit 63 of auth_seq); unsigned, forged and replayed ones are
// dropped before user space.
func TestFollowerFixturesKeyed(t *testing.T) {
	key, err := wire.ParseKey("000102030405060708090a0b0c0d0e0f")
	if err != nil {
		t.Fatal(err)
	}
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Key: &key})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	leaderSigner := wire.NewSigner(&key)
	leaderVerifier := wire.NewVerifier(&key)
	signed := func() []byte { p := heartbeatMsg().payload(t); leaderSigner.Sign(p); return p }
	first := signed()
	forged := signed()
	forged[56] ^= 1 // commit changed after signing
	otherKey := key
	otherKey[0] ^= 1
	wrongKey := heartbeatMsg().payload(t)
	wire.NewSigner(&otherKey).Sign(wrongKey)
	checkSigned := func(tb testing.TB, r bpftest.Result) {
		out := r.Out
		tb.Helper()
		if err := pktbuild.VerifyChecksums(out); err != nil {
			tb.Errorf("reply checksums: %v", err)
		}
		p := out[len(out)-wire.PktLen:]
		if r := leaderVerifier.Verify(p); r != wire.OK {
			tb.Fatalf("the leader's verifier refuses the signed reply: %v", r)
		}
		if seq := binary.BigEndian.Uint64(p[88:]); seq&wire.SeqKernel == 0 {
			tb.Errorf("reply auth_seq %#x is not on the kernel channel", seq)
		}
	}
	bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}.Run(t, []bpftest.Case{
		{Name: "signed heartbeat answered with a signed reply", In: frame(leader4, self4, 1, first), WantRet: bpftest.XDPTx,
			Check: checkSigned, WantCounters: bpftest.Counters{"rx": 1, "hb_answered": 1}},
		{Name: "the same packet again dropped as a replay", In: frame(leader4, self4, 1, first), WantRet: bpftest.XDPDrop,
			WantCounters: bpftest.Counters{"rx": 1, "drop_replay": 1}},
		{Name: "unsigned heartbeat dropped", In: frame(leader4, self4, 1, heartbeatMsg().payload(t)), WantRet: bpftest.XDPDrop,
			WantCounters: bpftest.Counters{"rx": 1, "drop_mac": 1}},
		{Name: "changed after signing dropped", In: frame(leader4, self4, 1, forged), WantRet: bpftest.XDPDrop,
			WantCounters: bpftest.Counters{"rx": 1, "drop_mac": 1}},
		{Name: "signed with another key dropped", In: frame(leader4, self4, 1, wrongKey), WantRet: bpftest.XDPDrop,
			WantCounters: bpftest.Counters{"rx": 1, "drop_mac": 1}},
		{Name: "a later signed heartbeat answered", In: frame(leader4, self4, 1, signed()), WantRet: bpftest.XDPTx,
			Check: checkSigned, WantCounters: bpftest.Counters{"rx": 1, "hb_answered": 1}},
	})
}

// The pass mark: with a key, every packet the program verified and passes up carries the
// mark in place of its MAC, with a UDP checksum that still holds (and an IPv4 "no checksum"
// left alone); the node's verifier accepts it by the mark and refuses it without one. A
// packet that arrives carrying the mark is a forgery like any other, and what the program
// sends (its signed replies) keeps its real MAC.
func TestFollowerPassMark(t *testing.T) {
	key, err := wire.ParseKey("000102030405060708090a0b0c0d0e0f")
	if err != nil {
		t.Fatal(err)
	}
	mark, err := wire.NewMark()
	if err != nil {
		t.Fatal(err)
	}
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Key: &key, PassMark: mark})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	leaderSigner := wire.NewSigner(&key)
	signed := func(m msg) []byte { p := m.payload(t); leaderSigner.Sign(p); return p }
	appResp := msg{typ: pb.MsgAppResp, from: fxLeader, to: fxSelf, term: fxTerm, comm: 0, cluster: fxCluster}
	staleHB := heartbeatMsg()
	staleHB.term = fxTerm - 1
	withMark := signed(appResp)
	copy(withMark[96:], mark[:])
	noCsum := func(p []byte) []byte {
		return pktbuild.New().Ether(pktbuild.Ether{Src: macGw, Dst: macSelf}).
			IPv4(pktbuild.IPv4{Src: leader4.Addr(), Dst: self4.Addr(), TTL: 63, ID: 1}).
			UDP(pktbuild.UDP{Src: leader4.Port(), Dst: self4.Port(), Checksum: new(int)}).Payload(p).Build()
	}
	marked := func(wantCsum bool) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, r bpftest.Result) {
			out := r.Out
			tb.Helper()
			p := bytes.Clone(out[len(out)-wire.PktLen:])
			if !bytes.Equal(p[96:], mark[:]) {
				tb.Fatalf("MAC field %x, want the pass mark %x", p[96:], mark[:])
			}
			if err := pktbuild.VerifyChecksums(out); err != nil {
				tb.Errorf("checksums after marking: %v", err)
			}
			if csum := binary.BigEndian.Uint16(out[len(out)-wire.PktLen-2:]); (csum != 0) != wantCsum {
				tb.Errorf("UDP checksum %#04x after marking, want it zero: %v", csum, !wantCsum)
			}
			unmarked := wire.NewVerifier(&key)
			if r := unmarked.Verify(bytes.Clone(p)); r != wire.DropMAC {
				tb.Errorf("a verifier without the mark: %v, want %v", r, wire.DropMAC)
			}
			v := wire.NewVerifier(&key)
			v.SetPassMark(mark)
			if r := v.Verify(p); r != wire.OK || v.Marked.Load() != 1 {
				tb.Errorf("the node's verifier: %v with %d marked, want ok by the mark", r, v.Marked.Load())
			}
		}
	}
	bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}.Run(t, []bpftest.Case{
		{Name: "append response passed up marked", In: frame(leader4, self4, 1, signed(appResp)), WantRet: bpftest.XDPPass,
			Check: marked(true), WantCounters: bpftest.Counters{"rx": 1, "passed_type": 1, "marked": 1}},
		{Name: "heartbeat of an older term passed up marked", In: frame(leader4, self4, 1, signed(staleHB)), WantRet: bpftest.XDPPass,
			Check: marked(true), WantCounters: bpftest.Counters{"rx": 1, "hb_stale_term": 1, "marked": 1}},
		{Name: "no UDP checksum stays none", In: noCsum(signed(appResp)), WantRet: bpftest.XDPPass,
			Check: marked(false), WantCounters: bpftest.Counters{"rx": 1, "passed_type": 1, "marked": 1}},
		{Name: "the mark in place of a MAC dropped", In: frame(leader4, self4, 1, withMark), WantRet: bpftest.XDPDrop,
			WantCounters: bpftest.Counters{"rx": 1, "drop_mac": 1}},
		{Name: "heartbeat answered with its real MAC, not marked", In: frame(leader4, self4, 1, signed(heartbeatMsg())), WantRet: bpftest.XDPTx,
			Check: func(tb testing.TB, r bpftest.Result) {
				out := r.Out
				tb.Helper()
				if r := wire.NewVerifier(&key).Verify(out[len(out)-wire.PktLen:]); r != wire.OK {
					tb.Errorf("the leader refuses the reply: %v", r)
				}
			}, WantCounters: bpftest.Counters{"rx": 1, "hb_answered": 1}},
	})

	// IPv6, where the UDP checksum is mandatory: patched the same way.
	v6 := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Key: &key, PassMark: mark,
		Peers: []wire.AuthPeer{{ID: fxLeader, Addr: leader6}}})
	bpftest.Runner{Prog: v6.objs.RaftxXdp, Counters: counters(v6)}.Run(t, []bpftest.Case{
		{Name: "ipv6 append response passed up marked", In: frame(leader6, self6, 0, signed(appResp)), WantRet: bpftest.XDPPass,
			Check: marked(true), WantCounters: bpftest.Counters{"rx": 1, "passed_type": 1, "marked": 1}},
	})

	// Without a key there is no MAC to replace: packets go up as they came.
	plain := loadFixture(t, FollowerOptions{AliveFor: time.Hour, PassMark: mark})
	in := frame(leader4, self4, 1, appResp.payload(t))
	bpftest.Runner{Prog: plain.objs.RaftxXdp, Counters: counters(plain)}.Run(t, []bpftest.Case{
		{Name: "unkeyed cluster: passed unchanged", In: in, WantRet: bpftest.XDPPass, WantOut: in,
			WantCounters: bpftest.Counters{"rx": 1, "passed_type": 1}},
	})
}

// The gates that hand heartbeats back to user space: no state mirrored yet, no leader known
// for the term, and the alive deadline past. A heartbeat passed up for the alive deadline is
// still the leader's: the record's arrival moves (the answered count does not), so that a
// node whose loop was starved past the bound does not wake to a record that says "silent".
func TestFollowerGates(t *testing.T) {
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour})
	r := bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}
	in := frame(leader4, self4, 1, heartbeatMsg().payload(t))
	step := func(name string, wantRet uint32, want string) {
		t.Helper()
		r.Run(t, []bpftest.Case{{Name: name, In: in, WantRet: wantRet, WantCounters: bpftest.Counters{"rx": 1, want: 1}}})
	}
	record := func() Heartbeat {
		t.Helper()
		hb, err := f.Heartbeat()
		if err != nil {
			t.Fatal(err)
		}
		return hb
	}
	// seen checks that the step's heartbeat moved the record's arrival (answered: the count
	// too) and nothing else.
	seen := func(name string, before Heartbeat, answered bool) {
		t.Helper()
		after := record()
		wantCount := before.Count
		if answered {
			wantCount++
		}
		if after.Arrival <= before.Arrival || after.Leader != fxLeader || after.Term != fxTerm || after.Count != wantCount {
			t.Errorf("%s: record %+v after %+v: want a later arrival from leader %d at term %d, count %d",
				name, after, before, fxLeader, fxTerm, wantCount)
		}
	}
	step("nothing mirrored yet", bpftest.XDPPass, "hb_no_state")
	if err := f.Mirror(Durable{Term: fxTerm, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	step("no leader known for the term", bpftest.XDPPass, "hb_leader")
	if hb := record(); hb.Arrival != 0 || hb.Count != 0 {
		t.Errorf("record %+v after heartbeats of no known leader: want none", hb)
	}
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	before := record()
	step("alive deadline never set", bpftest.XDPPass, "hb_not_alive")
	seen("alive deadline never set", before, false)
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	before = record()
	step("alive and leader known", bpftest.XDPTx, "hb_answered")
	seen("alive and leader known", before, true)
	if err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	before = record()
	step("stopped", bpftest.XDPPass, "hb_not_alive")
	seen("stopped", before, false)

	// The bound: an Alive refresh holds for AliveFor and no longer.
	f.opts.AliveFor = 50 * time.Millisecond
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	deadline := Monotonic() + f.opts.AliveFor
	for Monotonic() < deadline+5*time.Millisecond {
		time.Sleep(5 * time.Millisecond)
	}
	step("alive deadline expired", bpftest.XDPPass, "hb_not_alive")
}

// A heartbeat passed up for the alive deadline re-arms the failure detector: the leader is
// not silent (the node's loop is), and a starved node must not wake to a leader-silent event.
func TestFollowerNotAliveRearms(t *testing.T) {
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Detect: time.Hour})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	in := frame(leader4, self4, 1, heartbeatMsg().payload(t))
	bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}.Run(t, []bpftest.Case{
		{Name: "alive deadline never set: passed, detector armed", In: in, WantRet: bpftest.XDPPass,
			WantCounters: bpftest.Counters{"rx": 1, "hb_not_alive": 1, "detect_armed": 1}},
	})
}

// The failure detector: a heartbeat arms the timer; silence for Detect wakes the node with
// the leader and term of the last answered heartbeat; each heartbeat re-arms it.
// TestFollowerDetector: every answered heartbeat re-arms the failure detector (a bpf_timer);
// after the last one, one leader-silent event names it. The heartbeats go back to back (no
// clock in the test's loop); the only wait is the detector's own timeout, polled with a
// deadline. An event before the last heartbeat can only come from a real silence of at least
// detect (the test descheduled between two sends): it is checked like the last and counted.
func TestFollowerDetector(t *testing.T) {
	const (
		detect = 40 * time.Millisecond
		beats  = 5
	)
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Detect: detect, DetectJitter: 10 * time.Millisecond})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4, LastIndex: 100, LastTerm: fxTerm}); err != nil {
		t.Fatal(err)
	}
	if err := f.Alive(); err != nil {
		t.Fatal(err)
	}
	in := frame(leader4, self4, 1, heartbeatMsg().payload(t))
	for i := 0; i < beats; i++ {
		if res, err := bpftest.Run(f.objs.RaftxXdp, in); err != nil || res.Ret != bpftest.XDPTx {
			t.Fatalf("heartbeat %d: ret %d err %v", i, res.Ret, err)
		}
	}
	last, err := f.Heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	events := 0
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-f.Events():
			events++
			if ev.Leader != fxLeader || ev.Term != fxTerm {
				t.Fatalf("event %+v: want leader %d term %d", ev, fxLeader, fxTerm)
			}
			if silence := ev.Fired - ev.LastArrival; silence < detect {
				t.Fatalf("event after %v of silence, want at least %v", silence, detect)
			}
			if ev.LastArrival != last.Arrival {
				continue // an earlier silence (see above)
			}
			t.Logf("leader silent: event %v after the last heartbeat (detect %v + jitter < 10ms)", ev.Fired-ev.LastArrival, detect)
			cs, err := counters(f)()
			if err != nil {
				t.Fatal(err)
			}
			if cs["detect_armed"] != beats || cs["hb_answered"] != beats || cs["detect_fired"] != int64(events) {
				t.Errorf("counters %v: want detect_armed = hb_answered = %d, detect_fired = %d (events seen)", cs, beats, events)
			}
			return
		case <-timeout:
			t.Fatal("no leader-silent event within 10 s of the last heartbeat")
		}
	}
}

// The Go mirror of struct raftx_state must be what the program reads: the leader port is
// stored in network order.
func TestMirrorLayout(t *testing.T) {
	var st raftxdpRaftxState
	st.LeaderPort = bpfx.Htons(7000)
	b, err := binary.Append(nil, binary.NativeEndian, st)
	if err != nil {
		t.Fatal(err)
	}
	off := 8 + 8 + 8 + 16
	if got := binary.BigEndian.Uint16(b[off:]); got != 7000 {
		t.Errorf("leader port bytes %x, want 7000 in network order", b[off:off+2])
	}
}

// Probe's verdict follows the kernel: from 5.15 (bpf_timer in XDP) everything is there; before,
// a *kedge.FeatureError names what is missing and the minimum kernel (the node then runs
// without offload, or exits 3 with an explicit --offload). The 5.10 guest of the kernel
// matrix takes the second branch.
func TestProbeMatchesKernel(t *testing.T) {
	recent, rel := bpftest.KernelAtLeast(t, 5, 15)
	err := Probe()
	if recent {
		if err != nil {
			t.Fatalf("kernel %s: Probe: %v, want nil", rel, err)
		}
		return
	}
	var fe *kedge.FeatureError
	if !errors.Is(err, kedge.ErrNotSupported) || !errors.As(err, &fe) || fe.MinKernel == "" {
		t.Fatalf("kernel %s: Probe: %v, want a FeatureError with a minimum kernel", rel, err)
	}
	if os.Geteuid() == 0 {
		if _, lerr := LoadDetached(FollowerOptions{ClusterID: 1, Self: 1, RaftAddr: self4}); !errors.Is(lerr, kedge.ErrNotSupported) {
			t.Errorf("kernel %s: LoadDetached: %v, want the FeatureError", rel, lerr)
		}
	}
	t.Logf("kernel %s: %v", rel, err)
}

// Pre-votes through the follower program (prevote.h's rules have their own fixtures in
// internal/raft/wire): the wiring - lease from the heartbeats answered here, the answer built
// in place, signed and turned around, the candidate's decoder accepting it.
func TestFollowerPreVote(t *testing.T) {
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Detect: time.Hour})
	r := bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}
	pv := func(term, logTerm, index uint64) []byte {
		var b [wire.PktLen]byte
		m := message(pb.MsgPreVote, fxOther, fxSelf, term, 0, nil)
		m.LogTerm, m.Index = proto.Uint64(logTerm), proto.Uint64(index)
		p, err := wire.Encode(b[:], fxCluster, m)
		if err != nil {
			t.Fatal(err)
		}
		return frame(other4, self4, 9, p)
	}
	answer := func(term uint64, reject bool) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, r bpftest.Result) {
			out := r.Out
			tb.Helper()
			if err := pktbuild.VerifyChecksums(out); err != nil {
				tb.Errorf("reply checksums: %v", err)
			}
			m, reason := wire.Decode(out[len(out)-wire.PktLen:], fxCluster, fxOther)
			if reason != wire.OK {
				tb.Fatalf("the candidate refuses the answer: %v", reason)
			}
			if m.GetType() != pb.MsgPreVoteResp || m.GetFrom() != fxSelf || m.GetTerm() != term || m.GetReject() != reject {
				tb.Errorf("answer %v, want MsgPreVoteResp from %d term %d reject %v", m, fxSelf, term, reject)
			}
		}
	}
	tx := bpftest.Counters{"rx": 1, "pv_answered": 1}
	mirror := func(leader uint64) {
		t.Helper()
		d := Durable{Term: fxTerm, Leader: leader, LastIndex: 100, LastTerm: fxTerm}
		if leader != 0 {
			d.LeaderAddr = leader4
		}
		if err := f.Mirror(d); err != nil {
			t.Fatal(err)
		}
		if err := f.Alive(); err != nil {
			t.Fatal(err)
		}
	}
	mirror(fxLeader)
	r.Run(t, []bpftest.Case{
		{Name: "leader known but never heard here: passed", In: pv(fxTerm+1, fxTerm, 100), WantRet: bpftest.XDPPass,
			WantCounters: bpftest.Counters{"rx": 1, "pv_passed": 1}},
		{Name: "a heartbeat answered", In: frame(leader4, self4, 1, heartbeatMsg().payload(t)), WantRet: bpftest.XDPTx,
			WantCounters: bpftest.Counters{"rx": 1, "hb_answered": 1, "detect_armed": 1}},
		{Name: "within the lease: dropped", In: pv(fxTerm+1, fxTerm, 100), WantRet: bpftest.XDPDrop,
			WantCounters: bpftest.Counters{"rx": 1, "pv_dropped": 1}},
	})
	mirror(0)
	r.Run(t, []bpftest.Case{
		{Name: "no leader, log up to date: granted", In: pv(fxTerm+1, fxTerm, 100), WantRet: bpftest.XDPTx,
			Check: answer(fxTerm+1, false), WantCounters: tx},
		{Name: "no leader, log behind: rejected", In: pv(fxTerm+1, fxTerm-1, 200), WantRet: bpftest.XDPTx,
			Check: answer(fxTerm, true), WantCounters: tx},
		{Name: "stale term: rejected", In: pv(fxTerm-1, fxTerm, 100), WantRet: bpftest.XDPTx,
			Check: answer(fxTerm, true), WantCounters: tx},
		{Name: "same term: passed (depends on the vote)", In: pv(fxTerm, fxTerm, 100), WantRet: bpftest.XDPPass,
			WantCounters: bpftest.Counters{"rx": 1, "pv_passed": 1}},
	})
	// The node campaigns in fxTerm+1 (its own vote is being fsynced): a pre-vote for that
	// term goes to user space, which refuses it; one for a later term is granted as before.
	if err := f.Pending(fxTerm + 1); err != nil {
		t.Fatal(err)
	}
	r.Run(t, []bpftest.Case{
		{Name: "a term being fsynced: passed", In: pv(fxTerm+1, fxTerm, 100), WantRet: bpftest.XDPPass,
			WantCounters: bpftest.Counters{"rx": 1, "pv_passed": 1}},
		{Name: "beyond the pending term: granted", In: pv(fxTerm+2, fxTerm, 100), WantRet: bpftest.XDPTx,
			Check: answer(fxTerm+2, false), WantCounters: tx},
	})
	if err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	r.Run(t, []bpftest.Case{
		{Name: "alive deadline past: passed", In: pv(fxTerm+1, fxTerm, 100), WantRet: bpftest.XDPPass,
			WantCounters: bpftest.Counters{"rx": 1, "pv_passed": 1}},
	})
}

// The leader's record of its followers' heartbeat responses (maps.h leader_acks): recorded
// only while the node leads at the response's term, and every response goes up as before.
func TestFollowerLeaderAcks(t *testing.T) {
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Detect: time.Hour})
	r := bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}
	resp := func(from uint64, src netip.AddrPort, term uint64) []byte {
		var b [wire.PktLen]byte
		p, err := wire.Encode(b[:], fxCluster, message(pb.MsgHeartbeatResp, from, fxSelf, term, 0, nil))
		if err != nil {
			t.Fatal(err)
		}
		return frame(src, self4, 5, p)
	}
	recorded := bpftest.Counters{"rx": 1, "ack_recorded": 1}
	passed := bpftest.Counters{"rx": 1, "passed_type": 1}
	// A follower (another leader, fxLeader, leads): nothing recorded.
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4}); err != nil {
		t.Fatal(err)
	}
	r.Run(t, []bpftest.Case{
		{Name: "not leading: passed", In: resp(fxOther, other4, fxTerm), WantRet: bpftest.XDPPass, WantCounters: passed},
	})
	if _, ok, err := f.Ack(fxOther); err != nil || ok {
		t.Fatalf("a record while following: ok %v, err %v", ok, err)
	}
	// This node leads fxTerm.
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxSelf, LeaderAddr: self4}); err != nil {
		t.Fatal(err)
	}
	before := Monotonic()
	r.Run(t, []bpftest.Case{
		{Name: "a response at this term: recorded, passed", In: resp(fxOther, other4, fxTerm), WantRet: bpftest.XDPPass, WantCounters: recorded},
		{Name: "again", In: resp(fxOther, other4, fxTerm), WantRet: bpftest.XDPPass, WantCounters: recorded},
		{Name: "another follower", In: resp(fxLeader, leader4, fxTerm), WantRet: bpftest.XDPPass, WantCounters: recorded},
		{Name: "an older term: passed", In: resp(fxOther, other4, fxTerm-1), WantRet: bpftest.XDPPass, WantCounters: passed},
		{Name: "a newer term: passed", In: resp(fxOther, other4, fxTerm+1), WantRet: bpftest.XDPPass, WantCounters: passed},
	})
	a, ok, err := f.Ack(fxOther)
	if err != nil || !ok {
		t.Fatalf("no record of %d: ok %v, err %v", fxOther, ok, err)
	}
	if a.Term != fxTerm || a.Count != 2 || a.Arrival < before || a.Arrival > Monotonic() {
		t.Errorf("record of %d: %+v, want term %d, count 2, arrival in [%v, now]", fxOther, a, fxTerm, before)
	}
	if a, ok, _ := f.Ack(fxLeader); !ok || a.Count != 1 {
		t.Errorf("record of %d: %+v ok %v, want count 1", fxLeader, a, ok)
	}
}

// The leader's last word (Heard, follower_word): the pre-vote lease runs from the later of
// the program's heartbeat record and the word user space stored for a message the program
// does not see (an append over TCP). Both ways of storing it - a store into the
// memory-mapped map, and the map update where the kernel refuses BPF_F_MMAPABLE - feed the
// same rule. Without the word, the program granted the pre-vote of a candidate while its
// user space, which had just stepped an append, would have ignored it (docs/raft.md
// section 13, "The leader's last word").
func TestFollowerLastWord(t *testing.T) {
	for _, mode := range []string{"mmap", "syscall"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "mmap" && !HaveMmapableArray() {
				t.Skip("kernel without BPF_F_MMAPABLE arrays")
			}
			// Detect is the election timeout of the pre-vote lease; the test waits it out
			// once (the clock is polled, not assumed).
			const et = 100 * time.Millisecond
			f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Detect: et, Syscall: mode == "syscall"})
			if got := f.WordMode(); got != mode {
				t.Fatalf("last word recorded by %q, want %q", got, mode)
			}
			if err := f.Mirror(Durable{Term: fxTerm, Leader: fxLeader, LeaderAddr: leader4, LastIndex: 100, LastTerm: fxTerm}); err != nil {
				t.Fatal(err)
			}
			if err := f.Alive(); err != nil {
				t.Fatal(err)
			}
			var b [wire.PktLen]byte
			m := message(pb.MsgPreVote, fxOther, fxSelf, fxTerm+1, 0, nil)
			m.LogTerm, m.Index = proto.Uint64(fxTerm), proto.Uint64(100)
			p, err := wire.Encode(b[:], fxCluster, m)
			if err != nil {
				t.Fatal(err)
			}
			pv := frame(other4, self4, 9, p)
			r := bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}
			granted := bpftest.Counters{"rx": 1, "pv_answered": 1}

			// heard stores arrival as the last word and checks what the kernel's map holds.
			heard := func(arrival time.Duration) {
				t.Helper()
				if err := f.Heard(arrival); err != nil {
					t.Fatal(err)
				}
				var w raftxdpRaftxWord
				if err := f.objs.FollowerWord.Lookup(uint32(0), &w); err != nil {
					t.Fatal(err)
				}
				if time.Duration(w.LastNs) != f.Word() || f.Word() < arrival || f.Word() > arrival+wordAhead {
					t.Fatalf("after Heard(%v): map holds %v, Word %v; want the same, in [arrival, arrival+%v]", arrival, time.Duration(w.LastNs), f.Word(), wordAhead)
				}
			}
			// freshDrops stores a fresh word and runs the pre-vote: dropped. A run later than
			// an election timeout after the word proves nothing (a descheduled test): it is
			// tried again with a fresh word.
			freshDrops := func(name string) {
				t.Helper()
				for try := 0; ; try++ {
					at := Monotonic()
					heard(at)
					before, err := counters(f)()
					if err != nil {
						t.Fatal(err)
					}
					res, err := bpftest.Run(f.objs.RaftxXdp, pv)
					if err != nil {
						t.Fatal(err)
					}
					if Monotonic()-at >= et && try < 5 {
						continue
					}
					after, err := counters(f)()
					if err != nil {
						t.Fatal(err)
					}
					if res.Ret != bpftest.XDPDrop || after["pv_dropped"] != before["pv_dropped"]+1 {
						t.Fatalf("%s: action %d, pv_dropped %d -> %d; want XDP_DROP, counted (etcd-raft ignores it)", name, res.Ret, before["pv_dropped"], after["pv_dropped"])
					}
					return
				}
			}
			// Nothing seen in XDP, only user space's word: a leader is known and heard.
			freshDrops("no heartbeat seen here, last word fresh")
			first := f.Word()
			// A heartbeat answered, then both records go stale.
			r.Run(t, []bpftest.Case{{Name: "a heartbeat answered", In: frame(leader4, self4, 1, heartbeatMsg().payload(t)), WantRet: bpftest.XDPTx,
				WantCounters: bpftest.Counters{"rx": 1, "hb_answered": 1, "detect_armed": 1}}})
			hb, err := f.Heartbeat()
			if err != nil {
				t.Fatal(err)
			}
			for Monotonic() < max(hb.Arrival, f.Word())+et {
				time.Sleep(et / 10)
			}
			// The answered heartbeat armed the failure detector for et: it expires as both
			// records go stale. Take its event first, so that the timer does not fire inside
			// the next case's counter window (it did in a 6.12 guest: detect_fired +1).
			select {
			case <-f.Events():
			case <-time.After(10 * time.Second):
				t.Fatal("no leader-silent event within 10 s of the answered heartbeat")
			}
			r.Run(t, []bpftest.Case{{Name: "heartbeat record and last word both stale: granted", In: pv, WantRet: bpftest.XDPTx, WantCounters: granted}})
			// An older word changes nothing (the word only moves forward).
			heard(first)
			if f.Word() < first {
				t.Fatalf("the word went back to %v", f.Word())
			}
			r.Run(t, []bpftest.Case{{Name: "an older word: still granted", In: pv, WantRet: bpftest.XDPTx, WantCounters: granted}})
			// User space hears the leader (an append over TCP); the heartbeat record stays stale.
			freshDrops("heartbeat record stale, last word fresh")
			if mode == "syscall" {
				// Within wordAhead of the stored word no map update is made: the word stays.
				w := f.Word()
				heard(w - wordAhead)
				if f.Word() != w {
					t.Errorf("a word within %v of the stored one moved it from %v to %v", wordAhead, w, f.Word())
				}
			}
		})
	}
}

// Monotonic reads the runtime's clock (no system call); it must be CLOCK_MONOTONIC, the
// clock of bpf_ktime_get_ns.
func TestMonotonicIsClockMonotonic(t *testing.T) {
	var ts unix.Timespec
	for range 3 {
		a := Monotonic()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		b := Monotonic()
		if sys := time.Duration(ts.Nano()); sys >= a && sys <= b {
			return
		}
	}
	t.Fatalf("clock_gettime(CLOCK_MONOTONIC) outside [Monotonic() before, after] three times")
}
