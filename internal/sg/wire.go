// Package sg holds kedge scatter-gather's kernel side: the BPF objects (bpf/sg), the
// wire format's Go mirror (bpf/include/sg.h) and the reference worker. The public API
// that applications import is pkg/sg.
package sg

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format constants (bpf/include/sg.h).
const (
	Magic   = 0x6b53
	Version = 1
	HdrLen  = 32

	OpRequest = 1
	OpReply   = 2

	GroupsMax   = 16
	WorkersMax  = 1024
	Slots       = 1024
	SlotMask    = Slots - 1
	AggBytes    = 2048
	AggElems    = AggBytes / 8
	GatherMax   = 64
	BitmapWords = WorkersMax / 64
	// PartsMax is the most parts a multi-packet reply may have (SG_PARTS_MAX).
	PartsMax = 32
	// PartEntriesMax is the largest parts map: every slot x every worker of a group.
	PartEntriesMax = Slots * WorkersMax
	// ReplicasMax is the most replicas of one shard (SG_REPLICAS_MAX).
	ReplicasMax = 4
	// EjectLevelMax: a replica's back-off doubles at most this many times (SG_EJECT_LEVEL_MAX).
	EjectLevelMax = 16
	// StoreBytes is the longest request frame stored for re-sends (SG_STORE_BYTES, from
	// the Ethernet header to the payload's end); a longer request is never re-sent.
	StoreBytes = 1536
	// CsumChunk is the stored frame's checksum chunk (SG_CSUM_CHUNK).
	CsumChunk = 512
	// RepWords: words of 2-bit replica indexes per stored request (SG_REP_WORDS).
	RepWords = WorkersMax * 2 / 64
	// CopyMilli is a re-sent copy's cost in the re-send budget's milli-copies
	// (SG_COPY_MILLI).
	CopyMilli = 1000
)

// Reductions and element types (enum sg_reduce, enum sg_dtype).
const (
	RedSum    = 0
	RedMin    = 1
	RedMax    = 2
	RedCount  = 3
	RedGather = 4
	RedUser   = 5

	TypeI32 = 0
	TypeI64 = 1
)

// Replica choices (enum sg_replica_choice, GroupCfg.ReplicaChoice).
const (
	ChoiceRoundRobin = 0
	ChoiceLatency    = 1
)

// Result statuses (enum sg_status) and flags.
const (
	StatusOK      = 0
	StatusTimeout = 1

	FlagOverflow = 0x1
	// FlagParts (SG_F_PARTS): parts of multi-packet replies were reduced; for min and
	// max the accumulators started at the identity (MinIdentity, MaxIdentity).
	FlagParts = 0x2

	// GroupFlagLoopback (SG_GF_LOOPBACK): the group's interface is a loopback; batches
	// are handed on through its egress.
	GroupFlagLoopback = 0x1
	// GroupFlagWakeSocket (SG_GF_WAKE_SOCKET): the reply that completes a request is
	// passed to the coordinator socket (its arrival wakes the reader) and its result is
	// emitted without the ring buffer's wake-up.
	GroupFlagWakeSocket = 0x2
	// GroupFlagParts (SG_GF_PARTS): multi-packet replies are reduced per part; the
	// group's entries in the parts map start at its PartBase.
	GroupFlagParts = 0x4
	// GroupFlagReplicas (SG_GF_REPLICAS): worker slots are shards with replicas; the
	// group's entries in the replicas map start at its ReplicaBase.
	GroupFlagReplicas = 0x8
	// GroupFlagResend (SG_GF_RESEND): requests are stored and the copies of workers that
	// have not answered by ResendNs are sent again (bpf/sg/resend.h), paid from the
	// group's entry in the budgets map.
	GroupFlagResend = 0x10
)

// Slot states (enum sg_slot_state).
const (
	SlotFree    = 0
	SlotPending = 1
	SlotDone    = 2
)

// Header is struct sg_hdr in host order.
type Header struct {
	Version    uint8
	Op         uint8
	Group      uint16
	Worker     uint16
	ReqID      uint64
	Status     uint16
	Need       uint16
	Part       uint16
	NParts     uint16
	TimeoutUS  uint32
	PayloadLen uint32
}

// Append appends the header (with Magic) to b in wire order.
func (h Header) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, Magic)
	b = append(b, h.Version, h.Op)
	b = binary.BigEndian.AppendUint16(b, h.Group)
	b = binary.BigEndian.AppendUint16(b, h.Worker)
	b = binary.BigEndian.AppendUint64(b, h.ReqID)
	b = binary.BigEndian.AppendUint16(b, h.Status)
	b = binary.BigEndian.AppendUint16(b, h.Need)
	b = binary.BigEndian.AppendUint16(b, h.Part)
	b = binary.BigEndian.AppendUint16(b, h.NParts)
	b = binary.BigEndian.AppendUint32(b, h.TimeoutUS)
	return binary.BigEndian.AppendUint32(b, h.PayloadLen)
}

// Errors of ParseHeader.
var (
	ErrNotSG      = errors.New("not a kedge sg datagram (magic)")
	ErrShort      = errors.New("sg datagram shorter than its header")
	ErrVersion    = errors.New("unknown sg version")
	ErrPayloadLen = errors.New("sg payload length beyond the datagram")
)

// ParseHeader parses a datagram's header and returns it with the payload it announces.
func ParseHeader(d []byte) (Header, []byte, error) {
	var h Header
	if len(d) < 2 || binary.BigEndian.Uint16(d) != Magic {
		return h, nil, ErrNotSG
	}
	if len(d) < HdrLen {
		return h, nil, ErrShort
	}
	h.Version, h.Op = d[2], d[3]
	if h.Version != Version {
		return h, nil, fmt.Errorf("%w %d", ErrVersion, h.Version)
	}
	h.Group = binary.BigEndian.Uint16(d[4:])
	h.Worker = binary.BigEndian.Uint16(d[6:])
	h.ReqID = binary.BigEndian.Uint64(d[8:])
	h.Status = binary.BigEndian.Uint16(d[16:])
	h.Need = binary.BigEndian.Uint16(d[18:])
	h.Part = binary.BigEndian.Uint16(d[20:])
	h.NParts = binary.BigEndian.Uint16(d[22:])
	h.TimeoutUS = binary.BigEndian.Uint32(d[24:])
	h.PayloadLen = binary.BigEndian.Uint32(d[28:])
	if uint64(h.PayloadLen) > uint64(len(d)-HdrLen) {
		return h, nil, ErrPayloadLen
	}
	return h, d[HdrLen : HdrLen+int(h.PayloadLen)], nil
}

// ElemSize is the byte size of one element of type t.
func ElemSize(t uint8) int {
	if t == TypeI64 {
		return 8
	}
	return 4
}

// AppendVector appends v as big-endian elements of type t.
func AppendVector(b []byte, t uint8, v []int64) []byte {
	for _, x := range v {
		if t == TypeI64 {
			b = binary.BigEndian.AppendUint64(b, uint64(x))
		} else {
			b = binary.BigEndian.AppendUint32(b, uint32(int32(x)))
		}
	}
	return b
}

// DecodeVector decodes big-endian elements of type t.
func DecodeVector(b []byte, t uint8) []int64 {
	size := ElemSize(t)
	out := make([]int64, 0, len(b)/size)
	for i := 0; i+size <= len(b); i += size {
		if t == TypeI64 {
			out = append(out, int64(binary.BigEndian.Uint64(b[i:])))
		} else {
			out = append(out, int64(int32(binary.BigEndian.Uint32(b[i:]))))
		}
	}
	return out
}

// PartSlice is the slice of an elems-long vector that part part of an nparts-part reply
// carries (bpf/include/sg.h): elements [off, off+n) with k = ceil(elems/nparts), off =
// part*k, n = min(k, elems-off). ok is false when nparts is 0 or above PartsMax, part is
// not below nparts, or the part would be empty (nparts too large for the vector).
func PartSlice(elems, nparts, part int) (off, n int, ok bool) {
	if nparts < 1 || nparts > PartsMax || part < 0 || part >= nparts {
		return 0, 0, false
	}
	k := (elems + nparts - 1) / nparts
	off = part * k
	if off >= elems {
		return 0, 0, false
	}
	return off, min(k, elems-off), true
}

// PartsFor is the fewest parts in which a vector of elems elements of size bytes travels
// with at most maxPayload bytes of payload per datagram (at least 1). It can be above
// PartsMax: the caller refuses that.
func PartsFor(elems, size, maxPayload int) int {
	per := max(maxPayload/size, 1)
	return max((elems+per-1)/per, 1)
}

// ValidParts reports whether an elems-long vector can travel in nparts parts: every part
// non-empty and nparts within PartsMax (nparts 1: a single packet).
func ValidParts(elems, nparts int) bool {
	if nparts == 1 {
		return true
	}
	_, _, ok := PartSlice(elems, nparts, nparts-1)
	return ok
}
