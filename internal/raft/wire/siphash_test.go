package wire

import (
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raft/wire/wiretest"
)

// Reference vectors of the SipHash authors (github.com/veorq/SipHash, vectors.h): key =
// bytes 00..0f, message i = bytes 00..i-1, output bytes as stored (little-endian words).
// Vector 15 of sip64 is the paper's Appendix A example (0xa129ca6149be45e5).
var (
	sip64Vectors = map[int]string{
		0: "310e0edd47db6f72", 1: "fd67dc93c539f874", 7: "37d1018bf50002ab", 8: "6224939a79f5f593",
		15: "e545be4961ca29a1", 16: "db9bc2577fcc2a3f", 31: "42c341d8fa92d832", 63: "724506eb4c328a95",
	}
	sip128Vectors = map[int]string{
		0:  "a3817f04ba25a8e66df67214c7550293",
		1:  "da87c1d86b99af44347659119b22fc45",
		7:  "a1f1ebbed8dbc153c0b84aa61ff08239",
		8:  "3b62a9ba6258f5610f83e264f31497b4",
		15: "5493e99933b0a8117e08ec0f97cfc3d9",
		16: "6ee2a4ca67b054bbfd3315bf85230577",
		31: "2939b0183223fafc1723de4f52c43d35",
		63: "5150d1772f50834a503e069a973fbd7c",
	}
)

func vecKey() (uint64, uint64) {
	var k [16]byte
	for i := range k {
		k[i] = byte(i)
	}
	return binary.LittleEndian.Uint64(k[:8]), binary.LittleEndian.Uint64(k[8:])
}

func vecMsg(n int) []byte {
	m := make([]byte, n)
	for i := range m {
		m[i] = byte(i)
	}
	return m
}

func sipBytes(a, b uint64, out128 bool) string {
	out := binary.LittleEndian.AppendUint64(nil, a)
	if out128 {
		out = binary.LittleEndian.AppendUint64(out, b)
	}
	return hex.EncodeToString(out)
}

func TestSipHashVectors(t *testing.T) {
	k0, k1 := vecKey()
	for n, want := range sip64Vectors {
		if got := sipBytes(SipHash64(k0, k1, vecMsg(n)), 0, false); got != want {
			t.Errorf("SipHash64(len %d) = %s, want %s", n, got, want)
		}
	}
	for n, want := range sip128Vectors {
		a, b := SipHash128(k0, k1, vecMsg(n))
		if got := sipBytes(a, b, true); got != want {
			t.Errorf("SipHash128(len %d) = %s, want %s", n, got, want)
		}
	}
	if got := SipHash64(k0, k1, vecMsg(15)); got != 0xa129ca6149be45e5 {
		t.Errorf("paper example = %#x, want 0xa129ca6149be45e5", got)
	}
}

// TestKernelSipHash runs siphash.h through BPF_PROG_TEST_RUN (authtest.bpf.c, siphash_xdp)
// on the reference vectors and on every length 0-63 against the Go implementation.
func TestKernelSipHash(t *testing.T) {
	bpftest.RequireRoot(t)
	objs := loadAuthObjs(t, 0)
	k0, k1 := vecKey()
	run := func(n int, out128 bool) string {
		v := wiretest.AuthtestSiphashVec{K0: k0, K1: k1, Len: uint32(n)}
		if out128 {
			v.Out128 = 1
		}
		copy(v.Msg[:], vecMsg(n))
		if err := objs.Vec.Update(uint32(0), &v, ebpf.UpdateAny); err != nil {
			t.Fatalf("write vector: %v", err)
		}
		if _, err := bpftest.Run(objs.SiphashXdp, make([]byte, 64)); err != nil {
			t.Fatalf("run: %v", err)
		}
		if err := objs.Vec.Lookup(uint32(0), &v); err != nil {
			t.Fatalf("read vector: %v", err)
		}
		return sipBytes(v.Out[0], v.Out[1], out128)
	}
	for n, want := range sip64Vectors {
		if got := run(n, false); got != want {
			t.Errorf("kernel SipHash64(len %d) = %s, want %s", n, got, want)
		}
	}
	for n, want := range sip128Vectors {
		if got := run(n, true); got != want {
			t.Errorf("kernel SipHash128(len %d) = %s, want %s", n, got, want)
		}
	}
	for n := range 64 {
		a, b := SipHash128(k0, k1, vecMsg(n))
		if got, want := run(n, true), sipBytes(a, b, true); got != want {
			t.Errorf("len %d: kernel %s, Go %s", n, got, want)
		}
		if got, want := run(n, false), sipBytes(SipHash64(k0, k1, vecMsg(n)), 0, false); got != want {
			t.Errorf("len %d (64-bit): kernel %s, Go %s", n, got, want)
		}
	}
}

// TestSipStream: the streaming SipHash-128 of the bulk transport equals the one-shot one
// for every split of every length 0-63 into two writes.
func TestSipStream(t *testing.T) {
	k0, k1 := vecKey()
	var key Key
	binary.LittleEndian.PutUint64(key[:8], k0)
	binary.LittleEndian.PutUint64(key[8:], k1)
	for n := range 64 {
		msg := vecMsg(n)
		a, b := SipHash128(k0, k1, msg)
		want := sipBytes(a, b, true)
		for cut := 0; cut <= n; cut++ {
			var s sip128
			s.init(&key, msg[:cut])
			s.Write(msg[cut:])
			got := s.sum()
			if hex.EncodeToString(got[:]) != want {
				t.Fatalf("len %d cut %d: stream %x, one-shot %s", n, cut, got, want)
			}
		}
	}
}
