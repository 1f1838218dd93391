// Package wire is the Go codec of kedge raft's UDP packet (bpf/include/raft.h, struct
// raft_hdr) and of its TCP bulk hello. docs/raft.md section 3 is the specification.
//
// The header's layout is not mirrored by hand without a check: wire_test.go compares these
// offsets with the BTF of struct raft_hdr (compiled from raft.h by bpf2go) and runs
// raft_hdr_check() in the kernel against Decode on the same packets.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Constants of raft.h.
const (
	Magic   = 0x4b524654 // "KRFT"
	Version = 1
	PktLen  = 112 // RAFT_PKT_LEN: the whole UDP payload
	CtxMax  = 16  // RAFT_CTX_MAX
	MACLen  = 16  // RAFT_MAC_LEN

	BulkMax = 8 << 20   // RAFT_BULK_MAX: a TCP frame of a non-snapshot message
	SnapMax = 256 << 20 // RAFT_SNAP_MAX: a TCP frame carrying a snapshot

	FlagReject = 1 << 0 // RAFT_F_REJECT
	FlagMAC    = 1 << 1 // RAFT_F_MAC: the cluster has a key (auth.go)
	flagKnown  = FlagReject | FlagMAC

	// HelloLen is the size of the TCP bulk connection's hello.
	HelloLen = 24
)

// Field offsets in struct raft_hdr.
const (
	offMagic      = 0
	offVersion    = 4
	offType       = 5
	offFlags      = 6
	offCtxLen     = 7
	offClusterID  = 8
	offFrom       = 16
	offTo         = 24
	offTerm       = 32
	offLogTerm    = 40
	offIndex      = 48
	offCommit     = 56
	offRejectHint = 64
	offCtx        = 72
	offAuthSeq    = 88
	offMAC        = 96
)

// Reason is enum raft_drop: why a packet was refused (0 = accepted).
type Reason uint8

// The values of enum raft_drop.
const (
	OK Reason = iota
	DropShort
	DropLong
	DropMagic
	DropVersion
	DropCluster
	DropTo
	DropPeer
	DropType
	DropFlags
	DropCtx
	DropMAC
	DropStale
	DropReplay
	ReasonMax
)

var reasonNames = [...]string{"ok", "short", "long", "magic", "version", "cluster", "to", "peer", "type", "flags", "ctx", "mac", "stale", "replay"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// udpTypes is RAFT_UDP_TYPES: the message types allowed on UDP.
var udpTypes = [...]pb.MessageType{
	pb.MsgApp, pb.MsgAppResp, pb.MsgVote, pb.MsgVoteResp, pb.MsgHeartbeat, pb.MsgHeartbeatResp,
	pb.MsgTransferLeader, pb.MsgTimeoutNow, pb.MsgPreVote, pb.MsgPreVoteResp,
}

func udpType(t pb.MessageType) bool {
	for _, u := range udpTypes {
		if t == u {
			return true
		}
	}
	return false
}

// FitsUDP reports whether m goes by the UDP transport: an allowed type without entries,
// snapshot, responses or a context longer than CtxMax, and without the Vote field (used only
// by local storage messages).
func FitsUDP(m *pb.Message) bool {
	return udpType(m.GetType()) && len(m.GetEntries()) == 0 && m.GetSnapshot() == nil &&
		len(m.GetContext()) <= CtxMax && len(m.GetResponses()) == 0 && m.GetVote() == 0
}

// ErrNotUDP is returned by Encode for a message that FitsUDP refuses.
var ErrNotUDP = errors.New("message does not fit the UDP packet")

// Encode writes m as one UDP packet of cluster into b (len(b) >= PktLen) and returns the
// packet. The authentication fields stay zero: Signer.Sign sets them.
func Encode(b []byte, cluster uint64, m *pb.Message) ([]byte, error) {
	if !FitsUDP(m) {
		return nil, fmt.Errorf("encode %v: %w", m.GetType(), ErrNotUDP)
	}
	p := b[:PktLen]
	clear(p)
	be := binary.BigEndian
	be.PutUint32(p[offMagic:], Magic)
	p[offVersion] = Version
	p[offType] = byte(m.GetType())
	if m.GetReject() {
		p[offFlags] = FlagReject
	}
	p[offCtxLen] = byte(len(m.GetContext()))
	be.PutUint64(p[offClusterID:], cluster)
	be.PutUint64(p[offFrom:], m.GetFrom())
	be.PutUint64(p[offTo:], m.GetTo())
	be.PutUint64(p[offTerm:], m.GetTerm())
	be.PutUint64(p[offLogTerm:], m.GetLogTerm())
	be.PutUint64(p[offIndex:], m.GetIndex())
	be.PutUint64(p[offCommit:], m.GetCommit())
	be.PutUint64(p[offRejectHint:], m.GetRejectHint())
	copy(p[offCtx:offCtx+CtxMax], m.GetContext())
	return p, nil
}

// Decode checks p (a whole UDP payload) the way raft_hdr_check() does for a receiver with
// the given cluster id and own id, and returns the message when the verdict is OK. The peer
// check (DropPeer) is the caller's: it knows the peer table and the source address; the
// authentication fields (FlagMAC, auth_seq, mac) are Verifier's.
func Decode(p []byte, cluster, self uint64) (*pb.Message, Reason) {
	if len(p) < PktLen {
		return nil, DropShort
	}
	if len(p) > PktLen {
		return nil, DropLong
	}
	be := binary.BigEndian
	switch {
	case be.Uint32(p[offMagic:]) != Magic:
		return nil, DropMagic
	case p[offVersion] != Version:
		return nil, DropVersion
	case be.Uint64(p[offClusterID:]) != cluster:
		return nil, DropCluster
	case be.Uint64(p[offTo:]) != self:
		return nil, DropTo
	case !udpType(pb.MessageType(p[offType])):
		return nil, DropType
	case p[offFlags]&^flagKnown != 0:
		return nil, DropFlags
	case p[offCtxLen] > CtxMax:
		return nil, DropCtx
	}
	n := int(p[offCtxLen])
	for _, c := range p[offCtx+n : offCtx+CtxMax] {
		if c != 0 {
			return nil, DropCtx
		}
	}
	// Only non-zero fields are set: etcd-raft reads messages through getters, and zero-valued
	// optional fields would only make the message larger on the bulk path.
	m := &pb.Message{Type: pb.MessageType(p[offType]).Enum(), To: proto.Uint64(self)}
	for _, f := range []struct {
		dst **uint64
		off int
	}{{&m.From, offFrom}, {&m.Term, offTerm}, {&m.LogTerm, offLogTerm}, {&m.Index, offIndex},
		{&m.Commit, offCommit}, {&m.RejectHint, offRejectHint}} {
		if v := be.Uint64(p[f.off:]); v != 0 {
			*f.dst = proto.Uint64(v)
		}
	}
	if p[offFlags]&FlagReject != 0 {
		m.Reject = proto.Bool(true)
	}
	if n > 0 {
		m.Context = append([]byte(nil), p[offCtx:offCtx+n]...)
	}
	return m, OK
}

// From returns the sender id of a packet that Decode accepted.
func From(p []byte) uint64 { return binary.BigEndian.Uint64(p[offFrom:]) }

// Hello is the first HelloLen bytes a bulk (TCP) connection's dialler sends; keyed: the
// dialler authenticates (bulkauth.go).
func Hello(cluster, from uint64, keyed bool) []byte {
	b := make([]byte, HelloLen)
	binary.BigEndian.PutUint32(b[0:], Magic)
	b[4] = Version
	if keyed {
		b[5] = HelloKeyed
	}
	binary.BigEndian.PutUint64(b[8:], cluster)
	binary.BigEndian.PutUint64(b[16:], from)
	return b
}

// ParseHello checks a bulk connection's hello and returns the dialler's id. keyed: the
// receiver has a cluster key, and the dialler must say it authenticates (and not otherwise).
func ParseHello(b []byte, cluster uint64, keyed bool) (uint64, Reason) {
	be := binary.BigEndian
	switch {
	case len(b) != HelloLen:
		return 0, DropShort
	case be.Uint32(b[0:]) != Magic:
		return 0, DropMagic
	case b[4] != Version:
		return 0, DropVersion
	case b[6] != 0 || b[7] != 0 || b[5]&^HelloKeyed != 0:
		return 0, DropFlags
	case (b[5] == HelloKeyed) != keyed:
		return 0, DropMAC
	case be.Uint64(b[8:]) != cluster:
		return 0, DropCluster
	}
	return be.Uint64(b[16:]), OK
}
