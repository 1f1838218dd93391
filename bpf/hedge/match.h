/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* match.h - which service and request a UDP datagram belongs to, where every stage starts:
 * match() fills the scoreboard key from a request (to a service address) or a response (from
 * a service or replica address of an enabled service); what matches nothing passes
 * untouched, counted when it is malformed or a fragment. */
#ifndef KEDGE_HEDGE_MATCH_H
#define KEDGE_HEDGE_MATCH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "counters.h"
#include "parse.h"
#include "reqid.h"
#include "hedge.h"
#include "maps.h"

/* Which side of an exchange a datagram is: a request goes to a service address (client ->
 * service), a response comes from a service or replica address (service -> client). */
enum match_dir {
	MATCH_REQUEST = 0,
	MATCH_RESPONSE = 1,
};

/* A parsed UDP datagram matched to a service and request. */
struct match {
	struct pkt p;
	struct hreq_key key;
	struct replica_ref ref; /* responses: the replica (or service address) it came from */
	__u32 svc;
	struct svc_cfg *cfg;
	struct svc_state *st;
	struct hedge_stats *cnt;
};

static __always_inline void addr_key(struct svc_key *k, const struct in6_addr *a, __be16 port)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->a.addr = *a;
	k->a.port = port;
}

/* is_malformed: parse.h rejected the packet, and not for being something else than IP or a
 * fragment (those are not malformed). Nothing is known of its ports, so no service. */
static __always_inline int is_malformed(int perr, const struct pkt *p)
{
	return perr != PARSE_OK && perr != PARSE_ERR_L3_PROTO && perr != PARSE_ERR_FRAGMENT &&
	       !(p->flags & PKT_F_FRAG);
}

/* count_unparsed counts what match() passes for not being an unfragmented UDP datagram:
 * malformed packets in the global slot (malformed / malformed_responses), and outgoing
 * fragments (to a service's address, or non-first ones, which have no ports). */
static __always_inline void count_unparsed(int dir, int perr, const struct pkt *p)
{
	struct svc_key k;

	if (dir == MATCH_RESPONSE) {
		if (is_malformed(perr, p))
			COUNT(stats_global(), malformed_responses);
		return;
	}
	if (perr == PARSE_ERR_FRAGMENT || p->flags & PKT_F_FRAG) {
		addr_key(&k, &p->daddr, p->dport);
		if (perr == PARSE_ERR_FRAGMENT || bpf_map_lookup_elem(&services, &k))
			COUNT(stats_global(), fragments);
	} else if (is_malformed(perr, p)) {
		COUNT(stats_global(), malformed);
	}
}

/* addr_lookup: the service (MATCH_REQUEST: *ref's svc) or replica (MATCH_RESPONSE) of address
 * k, through this CPU's cache of the direction's last match (maps.h, addr_cache), else the
 * hash map; 0 on a match. Only matches are cached: an entry read under lookup_gen g holds
 * what the map said at or after g was raised, so it is stale only once g moved on. */
_Static_assert(sizeof(struct svc_key) == 20, "addr_lookup compares svc_key as five words");

static __always_inline int addr_lookup(int dir, const struct svc_key *k, struct replica_ref *ref)
{
	__u32 zero = 0, d = dir == MATCH_RESPONSE ? MATCH_RESPONSE : MATCH_REQUEST, gen = 0;
	__u32 *g = bpf_map_lookup_elem(&lookup_gen, &zero);
	struct addr_cache *c = bpf_map_lookup_elem(&addr_cache, &d);
	const __u32 *a = (const __u32 *)k, *b;

	if (g)
		gen = READ_ONCE(*g);
	if (c && gen && c->gen == gen) {
		b = (const __u32 *)&c->k;
		if (a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4]) {
			*ref = c->ref;
			return 0;
		}
	}
	if (dir == MATCH_REQUEST) {
		__u32 *svc = bpf_map_lookup_elem(&services, k);

		if (!svc)
			return -1;
		ref->svc = *svc;
		ref->index = REPLICA_NONE;
		ref->is_svc = 0;
	} else {
		struct replica_ref *r = bpf_map_lookup_elem(&replicas, k);

		if (!r)
			return -1;
		*ref = *r;
	}
	if (c && gen) {
		c->k = *k;
		c->ref = *ref;
		c->gen = gen;
	}
	return 0;
}

/* match: the datagram is a request to a service address (dir MATCH_REQUEST) or a response
 * from a service or replica address (MATCH_RESPONSE) of an enabled service, with its
 * request id; fills m and the scoreboard key (client address and port, service, id).
 * Returns 1 on a match; what does not match passes untouched, counted as above, or as
 * short_requests / short_responses when the datagram is shorter than its request id. */
static __always_inline int match(struct __sk_buff *skb, struct match *m, int dir)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	const struct in6_addr *svc_addr, *cli_addr;
	__be16 svc_port, cli_port;
	struct svc_key k;
	int perr;

	perr = parse_pkt(data, data_end, &m->p);
	if (perr != PARSE_OK || m->p.l4_proto != IPPROTO_UDP || (m->p.flags & PKT_F_FRAG)) {
		count_unparsed(dir, perr, &m->p);
		return 0;
	}
	if (dir == MATCH_REQUEST) {
		svc_addr = &m->p.daddr, svc_port = m->p.dport;
		cli_addr = &m->p.saddr, cli_port = m->p.sport;
	} else {
		svc_addr = &m->p.saddr, svc_port = m->p.sport;
		cli_addr = &m->p.daddr, cli_port = m->p.dport;
	}
	addr_key(&k, svc_addr, svc_port);
	if (addr_lookup(dir, &k, &m->ref) < 0)
		return 0;
	m->svc = m->ref.svc;
	if (m->svc >= SVC_MAX)
		return 0;
	m->cfg = bpf_map_lookup_elem(&svc_cfgs, &m->svc);
	m->st = bpf_map_lookup_elem(&svc_states, &m->svc);
	m->cnt = stats_for(m->svc);
	if (!m->cfg || !m->st || !m->cfg->enabled)
		return 0;
	__builtin_memset(&m->key, 0, sizeof(m->key));
	if (reqid_load(skb, &m->p, &m->cfg->reqid, &m->key.id) < 0) {
		if (dir == MATCH_REQUEST)
			COUNT(m->cnt, short_requests);
		else
			COUNT(m->cnt, short_responses);
		return 0;
	}
	m->key.caddr = *cli_addr;
	m->key.cport = cli_port;
	m->key.svc = m->svc;
	return 1;
}

/* replica_at bounds the index for the verifier (clang drops range checks it can prove, and
 * the verifier cannot follow % or the check on a different register). */
static __always_inline struct svc_addr *replica_at(struct svc_cfg *sc, __u32 i)
{
	barrier_var(i);
	i &= REPLICA_MAX - 1;
	return &sc->replicas[i];
}

#endif /* KEDGE_HEDGE_MATCH_H */
