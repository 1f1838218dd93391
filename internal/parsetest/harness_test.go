package parsetest

import (
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

// Return codes of parse_pkt (enum parse_err in bpf/include/parse.h).
const (
	parseOK               = 0
	errETH                = -1
	errVLAN               = -2
	errVLANDepth          = -3
	errL3Proto            = -4
	errIP                 = -5
	errIPIHL              = -6
	errIPLen              = -7
	errIP6                = -8
	errExt                = -9
	errExtDepth           = -10
	errFragment           = -11
	errUDP                = -12
	errTCP                = -13
	errTCPDoff            = -14
	errICMP               = -15
	parseErrMax           = 16 // PARSE_ERR_MAX: every code is in (-parseErrMax, 0]
	resultUnwritten       = 0x7eadbeef
	minFrame              = 14   // BPF_PROG_TEST_RUN rejects shorter packets (ETH_HLEN)
	maxFrame              = 3000 // below the test-run limit (a page minus head- and tailroom)
	flagVLAN              = 1 << 0
	flagFrag              = 1 << 1
	flagIPOpts            = 1 << 2
	flagIP6Ext            = 1 << 3
	ethPIP                = 0x0800
	ethPIPv6              = 0x86DD
	tsNotFound      int32 = -1
)

var errNames = map[int32]string{
	parseOK: "PARSE_OK", errETH: "ETH", errVLAN: "VLAN", errVLANDepth: "VLAN_DEPTH",
	errL3Proto: "L3_PROTO", errIP: "IP", errIPIHL: "IP_IHL", errIPLen: "IP_LEN", errIP6: "IP6",
	errExt: "EXT", errExtDepth: "EXT_DEPTH", errFragment: "FRAGMENT", errUDP: "UDP",
	errTCP: "TCP", errTCPDoff: "TCP_DOFF", errICMP: "ICMP",
}

// parse is struct parse_result in a comparable, readable form: ports in host order,
// addresses as 16 bytes (IPv4 v4-mapped).
type parse struct {
	Ret        int32
	TSRet      int32
	TSval      uint32
	TSecr      uint32
	Saddr      [16]byte
	Daddr      [16]byte
	Sport      uint16
	Dport      uint16
	L3Proto    uint16
	L4Proto    uint8
	Flags      uint8
	L3Off      uint16
	L4Off      uint16
	PayloadOff uint16
	PayloadLen uint16
	TTL        uint8
	TOS        uint8
}

func fromBPF(r parsetestParseResult) parse {
	return parse{
		Ret: r.Ret, TSRet: r.TsRet, TSval: r.Tsval, TSecr: r.Tsecr,
		Saddr: r.Pkt.Saddr.In6U.U6Addr8, Daddr: r.Pkt.Daddr.In6U.U6Addr8,
		// __be16 read as a little-endian uint16.
		Sport: bits.ReverseBytes16(r.Pkt.Sport), Dport: bits.ReverseBytes16(r.Pkt.Dport),
		L3Proto: r.Pkt.L3Proto, L4Proto: r.Pkt.L4Proto, Flags: r.Pkt.Flags,
		L3Off: r.Pkt.L3Off, L4Off: r.Pkt.L4Off, PayloadOff: r.Pkt.PayloadOff, PayloadLen: r.Pkt.PayloadLen,
		TTL: r.Pkt.Ttl, TOS: r.Pkt.Tos,
	}
}

// diff lists the fields in which got differs from want, "" if none.
func (got parse) diff(want parse) string {
	if got == want {
		return ""
	}
	var b strings.Builder
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		g, w := gv.Field(i).Interface(), wv.Field(i).Interface()
		if g == w {
			continue
		}
		name := gv.Type().Field(i).Name
		switch name {
		case "Ret":
			fmt.Fprintf(&b, "  %s: %s, want %s\n", name, retName(g.(int32)), retName(w.(int32)))
		case "TSRet":
			fmt.Fprintf(&b, "  %s: %s, want %s\n", name, tsName(g.(int32)), tsName(w.(int32)))
		case "Saddr", "Daddr":
			fmt.Fprintf(&b, "  %s: %s, want %s\n", name, netip.AddrFrom16(g.([16]byte)), netip.AddrFrom16(w.([16]byte)))
		default:
			fmt.Fprintf(&b, "  %s: %v, want %v\n", name, g, w)
		}
	}
	return b.String()
}

func tsName(r int32) string {
	if r == 0 {
		return "0 (found)"
	}
	return fmt.Sprintf("%d (not found)", r)
}

func retName(r int32) string {
	if n, ok := errNames[r]; ok {
		return fmt.Sprintf("%d (%s)", r, n)
	}
	return fmt.Sprint(r)
}

// entry is one of the two parsetest programs.
type entry struct {
	name    string
	prog    *ebpf.Program
	verdict uint32 // what the entry point always returns
}

type harness struct {
	objs    parsetestObjects
	entries []entry
	runner  bpftest.Runner
}

// load loads the parsetest objects (skipping without root) and closes them at cleanup.
func load(tb testing.TB) *harness {
	tb.Helper()
	bpftest.RequireRoot(tb)
	h := &harness{}
	if err := loadParsetestObjects(&h.objs, nil); err != nil {
		tb.Fatalf("load parsetest objects: %v", err)
	}
	tb.Cleanup(func() { h.objs.Close() })
	h.entries = []entry{
		{"tc", h.objs.ParseTc, bpftest.TCActUnspec},
		{"xdp", h.objs.ParseXdp, bpftest.XDPPass},
	}
	h.runner = bpftest.Runner{Reset: func(tb testing.TB) {
		tb.Helper()
		if err := h.objs.Result.Put(uint32(0), parsetestParseResult{Ret: resultUnwritten}); err != nil {
			tb.Fatalf("reset result: %v", err)
		}
	}}
	return h
}

// skbRefuses says whether the skb (TC) test runner refuses frame: measured on 6.18, it
// returns EINVAL when the outer ethertype is IPv4 (IPv6) and the frame is shorter than an
// Ethernet plus a minimal IPv4 (IPv6) header, before running the program. XDP runs them.
func skbRefuses(frame []byte) bool {
	if len(frame) < minFrame {
		return true
	}
	switch be16(frame[12:]) {
	case ethPIP:
		return len(frame) < 14+20
	case ethPIPv6:
		return len(frame) < 14+40
	}
	return false
}

// cases is the fixture of frame on each entry point: the entry's fixed verdict, the packet
// unchanged, and check on the parse it wrote. A frame the kernel refuses to test-run for a
// documented reason (shorter than an Ethernet header; see skbRefuses) is not judged.
func (h *harness) cases(name string, frame []byte, check func(tb testing.TB, e entry, got parse)) []bpftest.Case {
	var cs []bpftest.Case
	for _, e := range h.entries {
		c := bpftest.Case{
			Name: name + e.name, Prog: e.prog, In: frame, WantRet: e.verdict, WantSame: true,
			Check: func(tb testing.TB, _ bpftest.Result) {
				tb.Helper()
				var r parsetestParseResult
				if err := h.objs.Result.Lookup(uint32(0), &r); err != nil {
					tb.Fatalf("read result: %v", err)
				}
				if r.Ret == resultUnwritten {
					tb.Errorf("parse_%s did not write its result", e.name)
					return
				}
				check(tb, e, fromBPF(r))
			},
		}
		if len(frame) < minFrame || e.name == "tc" && skbRefuses(frame) {
			c.Refused = unix.EINVAL
		}
		cs = append(cs, c)
	}
	return cs
}

// wantParse is a cases check: the parse equals want.
func wantParse(want parse) func(testing.TB, entry, parse) {
	return func(tb testing.TB, e entry, got parse) {
		tb.Helper()
		if d := got.diff(want); d != "" {
			tb.Errorf("parse_%s differs from the expected parse:\n%s", e.name, d)
		}
	}
}

// checkFixture compares the reference parser with want and runs frame's cases as subtests.
func (h *harness) checkFixture(t *testing.T, frame []byte, want parse) {
	t.Helper()
	if d := refParse(frame).diff(want); d != "" {
		t.Errorf("reference parser differs from the fixture:\n%s", d)
	}
	h.runner.Run(t, h.cases("", frame, wantParse(want)))
}
