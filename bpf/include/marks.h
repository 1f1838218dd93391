/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* marks.h - the skb->mark values kedge's programs set, in one registry so that no two
 * collide. A program marks a packet it sends again (a clone, a copy handed on) so that the
 * same hook recognises it on its next pass and lets it through instead of acting twice.
 *
 * Layout: 0x6b ('k') in the top byte, the owner in the second ('S' scatter-gather, 'd' the
 * lab fabric's duplicates, 'e' hedging), a small number in the low 16 bits, so the bits
 * that kube-proxy (0x4000, 0x8000) and Cilium (0x0f00, its magic) test stay clear. A mark
 * a user may move (a host that uses 0x6b......) is a field of the program's config struct
 * with the value below as its default.
 *
 * An enum, so bpf2go carries the values to Go (-type kedge_mark): the Go side never writes
 * one by hand. */
#ifndef KEDGE_MARKS_H
#define KEDGE_MARKS_H

enum kedge_mark {
	KEDGE_MARK_SG_COPY = 0x6b530000,    /* sg: a scatter copy, passed by the scatter */
	KEDGE_MARK_SG_CONT = 0x6b530001,    /* sg: a request handed on to the next batch */
	KEDGE_MARK_FABRIC_DUP = 0x6b640001, /* lab fabric: a duplicate on its way back in */
	KEDGE_MARK_HEDGE = 0x6b650000,      /* hedging: a hedge, never cloned again */
};

#endif /* KEDGE_MARKS_H */
