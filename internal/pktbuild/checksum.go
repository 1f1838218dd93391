package pktbuild

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors wrapped by VerifyChecksums.
var (
	// ErrChecksum: a checksum field does not match the bytes it covers.
	ErrChecksum = errors.New("bad checksum")
	// ErrMalformed: the frame is too short or inconsistent to locate a checksummed field.
	ErrMalformed = errors.New("malformed frame")
)

// sum is the 16-bit big-endian word sum of b (an odd last byte is padded with zero), not yet
// folded. Callers add the sums of even-length parts before the last one.
func sum(b []byte) uint64 {
	var s uint64
	for len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	return s
}

// fold turns a word sum into the Internet checksum (RFC 1071): the one's complement of the
// one's complement sum.
func fold(s uint64) uint16 {
	for s > 0xFFFF {
		s = s&0xFFFF + s>>16
	}
	return ^uint16(s)
}

// VerifyChecksums checks every checksum it can locate in an Ethernet frame: the IPv4 header
// checksum and the UDP, TCP, ICMP or ICMPv6 checksum (with the IPv4 or IPv6 pseudo header).
// It walks any number of VLAN tags and the IPv6 hop-by-hop, routing, destination options,
// fragment and AH headers. A UDP checksum of 0 is accepted over IPv4 ("no checksum") and
// rejected over IPv6.
//
// Nothing is checked past the IP header of a fragment (the L4 checksum covers the whole
// datagram) or for other protocols and ethertypes; bytes after the IP length (Ethernet
// padding) are ignored. It returns an error wrapping ErrChecksum for a wrong checksum and
// ErrMalformed when a checksummed header cannot be located (truncated frame, IPv4 ihl < 5,
// IP length beyond the frame, a routing header with segments left).
func VerifyChecksums(frame []byte) error {
	if len(frame) < etherHdrLen {
		return malformed("ethernet header", "%d-byte frame", len(frame))
	}
	off := etherHdrLen
	etherType := binary.BigEndian.Uint16(frame[12:])
	for etherType == TPID8021Q || etherType == TPID8021AD {
		if len(frame) < off+vlanTagLen {
			return malformed("vlan tag", "frame ends at %d", len(frame))
		}
		etherType = binary.BigEndian.Uint16(frame[off+2:])
		off += vlanTagLen
	}
	switch etherType {
	case EtherTypeIPv4:
		return verifyIPv4(frame[off:])
	case EtherTypeIPv6:
		return verifyIPv6(frame[off:])
	}
	return nil
}

func verifyIPv4(pkt []byte) error {
	if len(pkt) < ipv4HdrLen {
		return malformed("ipv4 header", "%d bytes left", len(pkt))
	}
	hlen := int(pkt[0]&0xF) * 4
	totLen := int(binary.BigEndian.Uint16(pkt[2:]))
	switch {
	case pkt[0]>>4 != 4:
		return malformed("ipv4 header", "version %d", pkt[0]>>4)
	case hlen < ipv4HdrLen || hlen > len(pkt):
		return malformed("ipv4 header", "ihl %d with %d bytes left", hlen/4, len(pkt))
	case totLen < hlen || totLen > len(pkt):
		return malformed("ipv4 header", "total length %d, header %d, %d bytes left", totLen, hlen, len(pkt))
	}
	if err := check("ipv4 header", pkt[:hlen], 10, 0); err != nil {
		return err
	}
	if binary.BigEndian.Uint16(pkt[6:])&(ipv4FlagMF|ipv4OffsetMask) != 0 {
		return nil // fragment
	}
	src, dst := pkt[12:16], pkt[16:20]
	return verifyL4(pkt[9], pkt[hlen:totLen], false, func(length int) uint64 {
		return sum(src) + sum(dst) + uint64(pkt[9]) + uint64(length)
	})
}

func verifyIPv6(pkt []byte) error {
	if len(pkt) < ipv6HdrLen {
		return malformed("ipv6 header", "%d bytes left", len(pkt))
	}
	if pkt[0]>>4 != 6 {
		return malformed("ipv6 header", "version %d", pkt[0]>>4)
	}
	end := ipv6HdrLen + int(binary.BigEndian.Uint16(pkt[4:]))
	if end > len(pkt) {
		return malformed("ipv6 header", "payload length %d, %d bytes left", end-ipv6HdrLen, len(pkt)-ipv6HdrLen)
	}
	next, off := pkt[6], ipv6HdrLen
	for {
		var n int
		switch next {
		case ProtoHopByHop, ProtoRouting, ProtoDestOpts, ProtoAH, ProtoFragment:
		default:
			src, dst := pkt[8:24], pkt[24:40]
			return verifyL4(next, pkt[off:end], true, func(length int) uint64 {
				return sum(src) + sum(dst) + uint64(length) + uint64(next)
			})
		}
		if off+8 > end {
			return malformed("ipv6 extension header", "header %d at %d past payload end %d", next, off, end)
		}
		switch next {
		case ProtoAH:
			n = (int(pkt[off+1]) + 2) * 4
		case ProtoFragment:
			if binary.BigEndian.Uint16(pkt[off+2:])&0xFFF9 != 0 {
				return nil // a fragment (not an atomic one): the L4 checksum spans the datagram
			}
			n = 8
		case ProtoRouting:
			if pkt[off+3] != 0 {
				return malformed("ipv6 routing header", "segments left %d: final destination unknown", pkt[off+3])
			}
			fallthrough
		default:
			n = (int(pkt[off+1]) + 1) * 8
		}
		if off+n > end {
			return malformed("ipv6 extension header", "header %d of %d bytes at %d past payload end %d", next, n, off, end)
		}
		next, off = pkt[off], off+n
	}
}

// verifyL4 checks the checksum of the L4 message seg (exactly the IP payload) of protocol
// proto; pseudo gives the pseudo-header sum for an L4 length.
func verifyL4(proto uint8, seg []byte, v6 bool, pseudo func(length int) uint64) error {
	switch proto {
	case ProtoUDP:
		if len(seg) < udpHdrLen {
			return malformed("udp header", "%d bytes of IP payload", len(seg))
		}
		ulen := int(binary.BigEndian.Uint16(seg[4:]))
		if ulen < udpHdrLen || ulen > len(seg) {
			return malformed("udp header", "length %d with %d bytes of IP payload", ulen, len(seg))
		}
		if binary.BigEndian.Uint16(seg[6:]) == 0 {
			if !v6 {
				return nil // IPv4 "no checksum"
			}
			return fmt.Errorf("verify udp checksum: zero checksum over IPv6: %w", ErrChecksum)
		}
		return check("udp", seg[:ulen], 6, pseudo(ulen))
	case ProtoTCP:
		if len(seg) < tcpHdrLen {
			return malformed("tcp header", "%d bytes of IP payload", len(seg))
		}
		return check("tcp", seg, 16, pseudo(len(seg)))
	case ProtoICMP:
		if len(seg) < 4 {
			return malformed("icmp header", "%d bytes of IP payload", len(seg))
		}
		return check("icmp", seg, 2, 0)
	case ProtoICMPv6:
		if len(seg) < 4 {
			return malformed("icmpv6 header", "%d bytes of IP payload", len(seg))
		}
		return check("icmpv6", seg, 2, pseudo(len(seg)))
	}
	return nil
}

// check verifies the checksum at b[at:at+2] over b plus a pseudo-header sum the way a
// receiver does: the one's complement sum of everything, checksum included, must be all ones.
// So 0x0000 and 0xffff are both accepted where either is the right value, as an incremental
// update (RFC 1624) may produce the other one.
func check(layer string, b []byte, at int, pseudo uint64) error {
	if fold(pseudo+sum(b)) == 0 {
		return nil
	}
	got := binary.BigEndian.Uint16(b[at:])
	want := fold(pseudo + sum(b) - uint64(got))
	return fmt.Errorf("verify %s checksum: got %#04x, want %#04x: %w", layer, got, want, ErrChecksum)
}

func malformed(what, format string, args ...any) error {
	return fmt.Errorf("locate %s: %s: %w", what, fmt.Sprintf(format, args...), ErrMalformed)
}
