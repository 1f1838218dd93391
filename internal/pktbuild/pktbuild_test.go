package pktbuild

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// refChecksum is the Internet checksum of the concatenated parts, computed independently of
// sum/fold: one's complement addition of 16-bit words is addition modulo 0xffff, where a
// non-zero total that is a multiple of 0xffff is "negative zero" 0xffff.
func refChecksum(parts ...[]byte) uint16 {
	all := slices.Concat(parts...)
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	total := 0
	for i := 0; i < len(all); i += 2 {
		total += int(all[i])<<8 + int(all[i+1])
	}
	onesSum := 0
	if total != 0 {
		onesSum = (total-1)%0xFFFF + 1
	}
	return 0xFFFF - uint16(onesSum)
}

func pseudo4(src, dst []byte, proto uint8, length int) []byte {
	return slices.Concat(src, dst, []byte{0, proto, byte(length >> 8), byte(length)})
}

func pseudo6(src, dst []byte, next uint8, length int) []byte {
	return slices.Concat(src, dst, []byte{byte(length >> 24), byte(length >> 16), byte(length >> 8), byte(length), 0, 0, 0, next})
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatalf("decode hex: %v", err)
	}
	return b
}

func TestRefChecksumKnownValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want uint16
	}{
		{"RFC 1071 example", "0001 f203 f4f5 f6f7", 0x220d},
		{"wikipedia ipv4 header", "4500 0073 0000 4000 4011 0000 c0a8 0001 c0a8 00c7", 0xb861},
		{"all zero", "0000 0000", 0xFFFF},
		{"negative zero", "ffff 0000", 0x0000},
		{"odd length", "01", 0xFEFF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := unhex(t, tc.in)
			if got := refChecksum(in); got != tc.want {
				t.Errorf("refChecksum = %#04x, want %#04x", got, tc.want)
			}
			if got := fold(sum(in)); got != tc.want {
				t.Errorf("fold(sum) = %#04x, want %#04x", got, tc.want)
			}
		})
	}
}

// TestKnownFrames compares whole frames with bytes written and checksummed by hand.
func TestKnownFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{
			// ip: 4500+001e+4011+c000+0201+c633+6401 = 0x27164 -> 0x7166 -> checksum 0x8e99;
			// udp: pseudo c000+0201+c633+6401+0011+000a = 0x1ec50, header+payload
			// 0001+0002+000a+aabb = 0xaac8; total 0x29718 -> 0x971a -> checksum 0x68e5.
			name:  "ipv4 udp defaults",
			frame: New().IPv4(IPv4{}).UDP(UDP{Src: 1, Dst: 2}).Payload([]byte{0xAA, 0xBB}).Build(),
			want: "020000000002 020000000001 0800" +
				"4500 001e 0000 0000 4011 8e99 c0000201 c6336401" +
				"0001 0002 000a 68e5 aabb",
		},
		{
			// The IPv4 header of Wikipedia's "IPv4 header checksum" example.
			name: "wikipedia ipv4 header",
			frame: New().IPv4(IPv4{
				Src: netip.MustParseAddr("192.168.0.1"), Dst: netip.MustParseAddr("192.168.0.199"), DF: true,
			}).Proto(ProtoUDP).Payload(make([]byte, 0x73-20)).Build()[:14+20],
			want: "020000000002 020000000001 0800 4500 0073 0000 4000 4011 b861 c0a8 0001 c0a8 00c7",
		},
		{
			name: "two vlan tags, unknown ethertype",
			frame: New().Ether(Ether{Src: MAC{1, 2, 3, 4, 5, 6}, Dst: MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, Type: TPID8021AD}).
				VLAN(VLAN{TPID: TPID8021AD, PCP: 5, DEI: true, VID: 0x123}).VLAN(VLAN{VID: 7}).
				Payload([]byte{0xde, 0xad}).Build(),
			want: "ffffffffffff 010203040506 88a8 b123 8100 0007 0000 dead",
		},
		{
			name:  "ipv6 fragment header then icmpv6 echo, checksum by hand",
			frame: New().IPv6(IPv6{HopLimit: 1, Ext: []Ext{Fragment(0, false, 0x01020304)}}).ICMPv6(ICMP{Type: ICMPv6EchoRequest, ID: 0x1234, Seq: 1}).Build(),
			// pseudo: 2001+0db8+0001 + 2001+0db8+0002 + 0008 (ICMPv6 length) + 003a = 0x5bb7;
			// icmp: 8000+1234+0001 = 0x9235; total 0xedec -> checksum 0x1213.
			want: "020000000002 020000000001 86dd 6000 0000 0010 2c01" +
				"20010db8000000000000000000000001 20010db8000000000000000000000002" +
				"3a00 0000 01020304 8000 1213 1234 0001",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if want := unhex(t, tc.want); !bytes.Equal(tc.frame, want) {
				t.Errorf("frame\n got %x\nwant %x", tc.frame, want)
			}
		})
	}
}

// layout describes where the headers of a built frame are, as the test case knows it.
type layout struct {
	l3, l4 int  // offsets
	v6     bool //
	proto  uint8
}

// TestChecksumsIndependent recomputes every checksum of built frames with refChecksum.
func TestChecksumsIndependent(t *testing.T) {
	payload := []byte("hedged request 123")
	odd := []byte("odd")
	for _, tc := range []struct {
		name string
		b    Builder
		lay  layout
	}{
		{"ipv4 udp", New().IPv4(IPv4{}).UDP(UDP{Src: 5000, Dst: 53}).Payload(payload), layout{14, 34, false, ProtoUDP}},
		{"ipv4 udp odd payload", New().IPv4(IPv4{}).UDP(UDP{Src: 5000, Dst: 53}).Payload(odd), layout{14, 34, false, ProtoUDP}},
		{"ipv4 options tcp", New().IPv4(IPv4{Options: []byte{148, 4, 0, 0, 1}, TOS: 0x10}).
			TCP(TCP{Src: 1, Dst: 2, Seq: 7, Ack: 9, Flags: SYN | ACK, Options: OptTimestamp(1, 2)}).Payload(payload),
			layout{14, 14 + 28, false, ProtoTCP}},
		{"ipv4 vlan icmp", New().VLAN(VLAN{VID: 1}).IPv4(IPv4{}).ICMP(ICMP{Type: ICMPEchoRequest, ID: 9, Seq: 3}).Payload(odd),
			layout{18, 38, false, ProtoICMP}},
		{"ipv6 udp", New().IPv6(IPv6{}).UDP(UDP{Src: 5000, Dst: 53}).Payload(payload), layout{14, 54, true, ProtoUDP}},
		{"ipv6 ext tcp", New().IPv6(IPv6{Ext: []Ext{HopByHop(1), Routing(2), DestOpts(1), AH(1, 2, make([]byte, 12))}}).
			TCP(TCP{Src: 1, Dst: 2, Flags: ACK, Options: slices.Concat(OptNOP(), OptNOP(), OptTimestamp(3, 4))}).Payload(odd),
			layout{14, 54 + 8 + 16 + 8 + 24, true, ProtoTCP}},
		{"ipv6 qinq icmpv6", New().VLAN(VLAN{TPID: TPID8021AD}).VLAN(VLAN{}).IPv6(IPv6{}).
			ICMPv6(ICMP{Type: ICMPv6EchoReply, ID: 1, Seq: 2}).Payload(payload), layout{22, 62, true, ProtoICMPv6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.b.Build()
			l3, l4 := f[tc.lay.l3:], f[tc.lay.l4:]
			if !tc.lay.v6 {
				hdr := slices.Clone(f[tc.lay.l3:tc.lay.l4])
				got := binary.BigEndian.Uint16(hdr[10:])
				hdr[10], hdr[11] = 0, 0
				if want := refChecksum(hdr); got != want {
					t.Errorf("ipv4 header checksum %#04x, want %#04x", got, want)
				}
			}
			var ph []byte
			switch {
			case tc.lay.proto == ProtoICMP:
			case tc.lay.v6:
				ph = pseudo6(l3[8:24], l3[24:40], tc.lay.proto, len(l4))
			default:
				ph = pseudo4(l3[12:16], l3[16:20], tc.lay.proto, len(l4))
			}
			at := map[uint8]int{ProtoUDP: 6, ProtoTCP: 16, ProtoICMP: 2, ProtoICMPv6: 2}[tc.lay.proto]
			seg := slices.Clone(l4)
			got := binary.BigEndian.Uint16(seg[at:])
			seg[at], seg[at+1] = 0, 0
			if want := refChecksum(ph, seg); got != want {
				t.Errorf("l4 checksum %#04x, want %#04x", got, want)
			}
			if err := VerifyChecksums(f); err != nil {
				t.Errorf("VerifyChecksums: %v", err)
			}
		})
	}
}

// TestFields checks single fields of built frames, overrides included.
func TestFields(t *testing.T) {
	v4 := New().IPv4(IPv4{})
	v6 := New().IPv6(IPv6{})
	for _, tc := range []struct {
		name string
		b    Builder
		at   int    // offset in the frame
		want string // hex bytes expected at that offset
	}{
		{"ipv4 version/ihl default", v4.UDP(UDP{}), 14, "45"},
		{"ipv4 ihl with options", New().IPv4(IPv4{Options: []byte{1, 1, 1, 1, 7}}).UDP(UDP{}), 14, "47"},
		{"ipv4 options padded with EOL", New().IPv4(IPv4{Options: []byte{7, 3, 4}}).UDP(UDP{}), 34, "07030400"},
		{"ipv4 ihl override", New().IPv4(IPv4{IHL: new(3)}).UDP(UDP{}), 14, "43"},
		{"ipv4 version override", New().IPv4(IPv4{Version: new(6)}).UDP(UDP{}), 14, "65"},
		{"ipv4 tos ttl", New().IPv4(IPv4{TOS: 0xb8, TTL: 3}).UDP(UDP{}), 15, "b8"},
		{"ipv4 ttl", New().IPv4(IPv4{TTL: 3}).UDP(UDP{}), 22, "03"},
		{"ipv4 tot_len", v4.UDP(UDP{}).Payload([]byte{1, 2}).Trailer([]byte{9, 9}), 16, "001e"},
		{"ipv4 tot_len override", New().IPv4(IPv4{TotLen: new(19)}).UDP(UDP{}), 16, "0013"},
		{"ipv4 first fragment", New().IPv4(IPv4{MF: true, ID: 0xabcd}).UDP(UDP{}), 18, "abcd2000"},
		{"ipv4 later fragment", New().IPv4(IPv4{DF: false, FragOffset: 0x1fff}).UDP(UDP{}), 20, "1fff"},
		{"ipv4 df", New().IPv4(IPv4{DF: true}).UDP(UDP{}), 20, "4000"},
		{"ipv4 protocol override", New().IPv4(IPv4{Protocol: new(253)}).UDP(UDP{}), 23, "fd"},
		{"ipv4 raw protocol", v4.Proto(47), 23, "2f"},
		{"ipv4 checksum override", New().IPv4(IPv4{Checksum: new(0xbeef)}).UDP(UDP{}), 24, "beef"},
		{"udp length", v4.UDP(UDP{Src: 7, Dst: 8}).Payload([]byte{1}), 34, "00070008 0009"},
		{"udp length override", v4.UDP(UDP{Length: new(7)}), 38, "0007"},
		{"udp zero checksum", v4.UDP(UDP{Checksum: new(0)}), 40, "0000"},
		{"tcp header", v4.TCP(TCP{Src: 1, Dst: 2, Seq: 3, Ack: 4, Flags: SYN | ACK, Window: 5, Urgent: 6}),
			34, "0001 0002 00000003 00000004 50 12 0005 ????"},
		{"tcp urgent", v4.TCP(TCP{Urgent: 6}), 52, "0006"},
		{"tcp options padded", v4.TCP(TCP{Options: slices.Concat(OptMSS(1460), OptSACKPerm(), OptWScale(7))}),
			46, "80 00 ???? ???? ???? 020405b4 0402 030307 00"},
		{"tcp timestamp option", v4.TCP(TCP{Options: slices.Concat(OptNOP(), OptNOP(), OptTimestamp(0x01020304, 0x0a0b0c0d), OptEOL())}),
			54, "0101 080a 01020304 0a0b0c0d 00000000"},
		{"tcp doff override", v4.TCP(TCP{DataOffset: new(15)}), 46, "f0"},
		{"icmp echo", v4.ICMP(ICMP{Type: ICMPEchoReply, Code: 0, ID: 0x77, Seq: 0x88}), 34, "0000 ???? 0077 0088"},
		{"icmp checksum override", v4.ICMP(ICMP{Checksum: new(1)}), 36, "0001"},
		{"ipv6 header", New().IPv6(IPv6{TrafficClass: 0xab, FlowLabel: 0xcdef1, HopLimit: 9}).UDP(UDP{}), 14, "6abcdef1 0008 11 09"},
		{"ipv6 payload_len override", New().IPv6(IPv6{PayloadLen: new(1)}).UDP(UDP{}), 18, "0001"},
		{"ipv6 version override", New().IPv6(IPv6{Version: new(4)}).UDP(UDP{}), 14, "40"},
		{"ipv6 next header override", New().IPv6(IPv6{NextHeader: new(200)}).UDP(UDP{}), 20, "c8"},
		{"ipv6 raw no next header", v6.Proto(ProtoNoNext).Payload([]byte{1}), 18, "0001 3b"},
		{"ipv6 ext chain", New().IPv6(IPv6{Ext: []Ext{HopByHop(1), DestOpts(2), Fragment(5, true, 9), AH(0xa, 0xb, make([]byte, 4))}}).TCP(TCP{}),
			20, "00 ?? " + strings.Repeat("??", 32) +
				"3c00 0104 00000000" + // hop-by-hop: next dstopts, hdrlen 0, PadN 4
				"2c01 010c" + strings.Repeat("00", 12) + // dstopts: next fragment, hdrlen 1
				"3300 0029 00000009" + // fragment: next AH, offset 5 <<3 | M
				"0602 0000 0000000a 0000000b 00000000"}, // AH: next TCP, hdrlen 2
		{"ipv6 routing header", New().IPv6(IPv6{Ext: []Ext{Routing(1)}}).UDP(UDP{}), 54, "1100 fd00 00000000"},
		{"ipv6 ext hdrlen override", New().IPv6(IPv6{Ext: []Ext{{Proto: ProtoDestOpts, Body: padN(1), HdrLen: new(200)}}}).UDP(UDP{}), 54, "11c8"},
		{"ipv6 payload_len counts ext", New().IPv6(IPv6{Ext: []Ext{HopByHop(2)}}).UDP(UDP{}).Payload([]byte{1, 2, 3}), 18, "001b"},
		{"trailer not counted", v6.UDP(UDP{}).Trailer([]byte{0xee}), 18, "0008"},
		{"trailer appended", v6.UDP(UDP{}).Trailer([]byte{0xee}), 62, "ee"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.b.Build()
			want := strings.Join(strings.Fields(tc.want), "")
			if tc.at+len(want)/2 > len(f) {
				t.Fatalf("frame of %d bytes too short for %d bytes at %d: %x", len(f), len(want)/2, tc.at, f)
			}
			got := hex.EncodeToString(f[tc.at : tc.at+len(want)/2])
			for i := range want {
				if want[i] != '?' && want[i] != got[i] {
					t.Fatalf("bytes at %d\n got %s\nwant %s", tc.at, got, want)
				}
			}
		})
	}
}

func TestVerifyChecksums(t *testing.T) {
	udp4 := New().IPv4(IPv4{}).UDP(UDP{Src: 1, Dst: 2}).Payload([]byte("abc")).Build()
	tcp6 := New().IPv6(IPv6{Ext: []Ext{DestOpts(1)}}).TCP(TCP{Src: 1, Dst: 2, Options: OptTimestamp(1, 2)}).Payload([]byte("abcd")).Build()
	flip := func(f []byte, at int) []byte { f = slices.Clone(f); f[at] ^= 0x40; return f }
	for _, tc := range []struct {
		name  string
		frame []byte
		want  error // nil, ErrChecksum or ErrMalformed
	}{
		{"ipv4 udp", udp4, nil},
		{"ipv4 udp with padding", New().IPv4(IPv4{}).UDP(UDP{}).Trailer(make([]byte, 20)).Build(), nil},
		{"ipv4 udp zero checksum", New().IPv4(IPv4{}).UDP(UDP{Checksum: new(0)}).Payload([]byte("x")).Build(), nil},
		{"ipv6 udp zero checksum", New().IPv6(IPv6{}).UDP(UDP{Checksum: new(0)}).Payload([]byte("x")).Build(), ErrChecksum},
		{"ipv6 tcp dstopts", tcp6, nil},
		{"ipv4 icmp", New().IPv4(IPv4{}).ICMP(ICMP{Type: ICMPEchoRequest, ID: 5}).Payload([]byte{1}).Build(), nil},
		{"ipv6 icmpv6 qinq", New().VLAN(VLAN{TPID: TPID8021AD}).VLAN(VLAN{}).IPv6(IPv6{}).ICMPv6(ICMP{Type: ICMPv6EchoReply}).Build(), nil},
		{"ipv4 header corrupt ttl", flip(udp4, 22), ErrChecksum},
		{"ipv4 header corrupt checksum", New().IPv4(IPv4{Checksum: new(0x1234)}).UDP(UDP{}).Build(), ErrChecksum},
		{"ipv4 udp corrupt payload", flip(udp4, len(udp4)-1), ErrChecksum},
		{"ipv4 udp corrupt address (pseudo header)", New().IPv4(IPv4{}).UDP(UDP{Checksum: new(0x1111)}).Build(), ErrChecksum},
		{"ipv6 tcp corrupt port", flip(tcp6, 62), ErrChecksum},
		{"ipv6 tcp corrupt source address", flip(tcp6, 23), ErrChecksum},
		{"ipv4 tcp corrupt checksum", New().IPv4(IPv4{}).TCP(TCP{Checksum: new(1)}).Build(), ErrChecksum},
		{"ipv4 icmp corrupt", New().IPv4(IPv4{}).ICMP(ICMP{Checksum: new(1)}).Build(), ErrChecksum},
		{"ipv6 icmpv6 corrupt", New().IPv6(IPv6{}).ICMPv6(ICMP{Checksum: new(1)}).Build(), ErrChecksum},
		{"ipv4 first fragment: l4 not checked", New().IPv4(IPv4{MF: true}).UDP(UDP{Checksum: new(1)}).Build(), nil},
		{"ipv6 later fragment: l4 not checked", New().IPv6(IPv6{Ext: []Ext{Fragment(8, false, 1)}}).UDP(UDP{Checksum: new(1)}).Build(), nil},
		{"ipv6 atomic fragment: l4 checked", New().IPv6(IPv6{Ext: []Ext{Fragment(0, false, 1)}}).UDP(UDP{Checksum: new(1)}).Build(), ErrChecksum},
		{"ipv4 unknown protocol", New().IPv4(IPv4{}).Proto(200).Payload([]byte{1, 2}).Build(), nil},
		{"unknown ethertype", New().Ether(Ether{Type: 0x88B6}).Payload([]byte{1}).Build(), nil},
		{"computed zero sent as ffff is valid", zeroSumUDP(t), nil},
		{"truncated ethernet", make([]byte, 13), ErrMalformed},
		{"truncated vlan", Truncate(New().VLAN(VLAN{}).IPv4(IPv4{}).UDP(UDP{}).Build(), 16), ErrMalformed},
		{"truncated ipv4", Truncate(udp4, 30), ErrMalformed},
		{"truncated udp", Truncate(udp4, 40), ErrMalformed},
		{"ipv4 ihl < 5", New().IPv4(IPv4{IHL: new(4)}).UDP(UDP{}).Build(), ErrMalformed},
		{"ipv4 version 5", New().IPv4(IPv4{Version: new(5)}).UDP(UDP{}).Build(), ErrMalformed},
		{"ipv4 tot_len too big", New().IPv4(IPv4{TotLen: new(1000)}).UDP(UDP{}).Build(), ErrMalformed},
		{"udp length > payload", New().IPv4(IPv4{}).UDP(UDP{Length: new(9)}).Build(), ErrMalformed},
		{"ipv6 ext past payload", New().IPv6(IPv6{Ext: []Ext{{Proto: ProtoDestOpts, Body: padN(1), HdrLen: new(9)}}}).UDP(UDP{}).Build(), ErrMalformed},
		{"ipv6 routing with segments left", routingSegmentsLeft(t), ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := VerifyChecksums(tc.frame)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("VerifyChecksums = %v, want %v", err, tc.want)
			}
		})
	}
}

// zeroSumUDP returns an IPv4 UDP frame whose computed checksum is 0 (so it carries 0xffff).
func zeroSumUDP(t *testing.T) []byte {
	base := New().IPv4(IPv4{}).UDP(UDP{Src: 1, Dst: 2})
	// With a 2-byte payload the word sum moves by the payload value: pick the one that makes
	// the one's complement sum 0xffff (checksum 0).
	f := base.Payload([]byte{0, 0}).Build()
	c := binary.BigEndian.Uint16(f[40:]) // ^(S) for S the sum with payload 0
	f = base.Payload([]byte{byte(c >> 8), byte(c)}).Build()
	if got := binary.BigEndian.Uint16(f[40:]); got != 0xFFFF {
		t.Fatalf("constructed frame has UDP checksum %#04x, want 0xffff", got)
	}
	return f
}

func routingSegmentsLeft(t *testing.T) []byte {
	rt := Routing(1)
	rt.Body[1] = 1
	return New().IPv6(IPv6{Ext: []Ext{rt}}).UDP(UDP{}).Build()
}

func TestVerifyAcceptsNegativeZeroTCP(t *testing.T) {
	// A TCP checksum of 0x0000 and 0xffff are the same one's complement value: a receiver
	// (and an RFC 1624 incremental update) may produce either. Find a frame whose checksum is
	// 0 and check both encodings verify.
	base := New().IPv4(IPv4{}).TCP(TCP{Src: 1, Dst: 2})
	f := base.Payload([]byte{0, 0}).Build()
	c := binary.BigEndian.Uint16(f[50:])
	f = base.Payload([]byte{byte(c >> 8), byte(c)}).Build()
	if got := binary.BigEndian.Uint16(f[50:]); got != 0 {
		t.Fatalf("constructed frame has TCP checksum %#04x, want 0", got)
	}
	for _, v := range []uint16{0, 0xFFFF} {
		binary.BigEndian.PutUint16(f[50:], v)
		if err := VerifyChecksums(f); err != nil {
			t.Errorf("checksum %#04x: %v", v, err)
		}
	}
}

func TestBuilderIsAValue(t *testing.T) {
	base := New().VLAN(VLAN{VID: 1}).IPv4(IPv4{Options: []byte{1, 1, 1, 1}})
	a := base.VLAN(VLAN{VID: 2}).UDP(UDP{Src: 1}).Build()
	b := base.VLAN(VLAN{VID: 3}).TCP(TCP{Src: 1}).Build()
	c := base.UDP(UDP{Src: 1}).Build()
	if a[18] != 0 || a[19] != 2 || b[19] != 3 {
		t.Errorf("inner VLAN IDs %d, %d, want 2, 3", a[19], b[19])
	}
	if len(c) != 14+4+24+8 {
		t.Errorf("base grew to %d bytes: branches alias the VLAN slice", len(c))
	}
	opts := []byte{1, 1, 1, 1}
	d := New().IPv4(IPv4{Options: opts})
	opts[0] = 7
	if f := d.UDP(UDP{}).Build(); f[34] != 1 {
		t.Errorf("builder kept a reference to the caller's options slice")
	}
	hbh := HopByHop(1)
	e := New().IPv6(IPv6{Ext: []Ext{hbh}}).UDP(UDP{})
	hbh.Body[0] = 0xEE
	if f := e.Build(); f[56] != 1 {
		t.Errorf("builder kept a reference to the caller's extension header body")
	}
}

func TestTruncate(t *testing.T) {
	f := New().IPv4(IPv4{}).UDP(UDP{}).Build()
	for _, tc := range []struct{ n, want int }{{0, 0}, {14, 14}, {41, 41}, {42, 42}, {100, 42}, {-1, 0}} {
		got := Truncate(f, tc.n)
		if len(got) != tc.want || !bytes.Equal(got, f[:tc.want]) {
			t.Errorf("Truncate(%d) = %d bytes, want %d", tc.n, len(got), tc.want)
		}
	}
	got := Truncate(f, 20)
	got[0] = 0xAA
	if f[0] == 0xAA {
		t.Error("Truncate returned an alias of the frame")
	}
}

func TestBuildPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Builder
	}{
		{"udp without ip", New().UDP(UDP{})},
		{"ihl override too big", New().IPv4(IPv4{IHL: new(16)}).UDP(UDP{})},
		{"tot_len negative", New().IPv4(IPv4{TotLen: new(-1)})},
		{"options too long", New().IPv4(IPv4{Options: make([]byte, 41)})},
		{"ipv6 address in ipv4", New().IPv4(IPv4{Src: DefaultSrc6})},
		{"ipv4 address in ipv6", New().IPv6(IPv6{Dst: DefaultDst4})},
		{"vlan id too big", New().VLAN(VLAN{VID: 4096})},
		{"ext header of 10 bytes", New().IPv6(IPv6{Ext: []Ext{{Proto: ProtoHopByHop, Body: make([]byte, 8)}}})},
		{"unknown ext header", New().IPv6(IPv6{Ext: []Ext{{Proto: 99, Body: make([]byte, 6)}}})},
		{"tcp options too long", New().IPv4(IPv4{}).TCP(TCP{Options: make([]byte, 41)})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("Build did not panic")
				}
			}()
			tc.b.Build()
		})
	}
}
