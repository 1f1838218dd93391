/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* hedgeable.h - which requests may be hedged (docs/hedging.md, The hedgeable rule): a request
 * is hedged only when it is safe to send twice. A service's rule is up to HEDGE_RULES_MAX
 * alternatives, each a byte match at an offset of the UDP payload with a mask (memcached:
 * "get " or "gets " after the 8-byte frame header; DNS: a standard query, not UPDATE or
 * NOTIFY); a request that matches none passes unrecorded and unhedged (not_hedgeable), and so
 * does its response. A service without a rule hedges every request. */
#ifndef KEDGE_HEDGE_HEDGEABLE_H
#define KEDGE_HEDGE_HEDGEABLE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "parse.h"
#include "hedge.h"

/* rule_matches: the payload holds rule r's bytes at its offset (a payload too short for
 * them does not match). */
static __always_inline int rule_matches(struct __sk_buff *skb, const struct pkt *p, const struct hedge_rule *r)
{
	__u64 buf, mask, value;
	__u32 len = r->len;

	if (len == 0 || len > HEDGE_RULE_BYTES)
		return 0;
	if ((__u32)r->offset + len > p->payload_len)
		return 0;
	if (pkt_word(skb, p->payload_off + r->offset, len, &buf) < 0)
		return 0;
	__builtin_memcpy(&mask, r->mask, sizeof(mask));
	__builtin_memcpy(&value, r->value, sizeof(value));
	return (buf & mask) == value;
}

/* hedgeable: the request may be hedged (sc's rule matches it, or sc has none). */
static __always_inline int hedgeable(struct __sk_buff *skb, const struct pkt *p, const struct svc_cfg *sc)
{
	__u32 n = sc->nrules;

	if (!n)
		return 1;
	for (__u32 i = 0; i < HEDGE_RULES_MAX; i++) {
		if (i >= n)
			break;
		if (rule_matches(skb, p, &sc->rules[i]))
			return 1;
	}
	return 0;
}

#endif /* KEDGE_HEDGE_HEDGEABLE_H */
