/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* siphash.h - SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012),
 * 64- and 128-bit output, written for the BPF verifier: no loops over data whose length the
 * verifier cannot bound, no stack arrays indexed by variables, every round inlined.
 *
 * Streaming use: siphash_init(), siphash_word() per 8-byte little-endian word of the
 * message, then siphash_final() with the last 0-7 bytes packed by siphash_tail_word() (or
 * built by hand: the message length in the top byte, the remaining bytes little-endian
 * below it). Keys are the 16 key bytes read as two little-endian u64s (k0 = bytes 0-7).
 *
 * Byte order: SipHash reads message words and writes its output little-endian; the BPF
 * target kedge builds for is bpfel (clang -target bpf on x86/arm64), where a plain load of a
 * u64 is that. The outputs are returned as u64s; a caller storing them into a packet writes
 * them little-endian (out[0] bytes 0-7, out[1] bytes 8-15).
 *
 * The same algorithm in Go is internal/raft/wire/siphash.go; both are checked against the
 * reference vectors of the SipHash authors (github.com/veorq/SipHash vectors.h, which
 * include the paper's Appendix A example) in internal/raft/wire/siphash_test.go - the BPF
 * one through BPF_PROG_TEST_RUN (bpf/raft/authtest.bpf.c).
 */
#ifndef KEDGE_SIPHASH_H
#define KEDGE_SIPHASH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct siphash_state {
	__u64 v0, v1, v2, v3;
};

#define SIPHASH_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

static __always_inline void siphash_round(struct siphash_state *s)
{
	s->v0 += s->v1;
	s->v1 = SIPHASH_ROTL(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = SIPHASH_ROTL(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = SIPHASH_ROTL(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = SIPHASH_ROTL(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = SIPHASH_ROTL(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = SIPHASH_ROTL(s->v2, 32);
}

/* out128: non-zero for the 128-bit output variant (it changes the initial state). */
static __always_inline void siphash_init(struct siphash_state *s, __u64 k0, __u64 k1, int out128)
{
	s->v0 = 0x736f6d6570736575ULL ^ k0;
	s->v1 = 0x646f72616e646f6dULL ^ k1;
	s->v2 = 0x6c7967656e657261ULL ^ k0;
	s->v3 = 0x7465646279746573ULL ^ k1;
	if (out128)
		s->v1 ^= 0xee;
}

/* One compression (c = 2 rounds) of the message word m. */
static __always_inline void siphash_word(struct siphash_state *s, __u64 m)
{
	s->v3 ^= m;
	siphash_round(s);
	siphash_round(s);
	s->v0 ^= m;
}

/* siphash_tail_word packs the last len % 8 bytes (already loaded little-endian into tail,
 * bytes beyond them zero) with the total message length len. */
static __always_inline __u64 siphash_tail_word(__u64 tail, __u64 len)
{
	return (len << 56) | tail;
}

/* Last block, then d = 4 finalization rounds. out[1] is written only for out128. */
static __always_inline void siphash_final(struct siphash_state *s, __u64 last, int out128, __u64 *out)
{
	siphash_word(s, last);
	s->v2 ^= out128 ? 0xee : 0xff;
	siphash_round(s);
	siphash_round(s);
	siphash_round(s);
	siphash_round(s);
	out[0] = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
	if (!out128)
		return;
	s->v1 ^= 0xdd;
	siphash_round(s);
	siphash_round(s);
	siphash_round(s);
	siphash_round(s);
	out[1] = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

#endif /* KEDGE_SIPHASH_H */
