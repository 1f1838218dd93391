/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Constants that vmlinux.h does not carry (they are #defines in UAPI and libc headers), so
 * that no program writes a bare number for them. */
#ifndef KEDGE_PROTO_H
#define KEDGE_PROTO_H

#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8

/* Local experimental ethertype (IEEE 802 "local experimental 2"). kedge uses it for the
 * conveyor delay line's filler frames, which never leave a kedge-owned namespace. */
#define ETH_P_KEDGE_FILLER 0x88B6

#define IPPROTO_HOPOPTS 0
/* IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP come from vmlinux.h's enum; these are UAPI #defines. */
#define IPPROTO_ROUTING 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_AH 51
#define IPPROTO_ICMPV6 58
#define IPPROTO_NONE 59
#define IPPROTO_DSTOPTS 60

#define IP_DF 0x4000 /* frag_off (host order): don't fragment, as Linux's UDP sockets send */
#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF
#define IPDEFTTL 64 /* TTL / hop limit of packets a program builds (Linux's ip_default_ttl) */

#define ICMP_ECHOREPLY 0
#define ICMP_ECHO 8
#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY 129

#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_TIMESTAMP 8
#define TCPOLEN_TIMESTAMP 10

#define AF_INET 2
#define AF_INET6 10

#define CLOCK_MONOTONIC 1 /* bpf_timer_init() */

/* errno values helpers return negated. */
#define EBUSY 16
#define EEXIST 17

#define TC_ACT_UNSPEC (-1)
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

/* TCX verdicts come from vmlinux.h (enum tcx_action_base). kedge TC programs return
 * TC_ACT_UNSPEC (== TCX_NEXT) rather than TC_ACT_OK when they let a packet go, so programs
 * attached after them (TCX chain or classic clsact filters) still run. */

#endif /* KEDGE_PROTO_H */
