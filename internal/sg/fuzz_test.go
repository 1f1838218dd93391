package sg

import (
	"math/bits"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// FuzzGather feeds sg_gather arbitrary UDP payloads from a registered worker (or a
// stranger) of a group with a request in flight. Whatever the bytes, the program must
// not fail, must answer XDP_PASS or XDP_DROP, must pass everything the Go parser rejects
// or that is not a reply of the configured group, and the slot must stay consistent
// (count == answered bits, only registered workers' bits, no more workers with parts
// outstanding than workers). The group takes multi-packet replies, so parts with any
// part/nparts go through the part path (bpf/sg/parts.h) as well.
func FuzzGather(f *testing.F) {
	id := uint64(7)<<10 | 65
	f.Add(byte(0), reply(w4[0], coord4, 1, 0, id, vec64(1, 2, 3), nil)[42:])
	f.Add(byte(1), reply(w4[1], coord4, 1, 1, id, vec64(1, 2, 3), func(h *Header) { h.PayloadLen = 1 << 30 })[42:])
	f.Add(byte(2), reply(w4[2], coord4, 1, 2, id+1024, vec64(-1), nil)[42:])
	f.Add(byte(3), []byte{0x6b, 0x53, 1, 2})
	f.Add(byte(0), part(w4[0], coord4, 1, 0, id, TypeI64, []int64{1, 2, 3}, 1, 2)[42:])
	f.Add(byte(1), part(w4[1], coord4, 1, 1, id, TypeI64, []int64{1, 2, 3}, 2, 3)[42:])
	f.Add(byte(2), reply(w4[2], coord4, 1, 2, id, vec64(1), func(h *Header) { h.Part, h.NParts = 7, 40 })[42:])
	f.Add(byte(0), []byte("not sg at all"))

	bpftest.RequireRoot(f)
	fx := newPartsFixture(f, 1, coord4, w4, RedSum, TypeI64, 3)
	fx.arm(f, 1, id, 3)
	f.Fuzz(func(t *testing.T, who byte, payload []byte) {
		src := w4[int(who)%len(w4)]
		if who >= 200 {
			src = coord4 // not a worker
		}
		frame := pktbuild.New().IPv4(pktbuild.IPv4{Src: src.Addr(), Dst: coord4.Addr()}).
			UDP(pktbuild.UDP{Src: src.Port(), Dst: coord4.Port()}).Payload(payload).Build()
		res, err := bpftest.Run(fx.o.Gather, frame)
		if err != nil {
			t.Fatal(err)
		}
		if res.Ret != bpftest.XDPPass && res.Ret != bpftest.XDPDrop {
			t.Fatalf("verdict %d", res.Ret)
		}
		h, _, perr := ParseHeader(payload)
		if res.Ret == bpftest.XDPDrop && (perr != nil || h.Op != OpReply || h.Group != 1 || who >= 200) {
			t.Fatalf("dropped a datagram that is not a reply of group 1 from a worker: %+v %v", h, perr)
		}
		s := fx.slot(t, id)
		n := 0
		for _, w := range s.Res.Bitmap {
			n += bits.OnesCount64(w)
		}
		if n != int(s.Res.Count) || s.Res.Bitmap[0]&^0b111 != 0 || n > len(w4) || n+int(s.Res.Partial) > len(w4) {
			t.Fatalf("slot count %d, bitmap %b, partial %d", s.Res.Count, s.Res.Bitmap[0], s.Res.Partial)
		}
		// Drain results so the ring never fills.
		for _, ok := fx.rd.Read(nil); ok; _, ok = fx.rd.Read(nil) {
		}
	})
}
