package parsetest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// validFx describes a packet parse_pkt accepts. The frame, the expected parse and the error
// expected for every truncation are all derived from this description (by construction, not
// by parsing the frame).
type validFx struct {
	name    string
	vlans   []uint16       // TPIDs, outermost first
	ip4     *pktbuild.IPv4 // exactly one of ip4, ip6
	ip6     *pktbuild.IPv6
	udp     *pktbuild.UDP // at most one of udp, tcp, icmp; none: proto
	tcp     *pktbuild.TCP
	icmp    *pktbuild.ICMP // ICMP under IPv4, ICMPv6 under IPv6
	proto   uint8          // L4 protocol without a header (ESP, no next header, unknown)
	payload int            // payload bytes after the L4 header
	trailer int            // bytes after the IP packet (Ethernet padding)
	frag    bool           // expect PKT_F_FRAG (a first fragment)
	ts      *[2]uint32     // expected TCP timestamp (tsval, tsecr); nil: not found
}

func (v validFx) builder() pktbuild.Builder {
	b := pktbuild.New()
	for _, tpid := range v.vlans {
		b = b.VLAN(pktbuild.VLAN{TPID: tpid, VID: 100})
	}
	if v.ip4 != nil {
		b = b.IPv4(*v.ip4)
	} else {
		b = b.IPv6(*v.ip6)
	}
	switch {
	case v.udp != nil:
		b = b.UDP(*v.udp)
	case v.tcp != nil:
		b = b.TCP(*v.tcp)
	case v.icmp != nil && v.ip4 != nil:
		b = b.ICMP(*v.icmp)
	case v.icmp != nil:
		b = b.ICMPv6(*v.icmp)
	default:
		b = b.Proto(v.proto)
	}
	payload := make([]byte, v.payload)
	for i := range payload {
		payload[i] = byte(0xA0 + i)
	}
	return b.Payload(payload).Trailer(make([]byte, v.trailer))
}

func pad4(n int) int { return (n + 3) &^ 3 }

// layer is a header of a valid frame: truncating the frame inside [start, end) must fail
// with err.
type layer struct {
	start, end int
	err        int32
}

// expect returns the parse of the complete frame and its headers.
func (v validFx) expect() (parse, []layer) {
	w := parse{TSRet: tsNotFound, Flags: 0}
	off := 14
	layers := []layer{{0, 14, errETH}}
	for range v.vlans {
		layers = append(layers, layer{off, off + 4, errVLAN})
		w.Flags |= flagVLAN
		off += 4
	}
	w.L3Off = uint16(off)
	var l4proto uint8
	switch {
	case v.udp != nil:
		l4proto = protoUDP
	case v.tcp != nil:
		l4proto = protoTCP
	case v.icmp != nil && v.ip4 != nil:
		l4proto = protoICMP
	case v.icmp != nil:
		l4proto = protoICMPv6
	default:
		l4proto = v.proto
	}
	if v.ip4 != nil {
		w.L3Proto = ethPIP
		// Fixtures use the default addresses; As16 of an IPv4 address is ::ffff:a.b.c.d.
		w.Saddr, w.Daddr = pktbuild.DefaultSrc4.As16(), pktbuild.DefaultDst4.As16()
		w.TTL, w.TOS = ttlOr64(v.ip4.TTL), v.ip4.TOS
		hlen := 20 + pad4(len(v.ip4.Options))
		if hlen > 20 {
			w.Flags |= flagIPOpts
		}
		layers = append(layers, layer{off, off + 20, errIP}, layer{off + 20, off + hlen, errIPIHL})
		off += hlen
	} else {
		w.L3Proto = ethPIPv6
		w.Saddr, w.Daddr = pktbuild.DefaultSrc6.As16(), pktbuild.DefaultDst6.As16()
		w.TTL, w.TOS = ttlOr64(v.ip6.HopLimit), v.ip6.TrafficClass
		layers = append(layers, layer{off, off + 40, errIP6})
		off += 40
		for _, e := range v.ip6.Ext {
			w.Flags |= flagIP6Ext
			layers = append(layers, layer{off, off + e.Len(), errExt})
			off += e.Len()
		}
	}
	if v.frag {
		w.Flags |= flagFrag
	}
	w.L4Proto, w.L4Off = l4proto, uint16(off)
	hdr := 0
	switch {
	case v.udp != nil:
		hdr = 8
		w.Sport, w.Dport = v.udp.Src, v.udp.Dst
		layers = append(layers, layer{off, off + 8, errUDP})
	case v.tcp != nil:
		hdr = 20 + pad4(len(v.tcp.Options))
		w.Sport, w.Dport = v.tcp.Src, v.tcp.Dst
		layers = append(layers, layer{off, off + 20, errTCP}, layer{off + 20, off + hdr, errTCPDoff})
		if v.ts != nil {
			w.TSRet, w.TSval, w.TSecr = 0, v.ts[0], v.ts[1]
		}
	case v.icmp != nil:
		hdr = 8
		if isEcho(l4proto, v.icmp.Type) {
			w.Sport, w.Dport = v.icmp.ID, v.icmp.Seq
		}
		layers = append(layers, layer{off, off + 8, errICMP})
	}
	w.PayloadOff = uint16(off + hdr)
	w.PayloadLen = uint16(v.payload)
	return w, layers
}

func ttlOr64(ttl uint8) uint8 {
	if ttl == 0 {
		return pktbuild.DefaultTTL
	}
	return ttl
}

func ts(tsval, tsecr uint32) *[2]uint32 { return &[2]uint32{tsval, tsecr} }

var (
	nop  = pktbuild.OptNOP()
	tsOp = pktbuild.OptTimestamp(0x11223344, 0x55667788)
	tsW  = ts(0x11223344, 0x55667788)
)

func opts(parts ...[]byte) []byte { return slices.Concat(parts...) }

func nops(n int) []byte { return slices.Repeat(nop, n) }

// validFixtures are the packets of every supported kind.
var validFixtures = []validFx{
	// IPv4.
	{name: "ipv4 udp", ip4: &pktbuild.IPv4{}, udp: &pktbuild.UDP{Src: 5000, Dst: 53}, payload: 12},
	{name: "ipv4 udp empty payload", ip4: &pktbuild.IPv4{}, udp: &pktbuild.UDP{Src: 1, Dst: 2}},
	{name: "ipv4 udp with ethernet padding", ip4: &pktbuild.IPv4{}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 2, trailer: 16},
	{name: "ipv4 tos ttl", ip4: &pktbuild.IPv4{TOS: 0xB8, TTL: 1}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 1},
	{name: "ipv4 df is not a fragment", ip4: &pktbuild.IPv4{DF: true, ID: 7}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 3},
	{name: "ipv4 tcp no options", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 40000, Dst: 80, Flags: pktbuild.ACK}, payload: 10},
	{name: "ipv4 tcp nop nop timestamp", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Flags: pktbuild.ACK, Options: opts(nop, nop, tsOp)}, payload: 5, ts: tsW},
	{name: "ipv4 tcp syn linux options", ip4: &pktbuild.IPv4{},
		tcp: &pktbuild.TCP{Src: 1, Dst: 2, Flags: pktbuild.SYN, Options: opts(pktbuild.OptMSS(1460), pktbuild.OptSACKPerm(), tsOp, nop, pktbuild.OptWScale(7))}, ts: tsW},
	{name: "ipv4 tcp mss without timestamp", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Flags: pktbuild.SYN, Options: pktbuild.OptMSS(1460)}},
	{name: "ipv4 tcp 8 nops then timestamp", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nops(8), tsOp)}, ts: tsW},
	{name: "ipv4 tcp 9 nops then timestamp (10th option)", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nops(9), tsOp)}, ts: tsW},
	{name: "ipv4 tcp 10 nops then timestamp (past TCP_MAX_OPTS)", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nops(10), tsOp)}},
	{name: "ipv4 tcp eol before timestamp", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(pktbuild.OptEOL(), nops(3), tsOp)}},
	{name: "ipv4 tcp timestamp with bad length skipped", ip4: &pktbuild.IPv4{},
		tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts([]byte{8, 6, 0, 0, 0, 0}, nop, nop, tsOp)}, ts: tsW},
	{name: "ipv4 tcp timestamp cut by doff", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nops(2), tsOp[:6])}},
	{name: "ipv4 tcp option with zero length", ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts([]byte{2, 0}, tsOp)}},
	{name: "ipv4 icmp echo request", ip4: &pktbuild.IPv4{}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPEchoRequest, ID: 0x4242, Seq: 7}, payload: 56},
	{name: "ipv4 icmp echo reply", ip4: &pktbuild.IPv4{}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPEchoReply, ID: 0x4242, Seq: 8}},
	{name: "ipv4 icmp unreachable has no id", ip4: &pktbuild.IPv4{}, icmp: &pktbuild.ICMP{Type: 3, Code: 4, ID: 0, Seq: 1400}, payload: 28},
	{name: "ipv4 options udp", ip4: &pktbuild.IPv4{Options: []byte{148, 4, 0, 0}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 4},
	{name: "ipv4 40 bytes of options tcp", ip4: &pktbuild.IPv4{Options: opts(nops(39), []byte{0})},
		tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nop, nop, tsOp)}, ts: tsW},
	{name: "ipv4 options icmp", ip4: &pktbuild.IPv4{Options: []byte{7, 7, 4, 0, 0, 0, 0}}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPEchoRequest, ID: 1, Seq: 2}},
	{name: "ipv4 first fragment udp", ip4: &pktbuild.IPv4{MF: true, ID: 99}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 16, frag: true},
	{name: "ipv4 first fragment tcp", ip4: &pktbuild.IPv4{MF: true, ID: 99}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nop, nop, tsOp)}, payload: 16, frag: true, ts: tsW},
	{name: "ipv4 vlan udp", vlans: []uint16{pktbuild.TPID8021Q}, ip4: &pktbuild.IPv4{}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 1},
	{name: "ipv4 qinq tcp", vlans: []uint16{pktbuild.TPID8021AD, pktbuild.TPID8021Q}, ip4: &pktbuild.IPv4{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nop, nop, tsOp)}, ts: tsW},
	{name: "ipv4 two 802.1q tags icmp", vlans: []uint16{pktbuild.TPID8021Q, pktbuild.TPID8021Q}, ip4: &pktbuild.IPv4{}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPEchoRequest, ID: 3, Seq: 4}},
	{name: "ipv4 vlan options first fragment udp", vlans: []uint16{pktbuild.TPID8021Q}, ip4: &pktbuild.IPv4{MF: true, Options: []byte{148, 4, 0, 0}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, frag: true},
	{name: "ipv4 unknown l4 (gre)", ip4: &pktbuild.IPv4{}, proto: 47, payload: 8},
	{name: "ipv4 esp", ip4: &pktbuild.IPv4{}, proto: 50, payload: 16},
	{name: "ipv4 unknown l4 no payload", ip4: &pktbuild.IPv4{}, proto: 253},

	// IPv6.
	{name: "ipv6 udp", ip6: &pktbuild.IPv6{}, udp: &pktbuild.UDP{Src: 5000, Dst: 53}, payload: 12},
	{name: "ipv6 traffic class hop limit", ip6: &pktbuild.IPv6{TrafficClass: 0xB9, FlowLabel: 0xFFFFF, HopLimit: 255}, udp: &pktbuild.UDP{Src: 1, Dst: 2}},
	{name: "ipv6 udp with ethernet padding", ip6: &pktbuild.IPv6{}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, trailer: 5},
	{name: "ipv6 tcp", ip6: &pktbuild.IPv6{}, tcp: &pktbuild.TCP{Src: 1, Dst: 443, Flags: pktbuild.ACK}, payload: 100},
	{name: "ipv6 tcp nop nop timestamp", ip6: &pktbuild.IPv6{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nop, nop, tsOp)}, payload: 3, ts: tsW},
	{name: "ipv6 tcp 40 bytes of options", ip6: &pktbuild.IPv6{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(tsOp, nops(30))}, ts: tsW},
	{name: "ipv6 tcp syn without timestamp", ip6: &pktbuild.IPv6{}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Flags: pktbuild.SYN, Options: opts(pktbuild.OptMSS(1440), nop, pktbuild.OptWScale(7), nop, nop, pktbuild.OptSACKPerm())}},
	{name: "ipv6 icmpv6 echo request", ip6: &pktbuild.IPv6{}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPv6EchoRequest, ID: 0x1234, Seq: 1}, payload: 56},
	{name: "ipv6 icmpv6 echo reply", ip6: &pktbuild.IPv6{}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPv6EchoReply, ID: 0x1234, Seq: 2}},
	{name: "ipv6 icmpv6 unreachable has no id", ip6: &pktbuild.IPv6{}, icmp: &pktbuild.ICMP{Type: 1, Code: 4, ID: 0, Seq: 0}, payload: 48},
	{name: "ipv6 hop-by-hop udp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 4},
	{name: "ipv6 large hop-by-hop udp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(32)}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}},
	{name: "ipv6 routing tcp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Routing(3)}}, tcp: &pktbuild.TCP{Src: 1, Dst: 2}, payload: 1},
	{name: "ipv6 dstopts icmpv6", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.DestOpts(2)}}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPv6EchoRequest, ID: 5, Seq: 6}},
	{name: "ipv6 first fragment udp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(0, true, 77)}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 8, frag: true},
	{name: "ipv6 first fragment tcp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(0, true, 77)}}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nop, nop, tsOp)}, payload: 8, frag: true, ts: tsW},
	{name: "ipv6 atomic fragment is not a fragment", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(0, false, 77)}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 8},
	{name: "ipv6 ah tcp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.AH(0x100, 1, make([]byte, 12))}}, tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nop, nop, tsOp)}, ts: tsW},
	{name: "ipv6 ah with 4-byte-unit length udp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.AH(0x100, 1, make([]byte, 4))}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}},
	{name: "ipv6 six extension headers udp", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{
		pktbuild.HopByHop(1), pktbuild.DestOpts(1), pktbuild.Routing(1), pktbuild.Fragment(0, true, 1), pktbuild.AH(1, 2, make([]byte, 12)), pktbuild.DestOpts(1),
	}}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 2, frag: true},
	{name: "ipv6 no next header", ip6: &pktbuild.IPv6{}, proto: 59},
	{name: "ipv6 hop-by-hop then no next header", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}, proto: 59, payload: 4},
	{name: "ipv6 esp", ip6: &pktbuild.IPv6{}, proto: 50, payload: 24},
	{name: "ipv6 unknown next header", ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.DestOpts(1)}}, proto: 253, payload: 3},
	{name: "ipv6 vlan udp", vlans: []uint16{pktbuild.TPID8021Q}, ip6: &pktbuild.IPv6{}, udp: &pktbuild.UDP{Src: 1, Dst: 2}, payload: 1},
	{name: "ipv6 qinq icmpv6 echo", vlans: []uint16{pktbuild.TPID8021AD, pktbuild.TPID8021Q}, ip6: &pktbuild.IPv6{}, icmp: &pktbuild.ICMP{Type: pktbuild.ICMPv6EchoRequest, ID: 9, Seq: 9}},
	{name: "ipv6 qinq hop-by-hop tcp", vlans: []uint16{pktbuild.TPID8021AD, pktbuild.TPID8021Q}, ip6: &pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}},
		tcp: &pktbuild.TCP{Src: 1, Dst: 2, Options: opts(nop, nop, tsOp)}, ts: tsW},
}

func TestValidFixtures(t *testing.T) {
	h := load(t)
	for _, fx := range validFixtures {
		t.Run(fx.name, func(t *testing.T) {
			want, _ := fx.expect()
			h.checkFixture(t, fx.builder().Build(), want)
		})
	}
}

// TestTruncations cuts every valid fixture at every length and expects the error of the
// header the cut falls in, or the complete parse once all headers are in (lengths and
// payload_len come from the headers, not from the end of the data).
func TestTruncations(t *testing.T) {
	h := load(t)
	runs, skipped := 0, 0
	for _, fx := range validFixtures {
		t.Run(fx.name, func(t *testing.T) {
			frame := fx.builder().Build()
			full, layers := fx.expect()
			for n := minFrame; n <= len(frame); n++ {
				cut := pktbuild.Truncate(frame, n)
				want := refParse(cut)
				wantRet := int32(parseOK)
				for _, l := range layers {
					if n >= l.start && n < l.end {
						wantRet = l.err
						break
					}
				}
				if wantRet == parseOK && want != full {
					t.Errorf("cut at %d of %d: reference parse differs from the complete one:\n%s", n, len(frame), want.diff(full))
				}
				if want.Ret != wantRet {
					t.Errorf("cut at %d of %d: reference returned %s, want %s", n, len(frame), retName(want.Ret), retName(wantRet))
				}
				for _, c := range h.cases(fmt.Sprintf("cut at %d of %d: parse_", n, len(frame)), cut, wantParse(want)) {
					if h.runner.RunCase(t, c) {
						runs++
					} else {
						skipped++
					}
				}
			}
		})
	}
	t.Logf("%d runs of truncated frames; %d refused by the skb test runner (short IP header)", runs, skipped)
}

// TestShortFramesRejected documents that BPF_PROG_TEST_RUN refuses packets shorter than an
// Ethernet header, so PARSE_ERR_ETH cannot be reached through it (the reference covers it).
func TestShortFramesRejected(t *testing.T) {
	h := load(t)
	frame := validFixtures[0].builder().Build()
	for n := range minFrame {
		if ref := refParse(frame[:n]); ref.Ret != errETH {
			t.Errorf("reference on %d bytes returned %s, want ETH", n, retName(ref.Ret))
		}
		// Recent kernels refuse test runs shorter than an Ethernet header; older ones (5.10
		// for XDP) run them, and then the parser must say ETH.
		onlyRet := func(tb testing.TB, e entry, got parse) {
			if got.Ret != errETH {
				tb.Errorf("parse_%s returned %s, want ETH", e.name, retName(got.Ret))
			}
		}
		for _, c := range h.cases(fmt.Sprintf("%d-byte packet: parse_", n), frame[:n], onlyRet) {
			h.runner.RunCase(t, c)
		}
	}
}

// malformedFx is a hand-written frame with its complete expected parse.
type malformedFx struct {
	name  string
	frame []byte
	want  parse
}

var (
	v4    = pktbuild.New().IPv4(pktbuild.IPv4{})
	v6    = pktbuild.New().IPv6(pktbuild.IPv6{})
	udp   = pktbuild.UDP{Src: 1000, Dst: 2000}
	tcp   = pktbuild.TCP{Src: 1000, Dst: 2000}
	echo4 = pktbuild.ICMP{Type: pktbuild.ICMPEchoRequest, ID: 11, Seq: 12}
	echo6 = pktbuild.ICMP{Type: pktbuild.ICMPv6EchoRequest, ID: 11, Seq: 12}
)

// at is what a parse that got past Ethernet (no VLAN) holds.
func at(l3proto uint16, ret int32) parse {
	return parse{Ret: ret, TSRet: tsNotFound, L3Proto: l3proto, L3Off: 14}
}

// ip4 is the expected parse of a default IPv4 header (no options) that passed its checks.
func ip4(ret int32, l4 uint8, payloadLen int) parse {
	p := at(ethPIP, ret)
	p.Saddr, p.Daddr = pktbuild.DefaultSrc4.As16(), pktbuild.DefaultDst4.As16()
	p.TTL, p.L4Proto, p.L4Off, p.PayloadOff, p.PayloadLen = 64, l4, 34, 34, uint16(payloadLen)
	return p
}

// ip6 is the expected parse of a default IPv6 header with extLen bytes of extension headers.
func ip6(ret int32, l4 uint8, extLen, payloadLen int) parse {
	p := at(ethPIPv6, ret)
	p.Saddr, p.Daddr = pktbuild.DefaultSrc6.As16(), pktbuild.DefaultDst6.As16()
	off := uint16(54 + extLen)
	p.TTL, p.L4Proto, p.L4Off, p.PayloadOff, p.PayloadLen = 64, l4, off, off, uint16(payloadLen)
	if extLen > 0 {
		p.Flags |= flagIP6Ext
	}
	return p
}

func with(p parse, f func(*parse)) parse { f(&p); return p }

func ext(n int) []pktbuild.Ext {
	out := make([]pktbuild.Ext, n)
	for i := range out {
		out[i] = pktbuild.DestOpts(1)
	}
	return out
}

func malformedFixtures() []malformedFx {
	vlan := pktbuild.VLAN{VID: 1}
	threeTags := pktbuild.New().VLAN(vlan).VLAN(vlan).VLAN(vlan).IPv4(pktbuild.IPv4{}).UDP(udp).Build()
	hexFF := slices.Repeat([]byte{0xFF}, 16)
	fxs := []malformedFx{
		// Ethernet and VLAN.
		{"unknown ethertype", pktbuild.New().Ether(pktbuild.Ether{Type: 0x88B6}).Payload(make([]byte, 46)).Build(), parse{Ret: errL3Proto, TSRet: tsNotFound, L3Off: 14}},
		{"arp", pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build(), parse{Ret: errL3Proto, TSRet: tsNotFound, L3Off: 14}},
		{"vlan then unknown ethertype", pktbuild.New().Ether(pktbuild.Ether{}).VLAN(vlan).Build(),
			parse{Ret: errL3Proto, TSRet: tsNotFound, L3Off: 18, Flags: flagVLAN}},
		{"three vlan tags", threeTags, parse{Ret: errVLANDepth, TSRet: tsNotFound, Flags: flagVLAN}},
		{"three vlan tags, third truncated", threeTags[:22], parse{Ret: errVLANDepth, TSRet: tsNotFound, Flags: flagVLAN}},
		{"three 802.1ad tags", pktbuild.New().VLAN(pktbuild.VLAN{TPID: pktbuild.TPID8021AD}).VLAN(pktbuild.VLAN{TPID: pktbuild.TPID8021AD}).
			VLAN(pktbuild.VLAN{TPID: pktbuild.TPID8021AD}).IPv6(pktbuild.IPv6{}).UDP(udp).Build(), parse{Ret: errVLANDepth, TSRet: tsNotFound, Flags: flagVLAN}},

		// IPv4 header.
		{"ipv4 version 6", pktbuild.New().IPv4(pktbuild.IPv4{Version: new(6)}).UDP(udp).Build(), at(ethPIP, errIP)},
		{"ipv4 version 0", pktbuild.New().IPv4(pktbuild.IPv4{Version: new(0)}).UDP(udp).Build(), at(ethPIP, errIP)},
		{"ipv4 ihl 0", pktbuild.New().IPv4(pktbuild.IPv4{IHL: new(0)}).UDP(udp).Build(), at(ethPIP, errIPIHL)},
		{"ipv4 ihl 4", pktbuild.New().IPv4(pktbuild.IPv4{IHL: new(4)}).UDP(udp).Build(), at(ethPIP, errIPIHL)},
		{"ipv4 ihl past the packet", pktbuild.New().IPv4(pktbuild.IPv4{IHL: new(15)}).UDP(udp).Build(), at(ethPIP, errIPIHL)},
		{"ipv4 ihl 6 one byte short", pktbuild.Truncate(pktbuild.New().IPv4(pktbuild.IPv4{Options: []byte{1, 1, 1, 1}}).Build(), 14+23), at(ethPIP, errIPIHL)},
		{"ipv4 tot_len 0", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(0)}).UDP(udp).Build(), at(ethPIP, errIPLen)},
		{"ipv4 tot_len 19", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(19)}).UDP(udp).Build(), at(ethPIP, errIPLen)},
		{"ipv4 tot_len < header with options", pktbuild.New().IPv4(pktbuild.IPv4{Options: []byte{1, 1, 1, 1}, TotLen: new(23)}).UDP(udp).Build(), at(ethPIP, errIPLen)},
		{"ipv4 tot_len = header, udp", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(20)}).UDP(udp).Build(), ip4(errIPLen, protoUDP, 0)},
		{"ipv4 tot_len = header, udp first fragment", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(20), MF: true}).UDP(udp).Build(),
			with(ip4(errIPLen, protoUDP, 0), func(p *parse) { p.Flags |= flagFrag })},
		{"ipv4 tot_len short of tcp header", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(39)}).TCP(tcp).Build(), ip4(errIPLen, protoTCP, 19)},
		{"ipv4 tot_len short of tcp options", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(40 + 11)}).TCP(pktbuild.TCP{Options: tsOp}).Build(), ip4(errIPLen, protoTCP, 31)},
		{"ipv4 tot_len short of icmp header", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(27)}).ICMP(echo4).Build(), ip4(errIPLen, protoICMP, 7)},
		{"ipv4 tot_len beyond the data is fine", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(1500)}).TCP(tcp).Build(),
			with(ip4(parseOK, protoTCP, 1480), func(p *parse) { p.Sport, p.Dport, p.PayloadOff, p.PayloadLen = 1000, 2000, 54, 1460 })},

		// IPv4 fragments.
		{"ipv4 second fragment", pktbuild.New().IPv4(pktbuild.IPv4{MF: true, FragOffset: 1}).Payload(make([]byte, 16)).Build(),
			with(ip4(errFragment, 59, 16), func(p *parse) { p.Flags |= flagFrag })},
		{"ipv4 last fragment (offset, no MF)", pktbuild.New().IPv4(pktbuild.IPv4{FragOffset: 185}).UDP(udp).Build(),
			with(ip4(errFragment, protoUDP, 8), func(p *parse) { p.Flags |= flagFrag })},
		{"ipv4 later fragment with a truncated l4 header", pktbuild.Truncate(pktbuild.New().IPv4(pktbuild.IPv4{FragOffset: 8191}).TCP(tcp).Build(), 36),
			with(ip4(errFragment, protoTCP, 20), func(p *parse) { p.Flags |= flagFrag })},

		// UDP.
		{"udp length 0", v4.UDP(pktbuild.UDP{Length: new(0)}).Build(), ip4(errUDP, protoUDP, 8)},
		{"udp length 7", v4.UDP(pktbuild.UDP{Length: new(7)}).Build(), ip4(errUDP, protoUDP, 8)},
		{"udp length > ip payload", v4.UDP(pktbuild.UDP{Length: new(13)}).Payload(make([]byte, 4)).Build(), ip4(errUDP, protoUDP, 12)},
		{"udp length > ipv6 payload", v6.UDP(pktbuild.UDP{Length: new(9)}).Build(), ip6(errUDP, protoUDP, 0, 8)},
		{"udp length < ip payload", v4.UDP(pktbuild.UDP{Src: 1, Dst: 2, Length: new(10)}).Payload(make([]byte, 6)).Build(),
			with(ip4(parseOK, protoUDP, 2), func(p *parse) { p.Sport, p.Dport, p.PayloadOff = 1, 2, 42 })},
		{"udp first fragment length beyond the fragment", pktbuild.New().IPv4(pktbuild.IPv4{MF: true}).UDP(pktbuild.UDP{Src: 1, Dst: 2, Length: new(3000)}).Build(),
			with(ip4(parseOK, protoUDP, 2992), func(p *parse) { p.Sport, p.Dport, p.PayloadOff, p.Flags = 1, 2, 42, flagFrag })},

		// TCP.
		{"tcp doff 0", v4.TCP(pktbuild.TCP{DataOffset: new(0)}).Build(), ip4(errTCPDoff, protoTCP, 20)},
		{"tcp doff 4", v4.TCP(pktbuild.TCP{DataOffset: new(4)}).Build(), ip4(errTCPDoff, protoTCP, 20)},
		{"tcp doff past the packet", v4.TCP(pktbuild.TCP{DataOffset: new(15)}).Payload(make([]byte, 39)).Build(), ip4(errTCPDoff, protoTCP, 59)},
		{"tcp doff past tot_len", pktbuild.New().IPv4(pktbuild.IPv4{TotLen: new(40)}).TCP(pktbuild.TCP{DataOffset: new(6)}).Payload(make([]byte, 4)).Build(),
			ip4(errIPLen, protoTCP, 20)},
		{"ipv6 tcp doff past payload_len", pktbuild.New().IPv6(pktbuild.IPv6{PayloadLen: new(20)}).TCP(pktbuild.TCP{DataOffset: new(6)}).Payload(make([]byte, 4)).Build(),
			ip6(errIPLen, protoTCP, 0, 20)},

		// ICMP.
		{"icmp truncated", pktbuild.Truncate(v4.ICMP(echo4).Build(), 41), ip4(errICMP, protoICMP, 8)},
		{"icmpv6 payload_len short", pktbuild.New().IPv6(pktbuild.IPv6{PayloadLen: new(7)}).ICMPv6(echo6).Build(), ip6(errIPLen, protoICMPv6, 0, 7)},

		// IPv6 header and extension headers.
		{"ipv6 version 4", pktbuild.New().IPv6(pktbuild.IPv6{Version: new(4)}).UDP(udp).Build(), at(ethPIPv6, errIP6)},
		{"ipv6 seven extension headers", pktbuild.New().IPv6(pktbuild.IPv6{Ext: ext(7)}).UDP(udp).Build(),
			parse{Ret: errExtDepth, TSRet: tsNotFound, L3Proto: ethPIPv6, L3Off: 14, Flags: flagIP6Ext}},
		{"ipv6 seven extension headers, last truncated", pktbuild.Truncate(pktbuild.New().IPv6(pktbuild.IPv6{Ext: ext(7)}).Build(), 54+48+1),
			parse{Ret: errExtDepth, TSRet: tsNotFound, L3Proto: ethPIPv6, L3Off: 14, Flags: flagIP6Ext}},
		{"ipv6 extension header length past the packet", pktbuild.New().IPv6(pktbuild.IPv6{Ext: []pktbuild.Ext{{Proto: pktbuild.ProtoDestOpts, Body: make([]byte, 6), HdrLen: new(2)}}}).UDP(udp).Build(),
			parse{Ret: errExt, TSRet: tsNotFound, L3Proto: ethPIPv6, L3Off: 14, Flags: flagIP6Ext}},
		{"ipv6 ah length past the packet", pktbuild.New().IPv6(pktbuild.IPv6{Ext: []pktbuild.Ext{{Proto: pktbuild.ProtoAH, Body: make([]byte, 10), HdrLen: new(5)}}}).UDP(udp).Build(),
			parse{Ret: errExt, TSRet: tsNotFound, L3Proto: ethPIPv6, L3Off: 14, Flags: flagIP6Ext}},
		{"ipv6 payload_len < extension headers", pktbuild.New().IPv6(pktbuild.IPv6{PayloadLen: new(7), Ext: ext(1)}).UDP(udp).Build(),
			parse{Ret: errIPLen, TSRet: tsNotFound, L3Proto: ethPIPv6, L3Off: 14, Flags: flagIP6Ext}},
		{"ipv6 payload_len = extension headers, udp", pktbuild.New().IPv6(pktbuild.IPv6{PayloadLen: new(8), Ext: ext(1)}).UDP(udp).Build(), ip6(errIPLen, protoUDP, 8, 0)},
		{"ipv6 payload_len 0, tcp", pktbuild.New().IPv6(pktbuild.IPv6{PayloadLen: new(0)}).TCP(tcp).Build(), ip6(errIPLen, protoTCP, 0, 0)},

		// IPv6 fragments.
		{"ipv6 later fragment udp", pktbuild.New().IPv6(pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(1, true, 5)}}).UDP(udp).Build(),
			with(ip6(errFragment, protoUDP, 8, 8), func(p *parse) { p.Flags |= flagFrag })},
		{"ipv6 last fragment", pktbuild.New().IPv6(pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1), pktbuild.Fragment(100, false, 5)}}).UDP(udp).Build(),
			with(ip6(errFragment, protoUDP, 16, 8), func(p *parse) { p.Flags |= flagFrag })},
		{"ipv6 later fragment, next header dstopts, data follows", pktbuild.New().IPv6(pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(3, true, 5)}}).
			Proto(pktbuild.ProtoDestOpts).Payload(hexFF).Build(),
			with(ip6(errFragment, protoDestOpts, 8, 16), func(p *parse) { p.Flags |= flagFrag })},
		{"ipv6 later fragment, next header fragment", pktbuild.New().IPv6(pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(3, false, 5)}}).
			Proto(pktbuild.ProtoFragment).Payload(hexFF[:2]).Build(),
			with(ip6(errFragment, protoFragment, 8, 2), func(p *parse) { p.Flags |= flagFrag })},
	}
	return fxs
}

func TestMalformedFixtures(t *testing.T) {
	h := load(t)
	for _, fx := range malformedFixtures() {
		t.Run(fx.name, func(t *testing.T) {
			h.checkFixture(t, fx.frame, fx.want)
		})
	}
}

// TestErrorCodesCovered checks that the fixtures reach every parse_err the kernel can
// return through BPF_PROG_TEST_RUN (all but PARSE_ERR_ETH).
func TestErrorCodesCovered(t *testing.T) {
	seen := map[int32]bool{}
	for _, fx := range validFixtures {
		w, layers := fx.expect()
		seen[w.Ret] = true
		for _, l := range layers {
			seen[l.err] = true
		}
	}
	for _, fx := range malformedFixtures() {
		seen[fx.want.Ret] = true
	}
	for code := int32(0); code > -parseErrMax; code-- {
		if !seen[code] {
			t.Errorf("no fixture expects %s", retName(code))
		}
	}
	t.Logf("%d valid fixtures, %d malformed fixtures", len(validFixtures), len(malformedFixtures()))
}

func (m malformedFx) String() string { return fmt.Sprintf("%s (%d bytes)", m.name, len(m.frame)) }
