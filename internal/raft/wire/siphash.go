package wire

import (
	"encoding/binary"
	"math/bits"
)

// SipHash-2-4 (Aumasson and Bernstein, 2012) with 64- and 128-bit output: the Go twin of
// bpf/include/siphash.h. Keys are two little-endian u64s of the 16 key bytes; the output
// words are written little-endian when stored as bytes. siphash_test.go checks both
// against the reference vectors.

type sipState struct{ v0, v1, v2, v3 uint64 }

func (s *sipState) round() {
	s.v0 += s.v1
	s.v1 = bits.RotateLeft64(s.v1, 13)
	s.v1 ^= s.v0
	s.v0 = bits.RotateLeft64(s.v0, 32)
	s.v2 += s.v3
	s.v3 = bits.RotateLeft64(s.v3, 16)
	s.v3 ^= s.v2
	s.v0 += s.v3
	s.v3 = bits.RotateLeft64(s.v3, 21)
	s.v3 ^= s.v0
	s.v2 += s.v1
	s.v1 = bits.RotateLeft64(s.v1, 17)
	s.v1 ^= s.v2
	s.v2 = bits.RotateLeft64(s.v2, 32)
}

func (s *sipState) word(m uint64) {
	s.v3 ^= m
	s.round()
	s.round()
	s.v0 ^= m
}

func sipHash(k0, k1 uint64, msg []byte, out128 bool) (uint64, uint64) {
	s := sipState{0x736f6d6570736575 ^ k0, 0x646f72616e646f6d ^ k1, 0x6c7967656e657261 ^ k0, 0x7465646279746573 ^ k1}
	if out128 {
		s.v1 ^= 0xee
	}
	n := len(msg)
	for len(msg) >= 8 {
		s.word(binary.LittleEndian.Uint64(msg))
		msg = msg[8:]
	}
	last := uint64(n) << 56
	for i, c := range msg {
		last |= uint64(c) << (8 * i)
	}
	s.word(last)
	if out128 {
		s.v2 ^= 0xee
	} else {
		s.v2 ^= 0xff
	}
	for range 4 {
		s.round()
	}
	a := s.v0 ^ s.v1 ^ s.v2 ^ s.v3
	if !out128 {
		return a, 0
	}
	s.v1 ^= 0xdd
	for range 4 {
		s.round()
	}
	return a, s.v0 ^ s.v1 ^ s.v2 ^ s.v3
}

// SipHash64 is SipHash-2-4 with a 64-bit output.
func SipHash64(k0, k1 uint64, msg []byte) uint64 {
	a, _ := sipHash(k0, k1, msg, false)
	return a
}

// SipHash128 is SipHash-2-4 with a 128-bit output, as two words (bytes 0-7, 8-15).
func SipHash128(k0, k1 uint64, msg []byte) (uint64, uint64) {
	return sipHash(k0, k1, msg, true)
}
