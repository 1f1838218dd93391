package parsetest

import "encoding/binary"

// refParse is an independent Go implementation of the policy documented at the top of
// bpf/include/parse.h, including what a failed parse leaves in struct pkt. FuzzParse checks
// the BPF parser against it field for field; the fixtures check it against hand-written
// expectations. It works on a byte slice with explicit length checks, not by translating the
// C code line by line.
func refParse(f []byte) parse {
	var p parse
	p.Ret = refParsePkt(f, &p)
	p.TSRet = tsNotFound
	if p.Ret == parseOK && p.L4Proto == protoTCP {
		p.TSRet, p.TSval, p.TSecr = refTimestamp(f[p.L4Off:])
	}
	return p
}

// IP protocol numbers the parser knows.
const (
	protoHopByHop = 0
	protoICMP     = 1
	protoTCP      = 6
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoAH       = 51
	protoICMPv6   = 58
	protoDestOpts = 60
	vlanMaxDepth  = 2  // VLAN_MAX_DEPTH
	ipv6ExtMax    = 6  // IPV6_EXT_MAX
	tcpMaxOpts    = 10 // TCP_MAX_OPTS
)

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }

func refParsePkt(f []byte, p *parse) int32 {
	// Ethernet and at most vlanMaxDepth tags.
	if len(f) < 14 {
		return errETH
	}
	off, etype := 14, be16(f[12:])
	isVLAN := func(t uint16) bool { return t == 0x8100 || t == 0x88A8 }
	for tags := 0; isVLAN(etype); tags++ {
		if tags == vlanMaxDepth {
			return errVLANDepth // a third tag is refused whether or not it is complete
		}
		if len(f) < off+4 {
			return errVLAN
		}
		p.Flags |= flagVLAN
		etype = be16(f[off+2:])
		off += 4
	}
	p.L3Off = uint16(off)

	var l4proto uint8
	var l4off int
	var laterFrag bool
	switch etype {
	case ethPIP:
		p.L3Proto = ethPIP
		ip := f[off:]
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return errIP
		}
		hlen := int(ip[0]&0x0F) * 4
		if hlen < 20 || hlen > len(ip) {
			return errIPIHL
		}
		totLen := int(be16(ip[2:]))
		if totLen < hlen {
			return errIPLen
		}
		if hlen > 20 {
			p.Flags |= flagIPOpts
		}
		fragField := be16(ip[6:])
		if fragField&0x3FFF != 0 { // MF or an offset; DF is not a fragment
			p.Flags |= flagFrag
		}
		laterFrag = fragField&0x1FFF != 0
		p.Saddr = v4mapped(ip[12:16])
		p.Daddr = v4mapped(ip[16:20])
		p.TTL, p.TOS = ip[8], ip[1]
		p.PayloadLen = uint16(totLen - hlen)
		l4proto, l4off = ip[9], off+hlen
	case ethPIPv6:
		p.L3Proto = ethPIPv6
		ip := f[off:]
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return errIP6
		}
		next, pos := ip[6], off+40
		exts := 0
	walk:
		for {
			var size int
			switch next {
			case protoHopByHop, protoRouting, protoDestOpts, protoAH, protoFragment:
			default:
				break walk
			}
			if exts == ipv6ExtMax {
				return errExtDepth
			}
			exts++
			if len(f) < pos+2 {
				return errExt
			}
			switch next {
			case protoFragment:
				if len(f) < pos+8 {
					return errExt
				}
				p.Flags |= flagIP6Ext
				fo := be16(f[pos+2:])
				if fo&0xFFF9 != 0 { // an offset or M: a real (not atomic) fragment
					p.Flags |= flagFrag
				}
				next, pos = f[pos], pos+8
				if fo&0xFFF8 != 0 {
					// What follows the fragment header of a later fragment is data.
					laterFrag = true
					break walk
				}
				continue
			case protoAH:
				size = (int(f[pos+1]) + 2) * 4
			default:
				size = (int(f[pos+1]) + 1) * 8
			}
			p.Flags |= flagIP6Ext
			next, pos = f[pos], pos+size
			if pos > len(f) {
				return errExt
			}
		}
		extLen, payloadLen := pos-off-40, int(be16(ip[4:]))
		if payloadLen < extLen {
			return errIPLen
		}
		p.Saddr = [16]byte(ip[8:24])
		p.Daddr = [16]byte(ip[24:40])
		p.TTL = ip[7]
		p.TOS = ip[0]<<4 | ip[1]>>4
		p.PayloadLen = uint16(payloadLen - extLen)
		l4proto, l4off = next, pos
	default:
		return errL3Proto
	}

	p.L4Proto, p.L4Off, p.PayloadOff = l4proto, uint16(l4off), uint16(l4off)
	if laterFrag {
		return errFragment
	}
	l4 := f[l4off:]
	ipPayload := int(p.PayloadLen)
	var hdrLen int
	switch l4proto {
	case protoUDP:
		if len(l4) < 8 || be16(l4[4:]) < 8 {
			return errUDP
		}
		if ipPayload < 8 {
			return errIPLen
		}
		udpLen := int(be16(l4[4:]))
		if udpLen > ipPayload && p.Flags&flagFrag == 0 {
			return errUDP
		}
		hdrLen, p.PayloadLen = 8, uint16(udpLen-8)
	case protoTCP:
		if len(l4) < 20 {
			return errTCP
		}
		hdrLen = int(l4[12]>>4) * 4
		if hdrLen < 20 || hdrLen > len(l4) {
			return errTCPDoff
		}
		if ipPayload < hdrLen {
			return errIPLen
		}
		p.PayloadLen = uint16(ipPayload - hdrLen)
	case protoICMP, protoICMPv6:
		if len(l4) < 8 {
			return errICMP
		}
		if ipPayload < 8 {
			return errIPLen
		}
		hdrLen, p.PayloadLen = 8, uint16(ipPayload-8)
		if !isEcho(l4proto, l4[0]) {
			return p.done(l4off + hdrLen) // no id/sequence to report
		}
	default:
		return parseOK // no L4 header: payload_off stays at l4_off
	}
	p.Sport, p.Dport = be16(l4[0:]), be16(l4[2:])
	if l4proto == protoICMP || l4proto == protoICMPv6 {
		p.Sport, p.Dport = be16(l4[4:]), be16(l4[6:]) // echo id and sequence
	}
	return p.done(l4off + hdrLen)
}

func (p *parse) done(payloadOff int) int32 {
	p.PayloadOff = uint16(payloadOff)
	return parseOK
}

func isEcho(proto, typ uint8) bool {
	if proto == protoICMP {
		return typ == 0 || typ == 8
	}
	return typ == 128 || typ == 129
}

func v4mapped(a []byte) [16]byte {
	var m [16]byte
	m[10], m[11] = 0xFF, 0xFF
	copy(m[12:], a)
	return m
}

// refTimestamp looks for the TCP timestamp option among the first tcpMaxOpts options of the
// (already validated) TCP header at the start of seg.
func refTimestamp(seg []byte) (ret int32, tsval, tsecr uint32) {
	opts := seg[20 : int(seg[12]>>4)*4]
	for range tcpMaxOpts {
		if len(opts) == 0 {
			return tsNotFound, 0, 0
		}
		switch kind := opts[0]; {
		case kind == 0: // end of options
			return tsNotFound, 0, 0
		case kind == 1: // NOP
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || opts[1] < 2 {
			return tsNotFound, 0, 0
		}
		if opts[0] == 8 && opts[1] == 10 {
			if len(opts) < 10 {
				return tsNotFound, 0, 0
			}
			return 0, binary.BigEndian.Uint32(opts[2:]), binary.BigEndian.Uint32(opts[6:])
		}
		if int(opts[1]) >= len(opts) {
			return tsNotFound, 0, 0 // the next option would start past the header
		}
		opts = opts[opts[1]:]
	}
	return tsNotFound, 0, 0
}
