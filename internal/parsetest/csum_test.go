package parsetest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// TestCsum runs csum.h through bpf/parsetest/csumtest.bpf.c: frames with wrong checksums go
// in, and what comes out must be, byte for byte, the frame pktbuild builds with correct
// checksums (computed by csum_ipv4_set, csum_pseudo4/6 and csum_udp_final) and, when the
// payload has eight bytes, those bytes' bits flipped (followed by csum_replace4 and
// csum_replace_diff). IPv4 and IPv6, payloads of every length from 0 to 67 bytes (odd ones:
// the zero-padded last word), random addresses, ports and payloads, and the UDP checksum
// that folds to zero (sent as 0xffff).
func TestCsum(t *testing.T) {
	bpftest.RequireRoot(t)
	var objs csumtestObjects
	if err := loadCsumtestObjects(&objs, nil); err != nil {
		t.Fatalf("load csumtest: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	r := bpftest.Runner{Prog: objs.CsumXdp}

	rng := rand.New(rand.NewPCG(1, 2))
	addr4 := func() netip.Addr {
		var a [4]byte
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		return netip.AddrFrom4(a)
	}
	addr6 := func() netip.Addr {
		var a [16]byte
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		return netip.AddrFrom16(a)
	}
	wrong := func() *int { v := int(rng.Uint32N(0xffff)) + 1; return &v }
	frame := func(v6 bool, src, dst netip.Addr, sport, dport uint16, payload []byte, ipSum, udpSum *int) []byte {
		b := pktbuild.New()
		if v6 {
			b = b.IPv6(pktbuild.IPv6{Src: src, Dst: dst})
		} else {
			b = b.IPv4(pktbuild.IPv4{Src: src, Dst: dst, ID: uint16(len(payload)), Checksum: ipSum})
		}
		return b.UDP(pktbuild.UDP{Src: sport, Dst: dport, Checksum: udpSum}).Payload(payload).Build()
	}
	var cases []bpftest.Case
	for _, v6 := range []bool{false, true} {
		for n := 0; n < 68; n++ {
			for rep := 0; rep < 4; rep++ {
				src, dst := addr4(), addr4()
				if v6 {
					src, dst = addr6(), addr6()
				}
				sport, dport := uint16(rng.Uint32()), uint16(rng.Uint32())
				payload := make([]byte, n)
				for i := range payload {
					payload[i] = byte(rng.Uint32())
				}
				want := append([]byte(nil), payload...)
				ret := uint32(bpftest.XDPPass)
				if n >= 8 {
					for i := range 8 {
						want[i] = ^want[i]
					}
					ret = bpftest.XDPTx
				}
				var ipSum *int
				if !v6 {
					ipSum = wrong()
				}
				cases = append(cases, bpftest.Case{
					Name:    fmt.Sprintf("v6=%v payload=%d #%d", v6, n, rep),
					In:      frame(v6, src, dst, sport, dport, payload, ipSum, wrong()),
					WantRet: ret,
					WantOut: frame(v6, src, dst, sport, dport, want, nil, nil),
				})
			}
		}
	}
	// A datagram whose UDP checksum folds to zero: the payload's last word makes the sum
	// 0xffff, and the checksum is sent as 0xffff (RFC 768), never as 0 ("none").
	src, dst := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	probe := frame(false, src, dst, 1000, 2000, []byte{0, 0}, nil, nil)
	c := uint16(probe[len(probe)-4])<<8 | uint16(probe[len(probe)-3]) // the correct checksum with payload 0
	zeroing := []byte{byte(c >> 8), byte(c)}                          // adding ~sum to the sum gives 0xffff
	out := frame(false, src, dst, 1000, 2000, zeroing, nil, nil)
	if out[len(out)-4] != 0xff || out[len(out)-3] != 0xff {
		t.Fatalf("test frame's checksum is %#02x%02x, want 0xffff (a sum folding to zero)", out[len(out)-4], out[len(out)-3])
	}
	cases = append(cases, bpftest.Case{Name: "sum folds to zero", In: frame(false, src, dst, 1000, 2000, zeroing, wrong(), wrong()),
		WantRet: bpftest.XDPPass, WantOut: out})
	for _, c := range cases {
		r.RunCase(t, c)
	}
}

// TestParseEnumsMatchBTF pins the harness's copy of parse.h's return codes and flags to the
// BTF of the compiled object.
func TestParseEnumsMatchBTF(t *testing.T) {
	spec, err := loadParsetest()
	if err != nil {
		t.Fatal(err)
	}
	errs := map[string]int64{}
	for v, n := range errNames {
		if v == parseOK {
			errs[n] = int64(v)
			continue
		}
		errs["PARSE_ERR_"+n] = int64(v)
	}
	if len(errNames) != parseErrMax {
		t.Errorf("%d return codes, parseErrMax %d: PARSE_ERR_MAX must count them all", len(errNames), parseErrMax)
	}
	bpftest.CheckEnums(t, spec, map[string]map[string]int64{
		"parse_err": errs,
		"pkt_flags": {"PKT_F_VLAN": flagVLAN, "PKT_F_FRAG": flagFrag, "PKT_F_IP_OPTS": flagIPOpts, "PKT_F_IP6_EXT": flagIP6Ext},
	})
}
