package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/kedge-dev/kedge/internal/raft/wire/wiretest"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

var (
	testKey   = Key{0x10, 0x21, 0x32, 0x43, 0x54, 0x65, 0x76, 0x87, 0x98, 0xa9, 0xba, 0xcb, 0xdc, 0xed, 0xfe, 0x0f}
	otherKey  = Key{1}
	peer1Addr = netip.AddrPortFrom(pktbuild.DefaultSrc4, 7001)
	peer3Addr = netip.AddrPortFrom(pktbuild.DefaultSrc6, 7003)
	testPeers = map[uint64]netip.AddrPort{1: peer1Addr, 3: peer3Addr}
)

func loadAuthObjs(t testing.TB, self uint64) *wiretest.AuthtestObjects {
	t.Helper()
	requireKernelPaths(t)
	spec, err := wiretest.LoadAuthtest()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	if err := spec.Variables[wiretest.AuthtestVarAuthtestCfg].Set(wiretest.AuthtestAuthtestConfig{Self: self}); err != nil {
		t.Fatalf("set self: %v", err)
	}
	var objs wiretest.AuthtestObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("load objects: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	return &objs
}

// requireKernelPaths skips on a kernel older than the raft kernel paths need (5.15: bpf_timer
// in XDP, offload.Probe; raft_sign's atomic fetch-add alone needs 5.12, and a kernel without
// it refuses the whole object: "BPF_STX uses reserved fields"). There a node runs without the
// kernel paths and nothing loads these programs. From 5.15 on, a program that does not load
// fails the test.
func requireKernelPaths(t testing.TB) {
	t.Helper()
	if ok, rel := bpftest.KernelAtLeast(t, 5, 15); !ok {
		t.Skipf("kernel %s: the raft kernel paths need Linux 5.15 (bpf_timer in XDP; raft_sign's atomic fetch-add needs 5.12): nodes here run without them", rel)
	}
}

func authMaps(o *wiretest.AuthtestObjects) AuthMaps {
	return AuthMaps{Config: o.RaftAuthCfg, Peers: o.RaftPeers, TxSeq: o.RaftTxSeq}
}

func fillAuth(t testing.TB, o *wiretest.AuthtestObjects, key *Key) {
	t.Helper()
	var peers []AuthPeer
	for id, a := range testPeers {
		peers = append(peers, AuthPeer{ID: id, Addr: a})
	}
	if err := authMaps(o).Fill(testCluster, key, peers); err != nil {
		t.Fatal(err)
	}
}

// frame wraps a Raft payload in Ethernet/IP/UDP from src to the test node.
func frame(p []byte, src netip.AddrPort) []byte {
	b := pktbuild.New()
	if src.Addr().Is4() {
		b = b.IPv4(pktbuild.IPv4{Src: src.Addr()})
	} else {
		b = b.IPv6(pktbuild.IPv6{Src: src.Addr()})
	}
	return b.UDP(pktbuild.UDP{Src: src.Port(), Dst: 7002}).Payload(p).Build()
}

// signedAt encodes m and signs it with key on the given channel and sequence.
func signedAt(t testing.TB, key *Key, m *pb.Message, seq uint64) []byte {
	p := encode(t, m)
	p[offFlags] |= FlagMAC
	binary.BigEndian.PutUint64(p[offAuthSeq:], seq)
	mac := MAC(key, p)
	copy(p[offMAC:], mac[:])
	return p
}

func fromPeer(id uint64) *pb.Message {
	m := heartbeat()
	m.From = proto.Uint64(id)
	return m
}

type authCase struct {
	name string
	p    []byte
	src  netip.AddrPort
	want Reason
}

// authCases is one fixture per rule of raft_auth(), in an order that matters: the replay
// windows carry state from case to case, in the kernel and in Go alike.
func authCases(t testing.TB) []authCase {
	const base = 1_700_000_000_000_000_000
	good := signedAt(t, &testKey, fromPeer(1), base)
	mut := func(p []byte, f func(p []byte)) []byte { p = bytes.Clone(p); f(p); return p }
	foreign := fromPeer(1)
	return []authCase{
		{"valid", good, peer1Addr, OK},
		{"replayed", good, peer1Addr, DropReplay},
		{"newer", signedAt(t, &testKey, fromPeer(1), base+10), peer1Addr, OK},
		{"reordered inside window", signedAt(t, &testKey, fromPeer(1), base+5), peer1Addr, OK},
		{"reordered replayed", signedAt(t, &testKey, fromPeer(1), base+5), peer1Addr, DropReplay},
		{"stale", signedAt(t, &testKey, fromPeer(1), base+10-ReplayWindow), peer1Addr, DropStale},
		{"oldest inside window", signedAt(t, &testKey, fromPeer(1), base+10-ReplayWindow+1), peer1Addr, OK},
		{"seq zero", signedAt(t, &testKey, fromPeer(1), 0), peer1Addr, DropStale},
		{"kernel channel has its own window", signedAt(t, &testKey, fromPeer(1), SeqKernel|5), peer1Addr, OK},
		{"kernel channel replayed", signedAt(t, &testKey, fromPeer(1), SeqKernel|5), peer1Addr, DropReplay},
		{"bad mac", mut(signedAt(t, &testKey, fromPeer(1), base+20), func(p []byte) { p[offMAC+3] ^= 0x40 }), peer1Addr, DropMAC},
		{"term changed after signing", mut(signedAt(t, &testKey, fromPeer(1), base+21), func(p []byte) { p[offTerm+7]++ }), peer1Addr, DropMAC},
		{"seq changed after signing", mut(signedAt(t, &testKey, fromPeer(1), base+22), func(p []byte) { p[offAuthSeq+7]++ }), peer1Addr, DropMAC},
		{"unsigned", encode(t, fromPeer(1)), peer1Addr, DropMAC},
		{"mac without flag", mut(signedAt(t, &testKey, fromPeer(1), base+23), func(p []byte) { p[offFlags] &^= FlagMAC }), peer1Addr, DropMAC},
		{"other key", signedAt(t, &otherKey, fromPeer(1), base+24), peer1Addr, DropMAC},
		{"other cluster, same key", func() []byte {
			p, _ := Encode(make([]byte, PktLen), testCluster+1, foreign)
			p[offFlags] |= FlagMAC
			binary.BigEndian.PutUint64(p[offAuthSeq:], base+25)
			mac := MAC(&testKey, p)
			copy(p[offMAC:], mac[:])
			return p
		}(), peer1Addr, DropCluster},
		{"other cluster id pasted into a signed packet", mut(signedAt(t, &testKey, fromPeer(1), base+26), func(p []byte) {
			binary.BigEndian.PutUint64(p[offClusterID:], testCluster+1)
		}), peer1Addr, DropCluster},
		{"unknown peer", signedAt(t, &testKey, fromPeer(9), base+27), peer1Addr, DropPeer},
		{"peer 1 from peer 3's address", signedAt(t, &testKey, fromPeer(1), base+28), peer3Addr, DropPeer},
		{"peer 1 from another port", signedAt(t, &testKey, fromPeer(1), base+29), netip.AddrPortFrom(peer1Addr.Addr(), 7009), DropPeer},
		{"peer 3 over IPv6", signedAt(t, &testKey, fromPeer(3), base), peer3Addr, OK},
		{"truncated", good[:PktLen-1], peer1Addr, DropShort},
		{"long", append(bytes.Clone(good), 0), peer1Addr, DropLong},
		{"bad magic", mut(good, func(p []byte) { p[0] = 0 }), peer1Addr, DropMagic},
		{"not for us", signedAt(t, &testKey, func() *pb.Message { m := fromPeer(1); m.To = proto.Uint64(3); return m }(), base+30), peer1Addr, DropTo},
		{"valid after all that", signedAt(t, &testKey, fromPeer(1), base+31), peer1Addr, OK},
	}
}

// noKeyCases: a cluster without a key takes unsigned packets and refuses MAC fields.
func noKeyCases(t testing.TB) []authCase {
	signed := signedAt(t, &testKey, fromPeer(1), 1_700_000_000_000_000_000)
	seqOnly := encode(t, fromPeer(1))
	seqOnly[offAuthSeq+7] = 1
	macOnly := encode(t, fromPeer(3))
	macOnly[offMAC] = 1
	return []authCase{
		{"unsigned", encode(t, fromPeer(1)), peer1Addr, OK},
		{"unsigned again (no replay window without a key)", encode(t, fromPeer(1)), peer1Addr, OK},
		{"signed", signed, peer1Addr, DropFlags},
		{"auth_seq only", seqOnly, peer1Addr, DropFlags},
		{"mac only", macOnly, peer3Addr, DropFlags},
		{"unknown peer", encode(t, fromPeer(9)), peer1Addr, DropPeer},
		{"wrong address", encode(t, fromPeer(3)), peer1Addr, DropPeer},
	}
}

func receiver(key *Key) *Receiver {
	return &Receiver{Cluster: testCluster, Self: testSelf, Peers: testPeers, Verifier: NewVerifier(key)}
}

func TestAuthGo(t *testing.T) {
	for _, tc := range []struct {
		key   *Key
		cases []authCase
	}{{&testKey, authCases(t)}, {nil, noKeyCases(t)}} {
		r := receiver(tc.key)
		for _, c := range tc.cases {
			if _, got := r.Receive(c.p, c.src); got != c.want {
				t.Errorf("key=%v %s: %v, want %v", tc.key != nil, c.name, got, c.want)
			}
		}
	}
}

// TestAuthKernel runs the same fixtures through raft_hdr_check() + raft_auth() in XDP
// (BPF_PROG_TEST_RUN): the verdict, the XDP action and the per-reason drop counter of each
// packet must match the Go receiver's. The cases run in order on one loaded object: the
// replay windows carry state from case to case.
func TestAuthKernel(t *testing.T) {
	bpftest.RequireRoot(t)
	for _, tc := range []struct {
		key   *Key
		cases []authCase
	}{{&testKey, authCases(t)}, {nil, noKeyCases(t)}} {
		t.Run(fmt.Sprintf("key=%v", tc.key != nil), func(t *testing.T) {
			o := loadAuthObjs(t, testSelf)
			fillAuth(t, o, tc.key)
			r := bpftest.Runner{Prog: o.AuthXdp, Counters: func() (bpftest.Counters, error) {
				out := bpftest.Counters{}
				for r := Reason(1); r < ReasonMax; r++ {
					out[r.String()] = int64(perCPUSum(t, o.Drops, uint32(r)))
				}
				return out, nil
			}}
			var cases []bpftest.Case
			for _, c := range tc.cases {
				bc := bpftest.Case{Name: c.name, In: frame(c.p, c.src), WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{},
					Check: func(tb testing.TB, _ bpftest.Result) {
						var v wiretest.AuthtestAuthtestVerdict
						if err := o.Verdict.Lookup(uint32(0), &v); err != nil {
							tb.Fatal(err)
						}
						got := Reason(v.HdrCheck)
						if got == OK {
							got = Reason(v.Auth)
						}
						if got != c.want {
							tb.Errorf("kernel %v, want %v", got, c.want)
						}
					}}
				if c.want != OK {
					bc.WantRet, bc.WantCounters[c.want.String()] = bpftest.XDPDrop, 1
				}
				cases = append(cases, bc)
			}
			r.Run(t, cases)
		})
	}
}

func perCPUSum(t testing.TB, m *ebpf.Map, key uint32) uint64 {
	var vals []uint64
	if err := m.Lookup(key, &vals); err != nil {
		t.Fatalf("read %v[%d]: %v", m, key, err)
	}
	var n uint64
	for _, v := range vals {
		n += v
	}
	return n
}

// TestKernelSignGoVerifies: raft_sign() on a header built in the kernel gives a packet the Go
// verifier accepts on the kernel channel, and Go's signed packets pass the kernel; a packet
// signed by the kernel and replayed is refused by both.
func TestKernelSignGoVerifies(t *testing.T) {
	bpftest.RequireRoot(t)
	o := loadAuthObjs(t, testSelf)
	fillAuth(t, o, &testKey)
	r := receiver(&testKey)
	for i := range 3 {
		in := frame(encode(t, fromPeer(1)), peer1Addr)
		res, err := bpftest.Run(o.SignXdp, in)
		if err != nil || res.Ret != 3 { // XDP_TX
			t.Fatalf("sign run %d: action %d err %v", i, res.Ret, err)
		}
		p := res.Out[len(res.Out)-PktLen:]
		if seq := binary.BigEndian.Uint64(p[offAuthSeq:]); seq&SeqKernel == 0 || p[offFlags]&FlagMAC == 0 {
			t.Fatalf("kernel-signed packet: flags %#x auth_seq %#x, want RAFT_F_MAC and bit 63", p[offFlags], seq)
		}
		if _, got := r.Receive(p, peer1Addr); got != OK {
			t.Errorf("Go verifier refuses the kernel's signature: %v", got)
		}
		if _, got := r.Receive(p, peer1Addr); got != DropReplay {
			t.Errorf("kernel-signed packet verified twice: %v, want replay", got)
		}
		res, err = bpftest.Run(o.AuthXdp, frame(p, peer1Addr))
		if err != nil || res.Ret != 2 {
			t.Errorf("kernel refuses its own signature: action %d err %v", res.Ret, err)
		}
	}
	s := NewSigner(&testKey)
	for i := range 3 {
		p := encode(t, fromPeer(1))
		s.Sign(p)
		res, err := bpftest.Run(o.AuthXdp, frame(p, peer1Addr))
		if err != nil || res.Ret != 2 {
			var v wiretest.AuthtestAuthtestVerdict
			o.Verdict.Lookup(uint32(0), &v)
			t.Errorf("kernel refuses Go signature %d: action %d verdict %+v err %v", i, res.Ret, v, err)
		}
	}
}

func TestSignerNoKey(t *testing.T) {
	p := encode(t, heartbeat())
	q := bytes.Clone(p)
	NewSigner(nil).Sign(q)
	NewSigner(&Key{}).Sign(q)
	if !bytes.Equal(p, q) {
		t.Fatal("a signer without a key changed the packet")
	}
}

func TestKeyNeverPrints(t *testing.T) {
	k, err := ParseKey("00112233445566778899aabbccddeeff\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %x %s", k, k, k, k, k), fmt.Sprint(&k),
		fmt.Sprintf("%+v", struct{ K Key }{k})} {
		if bytes.Contains([]byte(s), []byte("aabb")) || bytes.Contains([]byte(s), []byte("170")) {
			t.Errorf("key printed: %s", s)
		}
	}
	for _, bad := range []string{"", "0011", "zz112233445566778899aabbccddeeff", "00112233445566778899aabbccddeeff00"} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

// The pass mark replaces the SipHash only: the replay window still holds, a verifier without
// a key or with a zero mark ignores it, and a marked packet is DropMAC to a verifier that
// does not know the mark.
func TestVerifierPassMark(t *testing.T) {
	mark, err := NewMark()
	if err != nil {
		t.Fatal(err)
	}
	marked := func(p []byte) []byte { q := bytes.Clone(p); copy(q[offMAC:], mark[:]); return q }
	p := encode(t, heartbeat())
	NewSigner(&testKey).Sign(p)

	v := NewVerifier(&testKey)
	if r := v.Verify(marked(p)); r != DropMAC {
		t.Fatalf("marked packet before SetPassMark: %v, want %v", r, DropMAC)
	}
	v.SetPassMark(mark)
	if r := v.Verify(marked(p)); r != OK || v.Marked.Load() != 1 {
		t.Fatalf("marked packet: %v (%d marked), want ok by the mark", r, v.Marked.Load())
	}
	if r := v.Verify(p); r != DropReplay {
		t.Errorf("the same packet with its MAC after the marked one: %v, want %v", r, DropReplay)
	}
	if r := v.Verify(marked(p)); r != DropReplay {
		t.Errorf("the marked packet again: %v, want %v", r, DropReplay)
	}
	other := marked(p)
	other[offMAC] ^= 1
	if r := v.Verify(other); r != DropMAC {
		t.Errorf("a mark one bit off: %v, want %v", r, DropMAC)
	}

	zero := NewVerifier(&testKey)
	zero.SetPassMark(Mark{})
	if r := zero.Verify(marked(p)); r != DropMAC {
		t.Errorf("zero mark set, marked packet: %v, want %v", r, DropMAC)
	}
	if r := zero.Verify(append(p[:offMAC:offMAC], make([]byte, MACLen)...)); r != DropMAC {
		t.Errorf("zero mark set, zero MAC: %v, want %v", r, DropMAC)
	}
	plain := NewVerifier(nil)
	plain.SetPassMark(mark)
	if r := plain.Verify(marked(encode(t, heartbeat()))); r != DropFlags {
		t.Errorf("no key, marked packet: %v, want %v", r, DropFlags)
	}
}

// TestAuthMirrors: authConfig and authPeer have the layout of the compiled raft_auth_config
// and raft_peer (bpf2go's types of the test object): same size, and each field this package
// writes at the compiled field's offset.
func TestAuthMirrors(t *testing.T) {
	for _, tc := range []struct {
		mirror, compiled reflect.Type
		fields           map[string]string // mirror field -> compiled field path
	}{
		{reflect.TypeFor[authConfig](), reflect.TypeFor[wiretest.AuthtestRaftAuthConfig](),
			map[string]string{"ClusterID": "ClusterId", "K0": "K0", "K1": "K1", "KeySet": "KeySet"}},
		{reflect.TypeFor[authPeer](), reflect.TypeFor[wiretest.AuthtestRaftPeer](),
			map[string]string{"Addr": "Addr", "Port": "Port", "Lock": "Lock", "Win": "Win"}},
	} {
		if tc.mirror.Size() != tc.compiled.Size() {
			t.Errorf("%v has %d bytes, the compiled %v %d", tc.mirror, tc.mirror.Size(), tc.compiled, tc.compiled.Size())
		}
		for mf, cf := range tc.fields {
			m, _ := tc.mirror.FieldByName(mf)
			c, ok := tc.compiled.FieldByName(cf)
			if !ok || m.Offset != c.Offset || m.Type.Size() != c.Type.Size() {
				t.Errorf("%v.%s at %d (%d bytes), the compiled %s at %d (%d bytes)", tc.mirror, mf, m.Offset, m.Type.Size(), cf, c.Offset, c.Type.Size())
			}
		}
	}
}
