package wire

import (
	"crypto/subtle"
	"encoding/binary"
)

// Authentication of the TCP bulk transport (docs/raft.md section 13), when the cluster has a
// key. After the dialler's hello (flag HelloKeyed set) and a 16-byte nonce of its own, the
// acceptor answers with a fresh nonce and a tag proving it holds the key; the dialler
// answers with its own tag. Both tags and the connection's session key are SipHash-2-4-128
// under the cluster key over a label, the hello and both nonces, so a recorded connection
// cannot be replayed (the acceptor's nonce is new) nor a hello from another cluster reused.
// Every frame is then followed by a 16-byte tag: SipHash-2-4-128 under the session key over
// the frame's sequence number on this connection (8 bytes, big endian), its 5-byte header
// and its body - frames cannot be forged, altered, reordered or replayed within the stream.

// HelloKeyed is the hello's flag byte (offset 5) of a dialler that authenticates.
const HelloKeyed = 1

// NonceLen and TagLen are the sizes of the handshake's nonces and of every tag.
const (
	NonceLen = 16
	TagLen   = MACLen
)

var (
	labelAccept  = []byte("KRFT-acc")
	labelDial    = []byte("KRFT-dia")
	labelSession = []byte("KRFT-ses")
)

// BulkHandshake holds what both ends derive from the hello and the two nonces.
type BulkHandshake struct {
	AcceptTag, DialTag [TagLen]byte
	session            Key
}

// NewBulkHandshake derives the tags and the session key.
func NewBulkHandshake(key *Key, hello, nonceD, nonceA []byte) *BulkHandshake {
	h := &BulkHandshake{}
	tag := func(label []byte) [TagLen]byte {
		var s sip128
		s.init(key, label)
		s.Write(hello)
		s.Write(nonceD)
		s.Write(nonceA)
		return s.sum()
	}
	h.AcceptTag, h.DialTag = tag(labelAccept), tag(labelDial)
	h.session = Key(tag(labelSession))
	return h
}

// FrameAuth tags (sender) or checks (receiver) the frames of one connection in order.
func (h *BulkHandshake) FrameAuth() *FrameAuth { return &FrameAuth{key: h.session} }

// FrameAuth is one direction of one connection.
type FrameAuth struct {
	key Key
	seq uint64
}

// Tag returns the next frame's tag (header = the 5-byte frame header).
func (f *FrameAuth) Tag(header, body []byte) [TagLen]byte {
	var s sip128
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], f.seq)
	f.seq++
	s.init(&f.key, seq[:])
	s.Write(header)
	s.Write(body)
	return s.sum()
}

// Check consumes the next sequence number and reports whether tag is the frame's.
func (f *FrameAuth) Check(header, body, tag []byte) bool {
	want := f.Tag(header, body)
	return subtle.ConstantTimeCompare(want[:], tag) == 1
}

// EqualTag compares tags in constant time.
func EqualTag(a [TagLen]byte, b []byte) bool { return subtle.ConstantTimeCompare(a[:], b) == 1 }

// sip128 is SipHash-2-4-128 over a stream of writes.
type sip128 struct {
	s    sipState
	buf  [8]byte
	nbuf int
	n    int
}

func (h *sip128) init(key *Key, first []byte) {
	k0, k1 := key.halves()
	h.s = sipState{0x736f6d6570736575 ^ k0, 0x646f72616e646f6d ^ k1 ^ 0xee, 0x6c7967656e657261 ^ k0, 0x7465646279746573 ^ k1}
	h.Write(first)
}

func (h *sip128) Write(p []byte) {
	h.n += len(p)
	if h.nbuf > 0 {
		c := copy(h.buf[h.nbuf:], p)
		h.nbuf += c
		p = p[c:]
		if h.nbuf < 8 {
			return
		}
		h.s.word(binary.LittleEndian.Uint64(h.buf[:]))
		h.nbuf = 0
	}
	for len(p) >= 8 {
		h.s.word(binary.LittleEndian.Uint64(p))
		p = p[8:]
	}
	h.nbuf = copy(h.buf[:], p)
}

func (h *sip128) sum() [TagLen]byte {
	last := uint64(h.n) << 56
	for i := range h.nbuf {
		last |= uint64(h.buf[i]) << (8 * i)
	}
	s := h.s
	s.word(last)
	s.v2 ^= 0xee
	for range 4 {
		s.round()
	}
	var out [TagLen]byte
	binary.LittleEndian.PutUint64(out[:8], s.v0^s.v1^s.v2^s.v3)
	s.v1 ^= 0xdd
	for range 4 {
		s.round()
	}
	binary.LittleEndian.PutUint64(out[8:], s.v0^s.v1^s.v2^s.v3)
	return out
}
