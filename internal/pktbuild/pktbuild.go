// Package pktbuild builds Ethernet frames for tests: Ethernet with up to any number of
// 802.1Q/802.1ad tags, IPv4 (options, fragments) or IPv6 (extension headers), and UDP, TCP,
// ICMP or ICMPv6, with correct IPv4 header checksums and correct L4 checksums (pseudo
// header included) unless a field is overridden to make a malformed packet on purpose.
//
// A Builder is a value: every method returns a modified copy, so a base can be shared by
// fixtures without aliasing.
//
//	frame := pktbuild.New().
//		VLAN(pktbuild.VLAN{VID: 100}).
//		IPv4(pktbuild.IPv4{Src: netip.MustParseAddr("10.0.0.1"), Options: []byte{148, 4, 0, 0}}).
//		TCP(pktbuild.TCP{Src: 1000, Dst: 80, Flags: pktbuild.SYN,
//			Options: slices.Concat(pktbuild.OptMSS(1460), pktbuild.OptTimestamp(1, 0))}).
//		Payload([]byte("hello")).
//		Build()
//
// Zero values mean "the usual": default MAC and IP addresses (documentation ranges), TTL and
// hop limit 64, lengths, header lengths, protocol numbers and checksums computed. Fields of
// type *int are overrides for malformed packets (write new(3) for a literal): nil computes
// the field, anything else is written as is. Build panics on a value that does not fit its
// field or on an impossible layering (UDP without IP): both are bugs in the test.
//
// VerifyChecksums checks the checksums of a frame, for instance one rewritten by a BPF
// program; Truncate cuts a frame without fixing its length fields.
package pktbuild

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// MAC is an Ethernet address.
type MAC [6]byte

// Default addresses, used where a layer leaves its address fields zero.
var (
	DefaultSrcMAC = MAC{0x02, 0, 0, 0, 0, 0x01} // locally administered
	DefaultDstMAC = MAC{0x02, 0, 0, 0, 0, 0x02}
	DefaultSrc4   = netip.MustParseAddr("192.0.2.1")    // TEST-NET-1 (RFC 5737)
	DefaultDst4   = netip.MustParseAddr("198.51.100.1") // TEST-NET-2
	DefaultSrc6   = netip.MustParseAddr("2001:db8::1")  // documentation (RFC 3849)
	DefaultDst6   = netip.MustParseAddr("2001:db8::2")
)

// DefaultTTL is the IPv4 TTL and IPv6 hop limit used when the layer leaves it zero.
const DefaultTTL = 64

// EtherTypes and VLAN tag protocol identifiers.
const (
	EtherTypeIPv4  = 0x0800
	EtherTypeIPv6  = 0x86DD
	TPID8021Q      = 0x8100
	TPID8021AD     = 0x88A8
	etherHdrLen    = 14
	vlanTagLen     = 4
	ipv4HdrLen     = 20
	ipv6HdrLen     = 40
	udpHdrLen      = 8
	tcpHdrLen      = 20
	icmpHdrLen     = 8
	ipv4MaxHdrLen  = 60
	tcpMaxHdrLen   = 60
	ipv4FlagDF     = 0x4000
	ipv4FlagMF     = 0x2000
	ipv4OffsetMask = 0x1FFF
)

// IP protocol numbers (IPv4 protocol, IPv6 next header).
const (
	ProtoHopByHop = 0
	ProtoICMP     = 1
	ProtoTCP      = 6
	ProtoUDP      = 17
	ProtoRouting  = 43
	ProtoFragment = 44
	ProtoESP      = 50
	ProtoAH       = 51
	ProtoICMPv6   = 58
	ProtoNoNext   = 59
	ProtoDestOpts = 60
)

// TCP flags.
const (
	FIN = 1 << iota
	SYN
	RST
	PSH
	ACK
	URG
	ECE
	CWR
)

// ICMP and ICMPv6 echo types.
const (
	ICMPEchoReply     = 0
	ICMPEchoRequest   = 8
	ICMPv6EchoRequest = 128
	ICMPv6EchoReply   = 129
)

// Ether is the Ethernet header.
type Ether struct {
	Src, Dst MAC    // zero: DefaultSrcMAC, DefaultDstMAC
	Type     uint16 // zero: from the next layer (VLAN TPID or IP version); needed without an IP layer
}

// VLAN is one 802.1Q/802.1ad tag. Tags are written outermost first, in call order.
type VLAN struct {
	TPID uint16 // zero: TPID8021Q
	PCP  uint8  // priority, 0-7
	DEI  bool
	VID  uint16 // 0-4095
}

// IPv4 is the IPv4 header.
type IPv4 struct {
	Src, Dst   netip.Addr // zero: DefaultSrc4, DefaultDst4
	TOS        uint8
	TTL        uint8 // zero: DefaultTTL
	ID         uint16
	DF, MF     bool
	FragOffset uint16 // in 8-byte units, 0-8191
	Options    []byte // raw option bytes, padded with zeros (end of options) to a multiple of 4

	Version  *int // override: default 4
	IHL      *int // override: default (20 + len(padded Options)) / 4
	TotLen   *int // override: default header + L4 header + payload (trailer excluded)
	Protocol *int // override: default from the L4 layer
	Checksum *int // override: default the correct header checksum
}

// IPv6 is the IPv6 header and its extension header chain.
type IPv6 struct {
	Src, Dst     netip.Addr // zero: DefaultSrc6, DefaultDst6
	TrafficClass uint8
	FlowLabel    uint32 // 20 bits
	HopLimit     uint8  // zero: DefaultTTL
	Ext          []Ext  // extension headers in order; next-header fields are chained

	Version    *int // override: default 6
	PayloadLen *int // override: default extension headers + L4 header + payload
	NextHeader *int // override of the fixed header's next header: default the first Ext or L4
}

// Ext is one IPv6 extension header: a next-header byte, a length byte (reserved for the
// fragment header) and Body. The builder fills the first two; use the constructors.
type Ext struct {
	Proto  uint8  // ProtoHopByHop, ProtoRouting, ProtoFragment, ProtoAH or ProtoDestOpts
	Body   []byte // everything after the first two bytes
	HdrLen *int   // override of the length byte: default from len(Body)
}

// Len is the size of the extension header on the wire.
func (e Ext) Len() int { return 2 + len(e.Body) }

// UDP is the UDP header.
type UDP struct {
	Src, Dst uint16
	Length   *int // override: default 8 + payload
	Checksum *int // override: default correct; new(0) is "no checksum" (valid over IPv4 only)
}

// TCP is the TCP header.
type TCP struct {
	Src, Dst   uint16
	Seq, Ack   uint32
	Flags      uint8 // FIN, SYN, RST, PSH, ACK, URG, ECE, CWR
	Window     uint16
	Urgent     uint16
	Options    []byte // raw option bytes (see Opt*), padded with zeros to a multiple of 4
	DataOffset *int   // override: default (20 + len(padded Options)) / 4
	Checksum   *int   // override: default correct
}

// ICMP is an ICMP or ICMPv6 header in the echo layout: type, code, checksum, id, sequence.
type ICMP struct {
	Type, Code uint8 // ICMPEchoRequest, ICMPv6EchoReply, ...
	ID, Seq    uint16
	Checksum   *int // override: default correct
}

// Builder accumulates the layers of one frame. The zero value (also returned by New) is a
// frame with the default Ethernet header and nothing else.
type Builder struct {
	eth     Ether
	vlans   []VLAN
	ip4     *IPv4
	ip6     *IPv6
	hasL4   bool // an L4 layer or Proto was set
	l4proto uint8
	udp     *UDP
	tcp     *TCP
	icmp    *ICMP
	payload []byte
	trailer []byte
}

// New returns a builder for a frame with the default Ethernet header.
func New() Builder { return Builder{} }

// Ether sets the Ethernet header.
func (b Builder) Ether(e Ether) Builder { b.eth = e; return b }

// VLAN adds a VLAN tag inside the ones already added.
func (b Builder) VLAN(v VLAN) Builder {
	b.vlans = append(slices.Clip(b.vlans), v)
	return b
}

// IPv4 sets an IPv4 layer (replacing any IP layer).
func (b Builder) IPv4(h IPv4) Builder {
	h.Options = slices.Clone(h.Options)
	b.ip4, b.ip6 = &h, nil
	return b
}

// IPv6 sets an IPv6 layer (replacing any IP layer).
func (b Builder) IPv6(h IPv6) Builder {
	h.Ext = slices.Clone(h.Ext)
	for i := range h.Ext {
		h.Ext[i].Body = slices.Clone(h.Ext[i].Body)
	}
	b.ip6, b.ip4 = &h, nil
	return b
}

// UDP sets a UDP layer (replacing any L4 layer).
func (b Builder) UDP(h UDP) Builder {
	b = b.clearL4(ProtoUDP)
	b.udp = &h
	return b
}

// TCP sets a TCP layer (replacing any L4 layer).
func (b Builder) TCP(h TCP) Builder {
	h.Options = slices.Clone(h.Options)
	b = b.clearL4(ProtoTCP)
	b.tcp = &h
	return b
}

// ICMP sets an ICMP (IP protocol 1) layer (replacing any L4 layer).
func (b Builder) ICMP(h ICMP) Builder {
	b = b.clearL4(ProtoICMP)
	b.icmp = &h
	return b
}

// ICMPv6 sets an ICMPv6 (next header 58) layer (replacing any L4 layer). Its checksum covers
// the pseudo header of the IP layer.
func (b Builder) ICMPv6(h ICMP) Builder {
	b = b.clearL4(ProtoICMPv6)
	b.icmp = &h
	return b
}

// Proto sets the IP protocol (next header) to proto with no L4 header: the payload follows
// the IP layer directly. For ESP, "no next header" or unknown protocols.
func (b Builder) Proto(proto uint8) Builder { return b.clearL4(proto) }

// Payload sets the bytes after the innermost header; they count in every length field.
func (b Builder) Payload(p []byte) Builder { b.payload = slices.Clone(p); return b }

// Trailer sets bytes appended after the IP packet (Ethernet padding, junk) that no length
// field counts.
func (b Builder) Trailer(p []byte) Builder { b.trailer = slices.Clone(p); return b }

func (b Builder) clearL4(proto uint8) Builder {
	b.hasL4, b.l4proto, b.udp, b.tcp, b.icmp = true, proto, nil, nil, nil
	return b
}

// Build assembles the frame. It panics on values that do not fit their fields.
func (b Builder) Build() []byte {
	l4 := b.buildL4()
	var l3 []byte
	var etherType uint16
	switch {
	case b.ip4 != nil:
		l3 = b.buildIPv4(l4)
		etherType = EtherTypeIPv4
	case b.ip6 != nil:
		l3 = b.buildIPv6(l4)
		etherType = EtherTypeIPv6
	default:
		if b.hasL4 {
			panic("pktbuild: an L4 layer needs an IPv4 or IPv6 layer")
		}
		l3 = slices.Clone(b.payload)
	}

	frame := make([]byte, 0, etherHdrLen+vlanTagLen*len(b.vlans)+len(l3)+len(b.trailer))
	dst, src := orMAC(b.eth.Dst, DefaultDstMAC), orMAC(b.eth.Src, DefaultSrcMAC)
	frame = append(frame, dst[:]...)
	frame = append(frame, src[:]...)
	// Each type field names what follows it: the next tag's TPID or the L3 ethertype.
	types := make([]uint16, 0, len(b.vlans)+1)
	for _, v := range b.vlans {
		types = append(types, cmp16(v.TPID, TPID8021Q))
	}
	types = append(types, etherType)
	if b.eth.Type != 0 {
		types[0] = b.eth.Type
	}
	frame = binary.BigEndian.AppendUint16(frame, types[0])
	for i, v := range b.vlans {
		if v.PCP > 7 || v.VID > 0xFFF {
			panic(fmt.Sprintf("pktbuild: VLAN PCP %d or VID %d out of range", v.PCP, v.VID))
		}
		tci := uint16(v.PCP)<<13 | v.VID
		if v.DEI {
			tci |= 1 << 12
		}
		frame = binary.BigEndian.AppendUint16(frame, tci)
		frame = binary.BigEndian.AppendUint16(frame, types[i+1])
	}
	frame = append(frame, l3...)
	return append(frame, b.trailer...)
}

// protocol is the IP protocol number of the L4 layer; ProtoNoNext when there is none.
func (b Builder) protocol() uint8 {
	if !b.hasL4 {
		return ProtoNoNext
	}
	return b.l4proto
}

// buildL4 returns the L4 header and payload with a zero checksum field; the IP layer fills it.
func (b Builder) buildL4() []byte {
	switch {
	case b.udp != nil:
		h := make([]byte, udpHdrLen, udpHdrLen+len(b.payload))
		binary.BigEndian.PutUint16(h[0:], b.udp.Src)
		binary.BigEndian.PutUint16(h[2:], b.udp.Dst)
		put16(h[4:], override(b.udp.Length, udpHdrLen+len(b.payload)), "UDP length")
		return append(h, b.payload...)
	case b.tcp != nil:
		opts := pad4(b.tcp.Options)
		hlen := tcpHdrLen + len(opts)
		if hlen > tcpMaxHdrLen {
			panic(fmt.Sprintf("pktbuild: %d bytes of TCP options exceed 40", len(opts)))
		}
		h := make([]byte, tcpHdrLen, hlen+len(b.payload))
		binary.BigEndian.PutUint16(h[0:], b.tcp.Src)
		binary.BigEndian.PutUint16(h[2:], b.tcp.Dst)
		binary.BigEndian.PutUint32(h[4:], b.tcp.Seq)
		binary.BigEndian.PutUint32(h[8:], b.tcp.Ack)
		h[12] = put4(override(b.tcp.DataOffset, hlen/4), "TCP data offset") << 4
		h[13] = b.tcp.Flags
		binary.BigEndian.PutUint16(h[14:], b.tcp.Window)
		binary.BigEndian.PutUint16(h[18:], b.tcp.Urgent)
		h = append(h, opts...)
		return append(h, b.payload...)
	case b.icmp != nil:
		h := make([]byte, icmpHdrLen, icmpHdrLen+len(b.payload))
		h[0], h[1] = b.icmp.Type, b.icmp.Code
		binary.BigEndian.PutUint16(h[4:], b.icmp.ID)
		binary.BigEndian.PutUint16(h[6:], b.icmp.Seq)
		return append(h, b.payload...)
	}
	return slices.Clone(b.payload)
}

// fillL4Checksum writes the L4 checksum into l4 given the pseudo-header sum of the IP layer
// (computed with the L4 length it should carry).
func (b Builder) fillL4Checksum(l4 []byte, pseudo func(length int) uint64) {
	switch {
	case b.udp != nil:
		c := fold(pseudo(int(binary.BigEndian.Uint16(l4[4:]))) + sum(l4))
		if c == 0 {
			c = 0xFFFF // RFC 768: a computed zero is sent as all ones
		}
		put16(l4[6:], override(b.udp.Checksum, int(c)), "UDP checksum")
	case b.tcp != nil:
		c := fold(pseudo(len(l4)) + sum(l4))
		put16(l4[16:], override(b.tcp.Checksum, int(c)), "TCP checksum")
	case b.icmp != nil:
		s := sum(l4)
		if b.l4proto == ProtoICMPv6 {
			s += pseudo(len(l4))
		}
		put16(l4[2:], override(b.icmp.Checksum, int(fold(s))), "ICMP checksum")
	}
}

func (b Builder) buildIPv4(l4 []byte) []byte {
	h := b.ip4
	opts := pad4(h.Options)
	hlen := ipv4HdrLen + len(opts)
	if hlen > ipv4MaxHdrLen {
		panic(fmt.Sprintf("pktbuild: %d bytes of IPv4 options exceed 40", len(opts)))
	}
	if h.FragOffset > ipv4OffsetMask {
		panic(fmt.Sprintf("pktbuild: IPv4 fragment offset %d exceeds 8191", h.FragOffset))
	}
	src, dst := orAddr(h.Src, DefaultSrc4), orAddr(h.Dst, DefaultDst4)
	if !src.Is4() || !dst.Is4() {
		panic(fmt.Sprintf("pktbuild: IPv4 layer with addresses %s -> %s", src, dst))
	}
	proto := put8(override(h.Protocol, int(b.protocol())), "IPv4 protocol")

	pkt := make([]byte, hlen, hlen+len(l4))
	pkt[0] = put4(override(h.Version, 4), "IPv4 version")<<4 | put4(override(h.IHL, hlen/4), "IPv4 IHL")
	pkt[1] = h.TOS
	put16(pkt[2:], override(h.TotLen, hlen+len(l4)), "IPv4 total length")
	binary.BigEndian.PutUint16(pkt[4:], h.ID)
	frag := h.FragOffset
	if h.DF {
		frag |= ipv4FlagDF
	}
	if h.MF {
		frag |= ipv4FlagMF
	}
	binary.BigEndian.PutUint16(pkt[6:], frag)
	pkt[8] = cmp8(h.TTL, DefaultTTL)
	pkt[9] = proto
	s4, d4 := src.As4(), dst.As4()
	copy(pkt[12:], s4[:])
	copy(pkt[16:], d4[:])
	copy(pkt[ipv4HdrLen:], opts)
	put16(pkt[10:], override(h.Checksum, int(fold(sum(pkt)))), "IPv4 checksum")

	b.fillL4Checksum(l4, func(length int) uint64 {
		return sum(s4[:]) + sum(d4[:]) + uint64(b.protocol()) + uint64(length)
	})
	return append(pkt, l4...)
}

func (b Builder) buildIPv6(l4 []byte) []byte {
	h := b.ip6
	src, dst := orAddr(h.Src, DefaultSrc6), orAddr(h.Dst, DefaultDst6)
	if !src.Is6() || !dst.Is6() {
		panic(fmt.Sprintf("pktbuild: IPv6 layer with addresses %s -> %s", src, dst))
	}
	if h.FlowLabel > 0xFFFFF {
		panic(fmt.Sprintf("pktbuild: IPv6 flow label %#x exceeds 20 bits", h.FlowLabel))
	}
	var ext []byte
	for i, e := range h.Ext {
		next := b.protocol()
		if i+1 < len(h.Ext) {
			next = h.Ext[i+1].Proto
		}
		ext = append(ext, e.bytes(next)...)
	}
	first := b.protocol()
	if len(h.Ext) > 0 {
		first = h.Ext[0].Proto
	}

	pkt := make([]byte, ipv6HdrLen, ipv6HdrLen+len(ext)+len(l4))
	ver := uint32(put4(override(h.Version, 6), "IPv6 version"))
	binary.BigEndian.PutUint32(pkt[0:], ver<<28|uint32(h.TrafficClass)<<20|h.FlowLabel)
	put16(pkt[4:], override(h.PayloadLen, len(ext)+len(l4)), "IPv6 payload length")
	pkt[6] = put8(override(h.NextHeader, int(first)), "IPv6 next header")
	pkt[7] = cmp8(h.HopLimit, DefaultTTL)
	s16, d16 := src.As16(), dst.As16()
	copy(pkt[8:], s16[:])
	copy(pkt[24:], d16[:])

	b.fillL4Checksum(l4, func(length int) uint64 {
		return sum(s16[:]) + sum(d16[:]) + uint64(length) + uint64(b.protocol())
	})
	pkt = append(pkt, ext...)
	return append(pkt, l4...)
}

// bytes serialises the extension header with next as its next-header field.
func (e Ext) bytes(next uint8) []byte {
	n := e.Len()
	var hdrLen int
	switch e.Proto {
	case ProtoHopByHop, ProtoRouting, ProtoDestOpts:
		if n%8 != 0 {
			panic(fmt.Sprintf("pktbuild: extension header %d of %d bytes is not a multiple of 8", e.Proto, n))
		}
		hdrLen = n/8 - 1
	case ProtoAH:
		if n%4 != 0 || n < 12 {
			panic(fmt.Sprintf("pktbuild: AH of %d bytes is not a multiple of 4 >= 12", n))
		}
		hdrLen = n/4 - 2
	case ProtoFragment:
		if n != 8 {
			panic(fmt.Sprintf("pktbuild: fragment header of %d bytes, want 8", n))
		}
		hdrLen = 0 // reserved
	default:
		panic(fmt.Sprintf("pktbuild: unknown extension header %d", e.Proto))
	}
	out := []byte{next, put8(override(e.HdrLen, hdrLen), "extension header length")}
	return append(out, e.Body...)
}

// HopByHop returns a hop-by-hop options header of 8*units bytes filled with PadN.
func HopByHop(units int) Ext { return Ext{Proto: ProtoHopByHop, Body: padN(units)} }

// DestOpts returns a destination options header of 8*units bytes filled with PadN.
func DestOpts(units int) Ext { return Ext{Proto: ProtoDestOpts, Body: padN(units)} }

// Routing returns a routing header of 8*units bytes with routing type 253 (experimental,
// RFC 4727) and segments left 0, so the destination address is the final one.
func Routing(units int) Ext {
	if units < 1 {
		panic("pktbuild: routing header needs at least one 8-byte unit")
	}
	body := make([]byte, 8*units-2)
	body[0] = 253 // routing type; body[1] = segments left = 0
	return Ext{Proto: ProtoRouting, Body: body}
}

// Fragment returns a fragment header: offset in 8-byte units (0-8191), the M flag, and the
// identification.
func Fragment(offset uint16, more bool, id uint32) Ext {
	if offset > ipv4OffsetMask {
		panic(fmt.Sprintf("pktbuild: fragment offset %d exceeds 8191", offset))
	}
	fo := offset << 3
	if more {
		fo |= 1
	}
	body := binary.BigEndian.AppendUint16(nil, fo)
	return Ext{Proto: ProtoFragment, Body: binary.BigEndian.AppendUint32(body, id)}
}

// AH returns an authentication header with the given SPI, sequence number and ICV; its
// length (12 + len(icv)) must be a multiple of 4 (RFC 4302 asks 8 for IPv6).
func AH(spi, seq uint32, icv []byte) Ext {
	body := make([]byte, 2, 10+len(icv)) // reserved
	body = binary.BigEndian.AppendUint32(body, spi)
	body = binary.BigEndian.AppendUint32(body, seq)
	return Ext{Proto: ProtoAH, Body: append(body, icv...)}
}

func padN(units int) []byte {
	if units < 1 || units > 256 {
		panic(fmt.Sprintf("pktbuild: options header of %d 8-byte units", units))
	}
	body := make([]byte, 8*units-2)
	body[0], body[1] = 1, byte(len(body)-2) // PadN covering the rest
	return body
}

// TCP options, to be concatenated (slices.Concat) into TCP.Options.

// OptNOP is the no-operation option (kind 1).
func OptNOP() []byte { return []byte{1} }

// OptEOL is the end-of-options option (kind 0).
func OptEOL() []byte { return []byte{0} }

// OptMSS is the maximum segment size option (kind 2).
func OptMSS(mss uint16) []byte { return binary.BigEndian.AppendUint16([]byte{2, 4}, mss) }

// OptWScale is the window scale option (kind 3).
func OptWScale(shift uint8) []byte { return []byte{3, 3, shift} }

// OptSACKPerm is the SACK-permitted option (kind 4).
func OptSACKPerm() []byte { return []byte{4, 2} }

// OptTimestamp is the timestamps option (kind 8, RFC 7323).
func OptTimestamp(tsval, tsecr uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte{8, 10}, tsval), tsecr)
}

// Datagram is a UDP datagram from -> to in an Ethernet frame: IPv4 or IPv6 as the addresses
// are, every other field the usual, checksums correct.
func Datagram(from, to netip.AddrPort, payload []byte) []byte {
	b := New()
	if from.Addr().Is4() {
		b = b.IPv4(IPv4{Src: from.Addr(), Dst: to.Addr()})
	} else {
		b = b.IPv6(IPv6{Src: from.Addr(), Dst: to.Addr()})
	}
	return b.UDP(UDP{Src: from.Port(), Dst: to.Port()}).Payload(payload).Build()
}

// Truncate returns a copy of the first n bytes of frame (all of it if shorter) without
// touching any length field, as a packet cut short on the wire or in a non-linear skb.
func Truncate(frame []byte, n int) []byte {
	return slices.Clone(frame[:min(max(n, 0), len(frame))])
}

func override(v *int, def int) int {
	if v != nil {
		return *v
	}
	return def
}

func put16(b []byte, v int, what string) {
	if v < 0 || v > 0xFFFF {
		panic(fmt.Sprintf("pktbuild: %s %d does not fit 16 bits", what, v))
	}
	binary.BigEndian.PutUint16(b, uint16(v))
}

func put8(v int, what string) uint8 {
	if v < 0 || v > 0xFF {
		panic(fmt.Sprintf("pktbuild: %s %d does not fit 8 bits", what, v))
	}
	return uint8(v)
}

func put4(v int, what string) uint8 {
	if v < 0 || v > 0xF {
		panic(fmt.Sprintf("pktbuild: %s %d does not fit 4 bits", what, v))
	}
	return uint8(v)
}

func pad4(b []byte) []byte {
	return append(slices.Clone(b), make([]byte, (4-len(b)%4)%4)...)
}

func orMAC(m, def MAC) MAC {
	if m == (MAC{}) {
		return def
	}
	return m
}

func orAddr(a, def netip.Addr) netip.Addr {
	if !a.IsValid() {
		return def
	}
	return a
}

func cmp8(v, def uint8) uint8 {
	if v == 0 {
		return def
	}
	return v
}

func cmp16(v, def uint16) uint16 {
	if v == 0 {
		return def
	}
	return v
}
