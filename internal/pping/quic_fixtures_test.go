package pping

import (
	"encoding/binary"
	"time"

	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// QUIC packets between A (the client, port quicClientPort) and B (the server, port 443):
// A's packets go to a QUIC port, so A's direction is the client's. cidA and cidB are the
// connection ids each endpoint chose (8 bytes, aioquic's default length).
const quicClientPort = 40002

var (
	cidA = []byte{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8}
	cidB = []byte{0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8}
	// cidB2 is a new id B hands out (NEW_CONNECTION_ID) and A switches to.
	cidB2 = []byte{0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8}
)

// quicLong is a long-header (Initial) packet: first byte, version 1, the destination and
// source ids with their lengths, then what follows (token length, length, packet number and
// an encrypted payload: random to the monitor).
func quicLong(dcid, scid []byte) []byte {
	p := []byte{0xc0, 0, 0, 0, 1, byte(len(dcid))}
	p = append(p, dcid...)
	p = append(p, byte(len(scid)))
	p = append(p, scid...)
	return append(p, make([]byte, 40)...)
}

// quicShort is a short-header (1-RTT) packet with the spin bit and a destination id.
func quicShort(spin bool, dcid []byte) []byte {
	first := byte(0x40 | 0x01) // fixed bit, 2-byte packet number
	if spin {
		first |= 0x20
	}
	p := append([]byte{first}, dcid...)
	return append(p, make([]byte, 30)...) // packet number, payload, AEAD tag
}

// quic wraps a QUIC payload into a datagram from A to B:443 (fromA) or back.
func (f fam) quic(fromA bool, payload []byte) []byte {
	h := pktbuild.UDP{Src: quicClientPort, Dst: DefaultQUICPort}
	if !fromA {
		h.Src, h.Dst = DefaultQUICPort, quicClientPort
	}
	return f.ip(fromA).UDP(h).Payload(payload).Build()
}

// quicFixtures: the spin-bit state machine. The fixtures measure local flows (no FIB
// lookup), so both directions store edges and both ends' reflections are samples: B's
// (the RTT to the server) matched where A's edge was stored, A's (the client's) the other way.
func quicFixtures(f fam) []fixture {
	fromB := f.flowStr(true, DefaultQUICPort, quicClientPort)
	fromA := f.flowStr(false, quicClientPort, DefaultQUICPort)
	idB := binary.BigEndian.Uint64(cidB)
	short := func(fromA, spin bool) []byte {
		if fromA {
			return f.quic(true, quicShort(spin, cidB))
		}
		return f.quic(false, quicShort(spin, cidA))
	}
	// The handshake: A's Initial names A's id (so B's short headers carry 8 bytes of it),
	// B's names B's.
	handshake := []step{
		eg(f.quic(true, quicLong(make([]byte, 8), cidA)), c{"FlowCreated": 1, "QuicLong": 1}),
		in(f.quic(false, quicLong(cidA, cidB)), c{"FlowOpened": 1, "QuicLong": 1}),
	}
	// Both directions' first short headers: the spin values seen, nothing flipped yet.
	quiet := []step{
		eg(short(true, false), c{"FlowOpened": 1, "QuicShort": 1, "QuicSpinIdle": 1}),
		in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
	}
	opened := []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}, {fromA, FlowOpening, ReasonFirstPacket, SourceDest}}
	return []fixture{{
		name: "handshake, then one spin round each way: two samples",
		steps: concat(handshake, quiet, []step{
			// A flips to 1 (B sent 0): an edge, stored.
			eg(short(true, true), c{"QuicShort": 1, "QuicEdge": 1, "TsStored": 1}),
			// B reflects 1: the sample of A's edge (the RTT to B), and B's edge stored.
			in(short(false, true), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}),
			// More packets with the same values: nothing.
			in(short(false, true), c{"QuicShort": 1}),
			// A flips to 0 (B sent 1): the sample of B's edge (A's turnaround), stored.
			eg(short(true, false), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}),
		}),
		rtts: []wantRTT{
			{flow: fromB, proto: "UDP", id: idB, idType: IDQUICSpin, connID: cidB},
			{flow: fromA, proto: "UDP", id: idB, egress: true, idType: IDQUICSpin, connID: cidB},
		},
		flows: opened,
	}, {
		name: "reordered packet: an old value is not an edge",
		steps: concat(handshake, quiet, []step{
			eg(short(true, true), c{"QuicShort": 1, "QuicEdge": 1, "TsStored": 1}),
			// A's older packet (spin 0) leaves late: B still sends 0, so A flipping back
			// to 0 is not what the protocol does: rejected, the value stays 1.
			eg(short(true, false), c{"QuicShort": 1, "QuicEdgeRejected": 1}),
			eg(short(true, true), c{"QuicShort": 1}),
			// B reflects 1: A's stored edge is answered.
			in(short(false, true), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}),
			// And B's late 0 after it: rejected too (A sends 1, B does not flip to 0).
			in(short(false, false), c{"QuicShort": 1, "QuicEdgeRejected": 1}),
		}),
		rtts:  []wantRTT{{flow: fromB, proto: "UDP", id: idB, idType: IDQUICSpin, connID: cidB}},
		flows: opened,
	}, {
		name: "late packet right after an edge: too soon to be the next edge",
		steps: concat(handshake, quiet, []step{
			eg(short(true, true), c{"QuicShort": 1, "QuicEdge": 1, "TsStored": 1}), // t = 5 ms
			// B has not flipped yet: its packets are idle ones.
			in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			// B reflects 6 ms after A's edge: a 6 ms sample, the flow's min RTT.
			in(short(false, true), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}), // t = 11 ms
			eg(short(true, false), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}), // t = 12 ms
			// A packet B sent before its edge arrives late (t = 13 ms): A sends 0, so the
			// value passes the alternation test, but it comes 2 ms after B's last edge, less
			// than half the 6 ms min RTT: rejected.
			in(short(false, false), c{"QuicShort": 1, "QuicEdgeRejected": 1}),
			in(short(false, true), c{"QuicShort": 1}),
			in(short(false, true), c{"QuicShort": 1}),
			// B's real edge (t = 17 ms, 6 ms after its last): answers A's edge of t = 12 ms.
			in(short(false, true), c{"QuicShort": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}),
		}),
		rtts: []wantRTT{
			{flow: fromB, proto: "UDP", id: idB, idType: IDQUICSpin, connID: cidB},
			{flow: fromA, proto: "UDP", id: idB, egress: true, idType: IDQUICSpin, connID: cidB},
			{flow: fromB, proto: "UDP", id: idB, idType: IDQUICSpin, connID: cidB},
		},
		flows: opened,
	}, {
		name: "spin bit disabled (a fixed value): no samples, every packet counted idle",
		steps: concat(handshake, quiet, []step{
			eg(short(true, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			eg(short(true, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicSpinIdle": 1}),
		}),
		flows: opened,
	}, {
		name: "a new connection id restarts the spin state",
		steps: concat(handshake, quiet, []step{
			eg(short(true, true), c{"QuicShort": 1, "QuicEdge": 1, "TsStored": 1}),
			// A moves to B's new id and resets its spin value to 0 (RFC 9000): not an edge,
			// and A's stored edge no longer counts.
			eg(f.quic(true, quicShort(false, cidB2)), c{"QuicShort": 1, "QuicCidChanged": 1, "QuicSpinIdle": 1}),
			// B reflecting the old edge: A sends 0 now, so B's 1 is rejected.
			in(short(false, true), c{"QuicShort": 1, "QuicEdgeRejected": 1}),
			// The spin resumes under the new id: A flips (B sent 0), B reflects: a sample.
			eg(f.quic(true, quicShort(true, cidB2)), c{"QuicShort": 1, "QuicEdge": 1, "TsStored": 1}),
			in(short(false, true), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}),
		}),
		rtts:  []wantRTT{{flow: fromB, proto: "UDP", id: binary.BigEndian.Uint64(cidB2), idType: IDQUICSpin, connID: cidB2}},
		flows: opened,
	}, {
		name: "mid-connection (no handshake seen): samples without a connection id",
		steps: []step{
			eg(short(true, false), c{"FlowCreated": 1, "QuicShort": 1, "QuicSpinIdle": 1}),
			in(short(false, false), c{"FlowOpened": 1, "QuicShort": 1, "QuicSpinIdle": 1}),
			eg(short(true, true), c{"FlowOpened": 1, "QuicShort": 1, "QuicEdge": 1, "TsStored": 1}),
			in(short(false, true), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: "UDP", id: 0, idType: IDQUICSpin}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}, {fromA, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "rate limit: one stored edge per interval",
		cfg:  func(c *Config) { c.RateLimit = time.Hour },
		steps: concat(handshake, quiet, []step{
			eg(short(true, true), c{"QuicShort": 1, "QuicEdge": 1, "TsStored": 1}),
			in(short(false, true), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsStored": 1}),
			eg(short(true, false), c{"QuicShort": 1, "QuicEdge": 1, "MatchRtt": 1, "TsRateLimited": 1}),
			in(short(false, false), c{"QuicShort": 1, "QuicEdge": 1, "TsRateLimited": 1}),
		}),
		rtts: []wantRTT{
			{flow: fromB, proto: "UDP", id: idB, idType: IDQUICSpin, connID: cidB},
			{flow: fromA, proto: "UDP", id: idB, egress: true, idType: IDQUICSpin, connID: cidB},
		},
		flows: opened,
	}, {
		name: "malformed and other packets on the QUIC port",
		steps: []step{
			eg(f.quic(true, nil), c{"SkipUdpShort": 1}),                                                    // empty
			eg(f.quic(true, quicShort(true, cidB)[:5]), c{"SkipUdpShort": 1}),                              // id cut off
			eg(f.quic(true, []byte{0x01, 2, 3, 4, 5, 6, 7, 8, 9, 10}), c{"SkipProto": 1}),                  // fixed bit clear
			eg(f.quic(true, quicLong(cidA, cidB)[:9]), c{"SkipUdpShort": 1}),                               // long header cut off
			eg(f.quic(true, append([]byte{0xc0, 0, 0, 0, 0, 8}, make([]byte, 40)...)), c{"SkipProto": 1}),  // version negotiation
			eg(f.quic(true, append([]byte{0xc0, 0, 0, 0, 1, 21}, make([]byte, 40)...)), c{"SkipProto": 1}), // id longer than 20
		},
	}, {
		name:  "QUIC off: port 443 is just UDP",
		cfg:   func(c *Config) { c.QUIC = false },
		steps: []step{eg(short(true, false), c{"SkipProto": 1})},
	}}
}

func concat(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
