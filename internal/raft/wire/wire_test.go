package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/kedge-dev/kedge/internal/raft/wire/wiretest"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

const (
	testCluster = 42
	testSelf    = 2
)

func heartbeat() *pb.Message {
	return &pb.Message{
		Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(testSelf),
		Term: proto.Uint64(7), Commit: proto.Uint64(1234), Context: []byte("readidx8"),
	}
}

func encode(t testing.TB, m *pb.Message) []byte {
	t.Helper()
	p, err := Encode(make([]byte, PktLen), testCluster, m)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return p
}

// TestLayoutMatchesHeader compares the codec's offsets and constants with the BTF of
// bpf/include/raft.h as clang compiled it.
func TestLayoutMatchesHeader(t *testing.T) {
	spec, err := wiretest.LoadRaftwire()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	var hdr *btf.Struct
	if err := spec.Types.TypeByName("raft_hdr", &hdr); err != nil {
		t.Fatalf("find struct raft_hdr: %v", err)
	}
	if hdr.Size != PktLen {
		t.Errorf("sizeof(struct raft_hdr) = %d, codec PktLen = %d", hdr.Size, PktLen)
	}
	want := map[string]struct{ off, size uint32 }{
		"magic": {offMagic, 4}, "version": {offVersion, 1}, "type": {offType, 1},
		"flags": {offFlags, 1}, "ctx_len": {offCtxLen, 1}, "cluster_id": {offClusterID, 8},
		"from": {offFrom, 8}, "to": {offTo, 8}, "term": {offTerm, 8}, "log_term": {offLogTerm, 8},
		"index": {offIndex, 8}, "commit": {offCommit, 8}, "reject_hint": {offRejectHint, 8},
		"ctx": {offCtx, CtxMax}, "auth_seq": {offAuthSeq, 8}, "mac": {offMAC, MACLen},
	}
	if len(hdr.Members) != len(want) {
		t.Errorf("struct raft_hdr has %d members, the codec knows %d", len(hdr.Members), len(want))
	}
	for _, m := range hdr.Members {
		w, ok := want[m.Name]
		if !ok {
			t.Errorf("raft_hdr.%s: not in the codec", m.Name)
			continue
		}
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatalf("sizeof raft_hdr.%s: %v", m.Name, err)
		}
		if uint32(m.Offset.Bytes()) != w.off || uint32(size) != w.size {
			t.Errorf("raft_hdr.%s at %d size %d, codec has %d size %d", m.Name, m.Offset.Bytes(), size, w.off, w.size)
		}
	}

	bpftest.CheckEnums(t, spec, map[string]map[string]int64{
		"raft_wire": {"RAFT_MAGIC": Magic, "RAFT_VERSION": Version, "RAFT_CTX_MAX": CtxMax, "RAFT_MAC_LEN": MACLen,
			"RAFT_PKT_LEN": PktLen, "RAFT_BULK_MAX": BulkMax, "RAFT_SNAP_MAX": SnapMax},
		"raft_flags": {"RAFT_F_REJECT": FlagReject, "RAFT_F_MAC": FlagMAC, "RAFT_F_KNOWN": flagKnown},
	})

	var drop *btf.Enum
	if err := spec.Types.TypeByName("raft_drop", &drop); err != nil {
		t.Fatalf("find enum raft_drop: %v", err)
	}
	if len(drop.Values) != int(ReasonMax)+1 {
		t.Errorf("enum raft_drop has %d values, codec %d", len(drop.Values), ReasonMax+1)
	}
	for _, v := range drop.Values {
		name := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(v.Name, "RAFT_DROP_"), "RAFT_"))
		if v.Name == "RAFT_DROP_MAX" {
			if v.Value != uint64(ReasonMax) {
				t.Errorf("RAFT_DROP_MAX = %d, codec %d", v.Value, ReasonMax)
			}
			continue
		}
		if got := Reason(v.Value).String(); got != name {
			t.Errorf("%s = %d is %q in the codec", v.Name, v.Value, got)
		}
	}

	var types *btf.Enum
	if err := spec.Types.TypeByName("raft_msg_type", &types); err != nil {
		t.Fatalf("find enum raft_msg_type: %v", err)
	}
	if len(types.Values) != len(udpTypes) {
		t.Errorf("enum raft_msg_type has %d values, codec allows %d types", len(types.Values), len(udpTypes))
	}
	for _, v := range types.Values {
		mt := pb.MessageType(v.Value)
		if !udpType(mt) {
			t.Errorf("%s = %d is not allowed by the codec", v.Name, v.Value)
		}
		// RAFT_MSG_PRE_VOTE_RESP -> MsgPreVoteResp
		want := "Msg" + strings.ReplaceAll(strings.Title(strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(v.Name, "RAFT_MSG_"), "_", " "))), " ", "")
		if mt.String() != want {
			t.Errorf("%s = %d is %s in raftpb, want %s", v.Name, v.Value, mt, want)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	msgs := []*pb.Message{
		heartbeat(),
		{Type: pb.MsgHeartbeatResp.Enum(), From: proto.Uint64(1), To: proto.Uint64(testSelf), Term: proto.Uint64(7)},
		{Type: pb.MsgAppResp.Enum(), From: proto.Uint64(3), To: proto.Uint64(testSelf), Term: proto.Uint64(9),
			Index: proto.Uint64(100), Reject: proto.Bool(true), RejectHint: proto.Uint64(88), LogTerm: proto.Uint64(8)},
		{Type: pb.MsgPreVote.Enum(), From: proto.Uint64(7), To: proto.Uint64(testSelf), Term: proto.Uint64(1<<63 + 5),
			LogTerm: proto.Uint64(4), Index: proto.Uint64(^uint64(0))},
		{Type: pb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(testSelf), Term: proto.Uint64(2),
			LogTerm: proto.Uint64(2), Index: proto.Uint64(10), Commit: proto.Uint64(10)},
		{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(testSelf), Context: bytes.Repeat([]byte{0xff}, CtxMax)},
	}
	for _, m := range msgs {
		p := encode(t, m)
		got, r := Decode(p, testCluster, testSelf)
		if r != OK {
			t.Fatalf("decode %v: %v", m, r)
		}
		if !proto.Equal(got, m) {
			t.Errorf("round trip:\n got %v\nwant %v", got, m)
		}
	}
}

func TestEncodeRefusesBulk(t *testing.T) {
	for name, m := range map[string]*pb.Message{
		"entries":  {Type: pb.MsgApp.Enum(), Entries: []*pb.Entry{{Index: proto.Uint64(1)}}},
		"snapshot": {Type: pb.MsgSnap.Enum(), Snapshot: &pb.Snapshot{}},
		"prop":     {Type: pb.MsgProp.Enum()},
		"ctx":      {Type: pb.MsgHeartbeat.Enum(), Context: make([]byte, CtxMax+1)},
		"readidx":  {Type: pb.MsgReadIndex.Enum()},
	} {
		if _, err := Encode(make([]byte, PktLen), 1, m); !errors.Is(err, ErrNotUDP) {
			t.Errorf("%s: Encode err = %v, want ErrNotUDP", name, err)
		}
	}
}

// badPackets returns one packet per refusal reason the header check can give.
func badPackets(t testing.TB) map[string]struct {
	p    []byte
	want Reason
} {
	good := encode(t, heartbeat())
	mut := func(f func(p []byte)) []byte { p := bytes.Clone(good); f(p); return p }
	return map[string]struct {
		p    []byte
		want Reason
	}{
		"valid":         {good, OK},
		"short":         {good[:PktLen-1], DropShort},
		"empty":         {nil, DropShort},
		"long":          {append(bytes.Clone(good), 0), DropLong},
		"magic":         {mut(func(p []byte) { p[0] ^= 1 }), DropMagic},
		"version":       {mut(func(p []byte) { p[offVersion] = 2 }), DropVersion},
		"cluster":       {mut(func(p []byte) { binary.BigEndian.PutUint64(p[offClusterID:], 43) }), DropCluster},
		"to":            {mut(func(p []byte) { binary.BigEndian.PutUint64(p[offTo:], 3) }), DropTo},
		"type prop":     {mut(func(p []byte) { p[offType] = byte(pb.MsgProp) }), DropType},
		"type snap":     {mut(func(p []byte) { p[offType] = byte(pb.MsgSnap) }), DropType},
		"type 200":      {mut(func(p []byte) { p[offType] = 200 }), DropType},
		"flags unknown": {mut(func(p []byte) { p[offFlags] = 0x80 }), DropFlags},
		// The authentication fields are raft_auth()'s and Verifier's (auth_test.go).
		"flags mac":      {mut(func(p []byte) { p[offFlags] = FlagMAC }), OK},
		"auth_seq set":   {mut(func(p []byte) { p[offAuthSeq+7] = 1 }), OK},
		"mac set":        {mut(func(p []byte) { p[offMAC+15] = 1 }), OK},
		"ctx_len 17":     {mut(func(p []byte) { p[offCtxLen] = CtxMax + 1 }), DropCtx},
		"ctx padding":    {mut(func(p []byte) { p[offCtx+CtxMax-1] = 1 }), DropCtx},
		"reject allowed": {mut(func(p []byte) { p[offFlags] = FlagReject }), OK},
	}
}

func TestDecodeRefusals(t *testing.T) {
	for name, c := range badPackets(t) {
		if _, r := Decode(c.p, testCluster, testSelf); r != c.want {
			t.Errorf("%s: Decode = %v, want %v", name, r, c.want)
		}
	}
}

// TestKernelCheckAgrees runs raft_hdr_check() in an XDP program (BPF_PROG_TEST_RUN) on the
// same packets, framed as Ethernet/IPv4/UDP and Ethernet/IPv6/UDP: the kernel's verdict and
// fields must equal the Go codec's. This is also the proof that the format parses in XDP.
func TestKernelCheckAgrees(t *testing.T) {
	bpftest.RequireRoot(t)
	spec, err := wiretest.LoadRaftwire()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	if err := spec.Variables[wiretest.RaftwireVarRaftwireCfg].Set(wiretest.RaftwireRaftwireConfig{ClusterId: testCluster, Self: testSelf}); err != nil {
		t.Fatalf("set config: %v", err)
	}
	var objs wiretest.RaftwireObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("load objects: %v", err)
	}
	defer objs.Close()
	for name, c := range badPackets(t) {
		for _, v6 := range []bool{false, true} {
			b := pktbuild.New()
			if v6 {
				b = b.IPv6(pktbuild.IPv6{})
			} else {
				b = b.IPv4(pktbuild.IPv4{})
			}
			frame := b.UDP(pktbuild.UDP{Src: 7000, Dst: 7000}).Payload(c.p).Build()
			if _, err := bpftest.Run(objs.RaftwireXdp, frame); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var res wiretest.RaftwireRaftwireResult
			if err := objs.Result.Lookup(uint32(0), &res); err != nil {
				t.Fatalf("read result: %v", err)
			}
			if res.ParseRet != 0 || res.Reached != 1 || Reason(res.Verdict) != c.want {
				t.Errorf("%s (v6=%v): kernel parse %d verdict %v, Go verdict %v", name, v6, res.ParseRet, Reason(res.Verdict), c.want)
				continue
			}
			if c.want != OK {
				continue
			}
			m, _ := Decode(c.p, testCluster, testSelf)
			if res.From != m.GetFrom() || res.To != m.GetTo() || res.Term != m.GetTerm() || res.Commit != m.GetCommit() ||
				res.Index != m.GetIndex() || res.LogTerm != m.GetLogTerm() || res.RejectHint != m.GetRejectHint() ||
				pb.MessageType(res.Type) != m.GetType() || int(res.CtxLen) != len(m.GetContext()) {
				t.Errorf("%s (v6=%v): kernel read %+v, Go decoded %v", name, v6, res, m)
			}
			if !bytes.Equal(raw(res.Hdr), c.p) {
				t.Errorf("%s: kernel header copy differs from the packet", name)
			}
		}
	}
}

func raw(h wiretest.RaftwireRaftHdr) []byte {
	b := make([]byte, 0, PktLen)
	b = binary.LittleEndian.AppendUint32(b, h.Magic) // host order of the raw network bytes
	b = append(b, h.Version, h.Type, h.Flags, h.CtxLen)
	for _, v := range []uint64{h.ClusterId, h.From, h.To, h.Term, h.LogTerm, h.Index, h.Commit, h.RejectHint} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	b = append(b, h.Ctx[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.AuthSeq)
	return append(b, h.Mac[:]...)
}

// FuzzDecode: Decode never panics, and every accepted packet re-encodes to the same bytes
// (but for the authentication fields, which Decode leaves to Verifier).
func FuzzDecode(f *testing.F) {
	for _, c := range badPackets(f) {
		f.Add(c.p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		m, r := Decode(p, testCluster, testSelf)
		if r >= ReasonMax {
			t.Fatalf("reason %d out of range", r)
		}
		if r != OK {
			if m != nil {
				t.Fatalf("refused (%v) but returned a message", r)
			}
			return
		}
		q, err := Encode(make([]byte, PktLen), testCluster, m)
		if err != nil {
			t.Fatalf("accepted packet does not re-encode: %v", err)
		}
		p = bytes.Clone(p)
		p[offFlags] &^= FlagMAC
		clear(p[offAuthSeq:])
		if !bytes.Equal(p, q) {
			t.Fatalf("re-encoded packet differs:\n in %x\nout %x", p, q)
		}
	})
}

func TestHello(t *testing.T) {
	h := Hello(testCluster, 3, false)
	if id, r := ParseHello(h, testCluster, false); r != OK || id != 3 {
		t.Fatalf("ParseHello = %d %v", id, r)
	}
	if _, r := ParseHello(h, 1, false); r != DropCluster {
		t.Errorf("foreign cluster hello: %v", r)
	}
	if _, r := ParseHello(h, testCluster, true); r != DropMAC {
		t.Errorf("unkeyed hello at a keyed receiver: %v", r)
	}
	if id, r := ParseHello(Hello(testCluster, 3, true), testCluster, true); r != OK || id != 3 {
		t.Errorf("keyed hello: %d %v", id, r)
	}
	if _, r := ParseHello(Hello(testCluster, 3, true), testCluster, false); r != DropMAC {
		t.Errorf("keyed hello at a receiver without a key: %v", r)
	}
	h[0] = 0
	if _, r := ParseHello(h, testCluster, false); r != DropMagic {
		t.Errorf("bad magic hello: %v", r)
	}
	if _, r := ParseHello(h[:5], testCluster, false); r != DropShort {
		t.Errorf("short hello: %v", r)
	}
}
