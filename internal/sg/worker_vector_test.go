package sg

import (
	"bytes"
	"testing"
)

// TestAppendPartVector: the reference worker's reply carries, after the header, element j of
// its slice as ValueFor (int32: truncated) or the constant Values, big-endian, for whole
// replies and parts, int32 and int64, appended after what the buffer already held.
func TestAppendPartVector(t *testing.T) {
	h := Header{Group: 3, Worker: 41, ReqID: 1<<40 + 12345}
	for _, c := range []struct {
		typ    uint8
		elems  int
		nparts int
		values bool
	}{{TypeI32, 256, 1, false}, {TypeI64, 256, 1, false}, {TypeI32, 7, 1, false}, {TypeI64, 300, 3, false},
		{TypeI32, 256, 2, false}, {TypeI32, 5, 1, true}, {TypeI64, 9, 2, true}} {
		cfg := WorkerConfig{Type: c.typ, Elems: c.elems}
		if c.values {
			for j := range c.elems {
				cfg.Values = append(cfg.Values, int64(j*j)-1<<33)
			}
		}
		for p := range c.nparts {
			off, n := 0, c.elems
			if c.nparts > 1 {
				off, n, _ = PartSlice(c.elems, c.nparts, p)
			}
			prefix := []byte("held")
			b := AppendPart(append(make([]byte, 0, 8), prefix...), h, cfg, p, c.nparts)
			if !bytes.HasPrefix(b, prefix) {
				t.Fatalf("%+v part %d: the buffer's bytes were overwritten", c, p)
			}
			rh, payload, err := ParseHeader(b[len(prefix):])
			if err != nil || rh.ReqID != h.ReqID || rh.Worker != h.Worker || int(rh.Part) != p {
				t.Fatalf("%+v part %d: header %+v, %v", c, p, rh, err)
			}
			got := DecodeVector(payload, c.typ)
			if len(got) != n {
				t.Fatalf("%+v part %d: %d elements, want %d", c, p, len(got), n)
			}
			for j, x := range got {
				want := ValueFor(h.Worker, h.ReqID, off+j)
				if c.values {
					want = cfg.Values[off+j]
				}
				if c.typ == TypeI32 {
					want = int64(int32(want))
				}
				if x != want {
					t.Fatalf("%+v part %d: element %d = %d, want %d", c, p, off+j, x, want)
				}
			}
		}
	}
}

// BenchmarkAppendPart: one 256 x int32 reply into a reused buffer (the worker loop's case).
func BenchmarkAppendPart(b *testing.B) {
	cfg := WorkerConfig{Type: TypeI32, Elems: 256}
	buf := make([]byte, 0, 2048)
	for i := range b.N {
		buf = AppendPart(buf[:0], Header{Worker: 3, ReqID: uint64(i)}, cfg, 0, 1)
	}
}
