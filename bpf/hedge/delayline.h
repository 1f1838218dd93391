/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* delayline.h - the hedger's side of the pacer (bpf/include/pacer.h, docs/pacer.md): its
 * clones ride the pacer as carried packets, and on edt the pacer asks for a clone's
 * deadline, which is its scoreboard entry's. */
#ifndef KEDGE_HEDGE_DELAYLINE_H
#define KEDGE_HEDGE_DELAYLINE_H

#include "maps.h"
#include "request.h"

static __always_inline __u64 pacer_carry_deadline(struct __sk_buff *skb)
{
	struct match m;
	struct hreq *e;

	if (!match(skb, &m, MATCH_REQUEST) || !(e = bpf_map_lookup_elem(&scoreboard, &m.key)))
		return 0;
	return e->deadline_ns;
}

#endif /* KEDGE_HEDGE_DELAYLINE_H */
