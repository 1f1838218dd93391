package sg

import (
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestWireMatchesBTF pins wire.go, the hand-written Go mirror of bpf/include/sg.h, to the
// BTF of the compiled object: every constant of the header's enums, and where Header.Append
// puts each field of struct sg_hdr.
func TestWireMatchesBTF(t *testing.T) {
	spec, err := loadSg()
	if err != nil {
		t.Fatal(err)
	}
	bpftest.CheckEnums(t, spec, map[string]map[string]int64{
		"sg_wire": {"SG_MAGIC": Magic, "SG_VERSION": Version, "SG_HDR_LEN": HdrLen},
		"sg_op":   {"SG_OP_REQUEST": OpRequest, "SG_OP_REPLY": OpReply},
		"sg_limits": {
			"SG_GROUPS_MAX": GroupsMax, "SG_WORKERS_MAX": WorkersMax, "SG_BITMAP_WORDS": BitmapWords,
			"SG_SLOTS": Slots, "SG_SLOT_MASK": SlotMask, "SG_AGG_BYTES": AggBytes, "SG_AGG_ELEMS": AggElems,
			"SG_AGG_WORDS": AggBytes / 4, "SG_GATHER_MAX": GatherMax, "SG_PARTS_MAX": PartsMax,
			"SG_REPLICAS_MAX": ReplicasMax, "SG_EJECT_LEVEL_MAX": EjectLevelMax,
			"SG_STORE_BYTES": StoreBytes, "SG_CSUM_CHUNK": CsumChunk, "SG_REP_WORDS": RepWords,
			"SG_COPY_MILLI": CopyMilli,
		},
		"sg_reduce": {
			"SG_RED_SUM": RedSum, "SG_RED_MIN": RedMin, "SG_RED_MAX": RedMax, "SG_RED_COUNT": RedCount,
			"SG_RED_GATHER": RedGather, "SG_RED_USER": RedUser,
		},
		"sg_dtype":      {"SG_T_I32": TypeI32, "SG_T_I64": TypeI64},
		"sg_status":     {"SG_ST_OK": StatusOK, "SG_ST_TIMEOUT": StatusTimeout},
		"sg_slot_state": {"SG_SLOT_FREE": SlotFree, "SG_SLOT_PENDING": SlotPending, "SG_SLOT_DONE": SlotDone},
		"sg_group_flags": {
			"SG_GF_LOOPBACK": GroupFlagLoopback, "SG_GF_WAKE_SOCKET": GroupFlagWakeSocket, "SG_GF_PARTS": GroupFlagParts,
			"SG_GF_REPLICAS": GroupFlagReplicas, "SG_GF_RESEND": GroupFlagResend,
		},
		"sg_result_flags":   {"SG_F_OVERFLOW": FlagOverflow, "SG_F_PARTS": FlagParts},
		"sg_replica_choice": {"SG_RC_ROUND_ROBIN": ChoiceRoundRobin, "SG_RC_LATENCY": ChoiceLatency},
	})

	size, members, err := bpftest.StructLayout(spec, "sg_hdr")
	if err != nil {
		t.Fatal(err)
	}
	if size != HdrLen {
		t.Errorf("struct sg_hdr is %d bytes, HdrLen %d", size, HdrLen)
	}
	base := Header{}.Append(nil)
	if len(base) != HdrLen {
		t.Fatalf("Header.Append wrote %d bytes, want HdrLen %d", len(base), HdrLen)
	}
	if m := members["magic"]; m.Offset != 0 || m.Size != 2 || base[0] != Magic>>8 || base[1] != Magic&0xff {
		t.Errorf("magic: C at %d (%d bytes), Go writes % x at 0", m.Offset, m.Size, base[:2])
	}
	fields := []struct {
		member string
		set    func(*Header)
	}{
		{"version", func(h *Header) { h.Version = ^uint8(0) }},
		{"op", func(h *Header) { h.Op = ^uint8(0) }},
		{"group", func(h *Header) { h.Group = ^uint16(0) }},
		{"worker", func(h *Header) { h.Worker = ^uint16(0) }},
		{"req_id", func(h *Header) { h.ReqID = ^uint64(0) }},
		{"status", func(h *Header) { h.Status = ^uint16(0) }},
		{"need", func(h *Header) { h.Need = ^uint16(0) }},
		{"part", func(h *Header) { h.Part = ^uint16(0) }},
		{"nparts", func(h *Header) { h.NParts = ^uint16(0) }},
		{"timeout_us", func(h *Header) { h.TimeoutUS = ^uint32(0) }},
		{"payload_len", func(h *Header) { h.PayloadLen = ^uint32(0) }},
	}
	if len(fields)+1 != len(members) {
		t.Errorf("struct sg_hdr has %d members, the Go codec %d (magic + %d)", len(members), len(fields)+1, len(fields))
	}
	for _, f := range fields {
		var h Header
		f.set(&h)
		off, n, err := bpftest.FieldBytes(base, h.Append(nil))
		m, ok := members[f.member]
		switch {
		case err != nil:
			t.Errorf("%s: %v", f.member, err)
		case !ok:
			t.Errorf("%s: not a member of struct sg_hdr", f.member)
		case off != m.Offset || n != m.Size:
			t.Errorf("%s: C at %d (%d bytes), Go writes it at %d (%d bytes)", f.member, m.Offset, m.Size, off, n)
		}
		// ParseHeader reads it back from the same place (a valid version, no payload).
		if f.member == "version" || f.member == "payload_len" {
			continue
		}
		h.Version = Version
		if got, _, err := ParseHeader(h.Append(nil)); err != nil || got != h {
			t.Errorf("%s: ParseHeader read %+v (%v), Append wrote %+v", f.member, got, err, h)
		}
	}
}
