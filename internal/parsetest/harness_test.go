package parsetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"golang.org/x/sys/unix"
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
	return h
}

// errNotRunnable: the kernel refused to test-run this frame (see skbRefuses).
var errNotRunnable = errors.New("frame refused by the skb test runner")

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

// run parses frame with e and returns the parse. It fails when the verdict is not the
// entry point's, when the program changed the packet or did not write its result; it
// returns errNotRunnable when the kernel refuses the frame for a documented reason.
func (h *harness) run(e entry, frame []byte) (parse, error) {
	zero := uint32(0)
	if err := h.objs.Result.Put(zero, parsetestParseResult{Ret: resultUnwritten}); err != nil {
		return parse{}, fmt.Errorf("reset result: %w", err)
	}
	res, err := bpftest.Run(e.prog, frame)
	if err != nil {
		if errors.Is(err, unix.EINVAL) && (len(frame) < minFrame || e.name == "tc" && skbRefuses(frame)) {
			return parse{}, errNotRunnable
		}
		return parse{}, err
	}
	if res.Ret != e.verdict {
		return parse{}, fmt.Errorf("parse_%s returned %d, want %d", e.name, int32(res.Ret), int32(e.verdict))
	}
	if !bytes.Equal(res.Out, frame) {
		return parse{}, fmt.Errorf("parse_%s changed the packet: %s", e.name, bpftest.DiffBytes(res.Out, frame))
	}
	var r parsetestParseResult
	if err := h.objs.Result.Lookup(zero, &r); err != nil {
		return parse{}, fmt.Errorf("read result: %w", err)
	}
	if r.Ret == resultUnwritten {
		return parse{}, fmt.Errorf("parse_%s did not write its result", e.name)
	}
	return fromBPF(r), nil
}

// check runs frame through both entry points and compares each parse with want and with the
// reference parser. It returns what it found wrong, "" if nothing.
func (h *harness) check(frame []byte, want parse) string {
	var b strings.Builder
	ref := refParse(frame)
	if d := ref.diff(want); d != "" {
		fmt.Fprintf(&b, "reference parser differs from the fixture:\n%s", d)
	}
	for _, e := range h.entries {
		got, err := h.run(e, frame)
		if errors.Is(err, errNotRunnable) {
			continue
		}
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
			continue
		}
		if d := got.diff(want); d != "" {
			fmt.Fprintf(&b, "parse_%s differs from the fixture:\n%s", e.name, d)
		}
	}
	return b.String()
}
