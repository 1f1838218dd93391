package pping

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

func TestMain(m *testing.M) {
	if os.Getenv(peerEnv) != "" { // this binary as a lab test's TCP peer (peer_test.go)
		os.Exit(runPeer(os.Args[1:]))
	}
	os.Setenv(ForbidRootCgroupEnv, "1") // no test attaches a sock_ops program to the cgroup2 root
	os.Exit(bpftest.CheckFDLeaks(m))
}

// The monitored host is A (the "local" side, whose egress carries requests); B is remote.
var (
	addrA4, addrB4 = netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.1")
	addrA6, addrB6 = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8:1::2")
)

// fam builds packets between A and B in one address family.
type fam struct{ v6 bool }

func (f fam) String() string {
	if f.v6 {
		return "v6"
	}
	return "v4"
}

func (f fam) addrs(fromA bool) (src, dst netip.Addr) {
	a, b := addrA4, addrB4
	if f.v6 {
		a, b = addrA6, addrB6
	}
	if fromA {
		return a, b
	}
	return b, a
}

func (f fam) ip(fromA bool) pktbuild.Builder {
	src, dst := f.addrs(fromA)
	if f.v6 {
		return pktbuild.New().IPv6(pktbuild.IPv6{Src: src, Dst: dst})
	}
	return pktbuild.New().IPv4(pktbuild.IPv4{Src: src, Dst: dst})
}

// flowStr is how events print the flow of a reply from B (or from A when fromB is false).
func (f fam) flowStr(fromB bool, srcPort, dstPort uint16) string {
	src, dst := f.addrs(!fromB)
	return fmt.Sprintf("%s:%d+%s:%d", src, srcPort, dst, dstPort)
}

const (
	portA, portB = 40000, 80
	flagData     = pktbuild.ACK | pktbuild.PSH
)

// tcp is a segment between A:40000 and B:80 with the timestamp option (tsval < 0: none).
func (f fam) tcp(fromA bool, flags uint8, tsval, tsecr int64, payload int) []byte {
	h := pktbuild.TCP{Src: portA, Dst: portB, Flags: flags}
	if !fromA {
		h.Src, h.Dst = portB, portA
	}
	if tsval >= 0 {
		h.Options = slices.Concat(pktbuild.OptNOP(), pktbuild.OptNOP(), pktbuild.OptTimestamp(uint32(tsval), uint32(tsecr)))
	} else {
		h.Options = pktbuild.OptMSS(1460)
	}
	return f.ip(fromA).TCP(h).Payload(make([]byte, payload)).Build()
}

// echo is an ICMP(v6) echo request from A or reply from B (typ overrides the type).
func (f fam) echo(fromA bool, id, seq uint16, typ int) []byte {
	h := pktbuild.ICMP{ID: id, Seq: seq, Type: pktbuild.ICMPEchoRequest}
	if f.v6 {
		h.Type = pktbuild.ICMPv6EchoRequest
	}
	if !fromA {
		h.Type = pktbuild.ICMPEchoReply
		if f.v6 {
			h.Type = pktbuild.ICMPv6EchoReply
		}
	}
	if typ >= 0 {
		h.Type = uint8(typ)
	}
	b := f.ip(fromA).Payload(make([]byte, 16))
	if f.v6 {
		return b.ICMPv6(h).Build()
	}
	return b.ICMP(h).Build()
}

const dnsClientPort = 5353

// dns is a query from A (qr false) or a response from B, with payload bytes after the id.
func (f fam) dns(fromA bool, id uint16, qr bool, size int) []byte {
	p := make([]byte, size)
	flags := uint16(0x0100) // RD
	if qr {
		flags |= 0x8080 // QR, RA
	}
	if size >= 4 {
		binary.BigEndian.PutUint16(p, id)
		binary.BigEndian.PutUint16(p[2:], flags)
	}
	h := pktbuild.UDP{Src: dnsClientPort, Dst: 53}
	if !fromA {
		h.Src, h.Dst = 53, dnsClientPort
	}
	return f.ip(fromA).UDP(h).Payload(p).Build()
}

const svcPort, svcClientPort = 9999, 40001

// udp is a datagram between A:40001 and B:port whose payload starts with id (4 bytes, BE).
func (f fam) udp(fromA bool, port uint16, id uint32, size int) []byte {
	p := make([]byte, size)
	if size >= 4 {
		binary.BigEndian.PutUint32(p, id)
	}
	h := pktbuild.UDP{Src: svcClientPort, Dst: port}
	if !fromA {
		h.Src, h.Dst = port, svcClientPort
	}
	return f.ip(fromA).UDP(h).Payload(p).Build()
}

var v4, v6 = fam{false}, fam{true}

// step runs one packet through one hook and checks the counter changes: want names
// counters of that hook by their Go field names; Pkts and Bytes are implied.
type step struct {
	hook Hook
	pkt  []byte
	want bpftest.Counters
}

func eg(pkt []byte, want bpftest.Counters) step { return step{HookEgress, pkt, want} }
func in(pkt []byte, want bpftest.Counters) step { return step{HookIngress, pkt, want} }

type wantRTT struct {
	flow   string // Flow.String()
	proto  string
	id     uint64
	egress bool
	idType IDType
	connID []byte // QUIC: the server's connection id (nil: none known)
}

type wantFlow struct {
	flow   string
	typ    FlowEventType
	reason FlowReason
	source FlowSource
}

type fixture struct {
	name  string
	cfg   func(*Config)
	steps []step
	rtts  []wantRTT
	flows []wantFlow
	full  []string // map names of map-full warnings
	check func(t *testing.T, m *Monitor, elapsed time.Duration)
	cache monitorCache // nil: a monitor of its own
}

// monitorCache shares one loaded monitor per configuration between fixtures (loading
// verifies ~40k instructions per hook), emptying its flow and identifier tables in between.
// Counters are compared as deltas, so they need no reset.
type monitorCache map[string]*Monitor

func newMonitorCache(t *testing.T) monitorCache {
	mc := monitorCache{}
	t.Cleanup(func() {
		for _, m := range mc {
			if err := m.Close(); err != nil {
				t.Errorf("close monitor: %v", err)
			}
		}
	})
	return mc
}

func (mc monitorCache) get(t *testing.T, mod func(*Config)) *Monitor {
	t.Helper()
	bpftest.RequireRoot(t)
	cfg := fixtureConfig()
	if mod != nil {
		mod(&cfg)
	}
	key := fmt.Sprintf("%+v", cfg)
	m := mc[key]
	if m == nil {
		var err error
		if m, err = load(cfg, bpftest.FixClock); err != nil {
			t.Fatalf("load pping: %v", err)
		}
		mc[key] = m
	}
	clearMap(t, m.objs.Flows, new(ppingPpFlowState))
	clearMap(t, m.objs.PktTs, new(uint64))
	if err := m.objs.PpHint.Set(make([]uint32, hintSlots)); err != nil {
		t.Fatal(err)
	}
	if err := m.objs.PpDc.Set(make([]byte, m.objs.PpDc.Size())); err != nil {
		t.Fatal(err)
	}
	drain(t, m)
	return m
}

func clearMap(t *testing.T, mp *ebpf.Map, v any) {
	t.Helper()
	var keys [][]byte
	var raw []byte
	it := mp.Iterate()
	for it.Next(&raw, v) {
		keys = append(keys, slices.Clone(raw))
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate %s: %v", mp, err)
	}
	for _, key := range keys {
		if err := mp.Delete(key); err != nil {
			t.Fatalf("clear %s: %v", mp, err)
		}
	}
}

// fixtureConfig samples every identifier, measures local flows (BPF_PROG_TEST_RUN has no
// meaningful ingress interface for the FIB lookup) and keeps maps small. It leaves pure ACKs
// untimed (ePPing's rule, as on a router): BPF_PROG_TEST_RUN gives every skb a socket, so
// every pure ACK at egress would count as this host's; TestFixturesHostACKs covers those.
func fixtureConfig() Config {
	c := DefaultConfig()
	c.RateLimit = 0
	c.IncludeLocal = true
	c.HostACKs = false
	c.CleanupInterval = 0
	c.MaxFlows = 64
	c.MaxSubnets = 16
	return c
}

func loadFixture(t *testing.T, mod func(*Config)) *Monitor {
	t.Helper()
	bpftest.RequireRoot(t)
	cfg := fixtureConfig()
	if mod != nil {
		mod(&cfg)
	}
	m, err := load(cfg, bpftest.FixClock)
	if err != nil {
		t.Fatalf("load pping: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close monitor: %v", err)
		}
	})
	return m
}

func readCounters(m *Monitor) func() (bpftest.Counters, error) {
	return func() (bpftest.Counters, error) { return bpftest.SumPerCPU[ppingPpCounters](m.objs.Counters) }
}

// stepGap is the time between two steps on the fixtures' fixed clock (bpftest.FixClock):
// step i of a case runs at bpftest.ClockStart + (i+1) stepGap, so an RTT measured between
// two steps is an exact multiple of it.
const stepGap = time.Millisecond

// stepCase is step i as a bpftest.Case: its hook's program, the pass verdict, its time, and
// its counter changes (want names counters of that hook by their Go field names; Pkts and
// Bytes are implied).
func stepCase(m *Monitor, i int, s step) bpftest.Case {
	prog := m.objs.PpingEgress
	if s.hook == HookIngress {
		prog = m.objs.PpingIngress
	}
	want := bpftest.Counters{}
	prefix := fmt.Sprintf("%d.", s.hook)
	want[prefix+"Pkts"], want[prefix+"Bytes"] = 1, int64(len(s.pkt))
	for k, v := range s.want {
		if !strings.Contains(k, ".") {
			k = prefix + k
		}
		want[k] = v
	}
	return bpftest.Case{Name: s.hook.String(), Prog: prog, In: s.pkt, Now: bpftest.ClockStart + uint64(i+1)*uint64(stepGap),
		WantRet: passVerdict(prog), WantCounters: want}
}

// runSteps runs steps in order on m's state, as one case of bpftest's fixture style (no
// reset between them), each at its time on the fixed clock. It returns the time from the
// first step to the last.
func runSteps(t *testing.T, m *Monitor, steps []step) time.Duration {
	t.Helper()
	c := bpftest.Case{Name: t.Name()}
	for i, s := range steps {
		c.Steps = append(c.Steps, stepCase(m, i, s))
	}
	bpftest.Runner{Counters: readCounters(m), Clock: m.objs.KedgeClockNs}.RunCase(t, c)
	return time.Duration(max(len(steps)-1, 0)) * stepGap
}

// advance moves the fixed clock on by d (for the garbage collector, which reads it too).
func advance(t *testing.T, m *Monitor, d time.Duration) {
	t.Helper()
	var now uint64
	if err := m.objs.KedgeClockNs.Get(&now); err != nil {
		t.Fatal(err)
	}
	if err := m.objs.KedgeClockNs.Set(now + uint64(d)); err != nil {
		t.Fatal(err)
	}
}

// passVerdict is what prog must return for every packet: XDP_PASS or TC_ACT_UNSPEC.
func passVerdict(prog *ebpf.Program) uint32 {
	if prog.Type() == ebpf.XDP {
		return bpftest.XDPPass
	}
	return bpftest.TCActUnspec
}

// drain returns the events queued in the ring buffer.
func drain(t *testing.T, m *Monitor) []Event {
	t.Helper()
	rd, err := m.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rd.SetDeadline(time.Now())
	var evs []Event
	for {
		ev, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return evs
		}
		if err != nil {
			t.Fatalf("read event: %v", err)
		}
		evs = append(evs, ev)
	}
}

func (fx fixture) run(t *testing.T) {
	var m *Monitor
	if fx.cache != nil {
		m = fx.cache.get(t, fx.cfg)
	} else {
		m = loadFixture(t, fx.cfg)
	}
	span := runSteps(t, m, fx.steps)
	var rtts []*RTTEvent
	var flows []*FlowEvent
	var full []string
	for _, ev := range drain(t, m) {
		switch e := ev.(type) {
		case *RTTEvent:
			rtts = append(rtts, e)
		case *FlowEvent:
			flows = append(flows, e)
		case *MapFullEvent:
			full = append(full, e.Map)
		}
	}
	if len(rtts) != len(fx.rtts) {
		t.Errorf("%d RTT events, want %d: %v", len(rtts), len(fx.rtts), rtts)
	}
	for i := range min(len(rtts), len(fx.rtts)) {
		got, want := rtts[i], fx.rtts[i]
		if got.Flow.String() != want.flow || got.Flow.Protocol() != want.proto || got.ID != want.id ||
			got.MatchOnEgress != want.egress || (want.idType != 0 && got.Flow.IDType != want.idType) {
			t.Errorf("RTT event %d: %s %s id %d egress %v type %v, want %s %s id %d egress %v type %v", i,
				got.Flow.Protocol(), got.Flow, got.ID, got.MatchOnEgress, got.Flow.IDType,
				want.proto, want.flow, want.id, want.egress, want.idType)
		}
		if got.Flow.IDType == IDQUICSpin && !bytes.Equal(got.ConnID, want.connID) {
			t.Errorf("RTT event %d: connection id %x, want %x", i, got.ConnID, want.connID)
		}
		// The RTT is the time between the request's and the reply's steps on the fixed
		// clock: a whole number of step gaps, within the case.
		if got.RTT <= 0 || got.RTT > span || got.RTT%stepGap != 0 || got.MinRTT <= 0 || got.MinRTT > got.RTT {
			t.Errorf("RTT event %d: rtt %v min %v, want 0 < min <= rtt <= %v, a multiple of %v", i, got.RTT, got.MinRTT, span, stepGap)
		}
	}
	if len(flows) != len(fx.flows) {
		t.Errorf("%d flow events, want %d: %v", len(flows), len(fx.flows), flows)
	}
	for i := range min(len(flows), len(fx.flows)) {
		got, want := flows[i], fx.flows[i]
		if got.Flow.String() != want.flow || got.Type != want.typ || got.Reason != want.reason || got.Source != want.source {
			t.Errorf("flow event %d: %s %s due to %s from %s, want %s %s due to %s from %s", i,
				got.Flow, got.Type, got.Reason, got.Source, want.flow, want.typ, want.reason, want.source)
		}
	}
	if !slices.Equal(full, fx.full) {
		t.Errorf("map-full warnings %v, want %v", full, fx.full)
	}
	checkHints(t, m)
	checkDirCache(t, m)
	if fx.check != nil {
		fx.check(t, m, span)
	}
}

const hintSlots = int(ppingPpConstsPP_HINT_SLOTS)

// hintSlot is pp_hint_slot() (maps.h).
func hintSlot(t *ppingPpTuple) int {
	w := func(a [16]uint8, i int) uint32 { return binary.LittleEndian.Uint32(a[4*i:]) }
	s, d := t.Saddr.In6U.U6Addr8, t.Daddr.In6U.U6Addr8
	h := w(s, 3) * 0x9e3779b1
	h ^= w(d, 3) * 0x85ebca77
	h ^= (w(s, 2) ^ w(d, 2)) * 0xc2b2ae3d
	h ^= (uint32(t.Sport)<<16 | uint32(t.Dport)) * 0x27d4eb2f
	h ^= uint32(t.Proto)
	return int((h ^ (h >> 15)) & uint32(hintSlots-1))
}

// checkHints checks the invariants behind the fast path for pure replies: each direction's
// outstanding count is its identifiers in pkt_ts, and each hint slot is the identifiers
// plus the directions waiting to open that hash to it (so a zero slot really means that
// no reply of its directions can be a sample or open anything).
func checkHints(t *testing.T, m *Monitor) {
	t.Helper()
	want := make([]uint32, hintSlots)
	perDir := map[ppingPpTuple]uint32{}
	var id ppingPpPktId
	var stored uint64
	it := m.objs.PktTs.Iterate()
	for it.Next(&id, &stored) {
		want[hintSlot(&id.Flow)]++
		perDir[id.Flow]++
	}
	var key ppingPpTuple
	var fs ppingPpFlowState
	it2 := m.objs.Flows.Iterate()
	for it2.Next(&key, &fs) {
		for i, dir := range []ppingPpTuple{key, key.reverse()} {
			if fs.Shared[i].Conn == connWaitOpen {
				want[hintSlot(&dir)]++
			}
			if fs.Shared[i].Outstanding != perDir[dir] {
				t.Errorf("direction %s: outstanding %d, %d identifiers stored", dir.flow(), fs.Shared[i].Outstanding, perDir[dir])
			}
		}
	}
	if err := errors.Join(it.Err(), it2.Err()); err != nil {
		t.Fatal(err)
	}
	got := make([]uint32, hintSlots)
	if err := m.objs.PpHint.Get(got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("hint slot %d: %d, want %d (identifiers and unopened directions hashing to it)", i, got[i], want[i])
		}
	}
}

// variant returns fx with the given ingress program and, mirrored, with every step on the
// other hook: the pipeline does not depend on the direction (the fixtures measure local
// flows, so no FIB lookup), so a mirrored fixture counts the same under the other hook and
// its RTTs are matched on the other side. Mirroring puts the egress-only fixtures' packets,
// malformed and truncated ones included, through both ingress programs.
func (fx fixture) variant(hook IngressHook, mirror bool) fixture {
	cfg := fx.cfg
	fx.cfg = func(c *Config) {
		if cfg != nil {
			cfg(c)
		}
		c.IngressHook = hook
	}
	if !mirror {
		return fx
	}
	fx.steps = slices.Clone(fx.steps)
	for i := range fx.steps {
		fx.steps[i].hook = HookIngress + HookEgress - fx.steps[i].hook
	}
	fx.rtts = slices.Clone(fx.rtts)
	for i := range fx.rtts {
		fx.rtts[i].egress = !fx.rtts[i].egress
	}
	return fx
}

// runAllHooks runs fx with the TC and the XDP ingress program, as written and mirrored.
func (fx fixture) runAllHooks(t *testing.T) {
	for _, hook := range []IngressHook{IngressTC, IngressXDP} {
		for _, mirror := range []bool{false, true} {
			name := hook.String()
			if mirror {
				name += "/mirrored"
			}
			t.Run(name, fx.variant(hook, mirror).run)
		}
	}
}

// runEachIngress runs fx as written with the TC ingress program and mirrored with the XDP
// one: for fixtures that load a monitor each, half of runAllHooks' loads, and the steps
// written for egress still go through the XDP program.
func (fx fixture) runEachIngress(t *testing.T) {
	t.Run("tc", fx.variant(IngressTC, false).run)
	t.Run("xdp/mirrored", fx.variant(IngressXDP, true).run)
}

// c is shorthand for counter expectations.
type c = bpftest.Counters

func tcpFixtures(f fam) []fixture {
	fromB := f.flowStr(true, portB, portA)
	fromA := f.flowStr(false, portA, portB)
	// The usual start: a mid-flow segment (waits for the TSval to change), then one that
	// is timestamped.
	open := []step{
		eg(f.tcp(true, flagData, 100, 50, 10), c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
		eg(f.tcp(true, flagData, 101, 50, 10), c{"TsStored": 1, "MatchNone": 1}),
	}
	return []fixture{{
		name: "data timestamped, ACK echo matched",
		steps: append(open,
			in(f.tcp(false, pktbuild.ACK, 7000, 101, 0), c{"FlowOpened": 1, "MatchRtt": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 101, idType: IDTCPTimestamp}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
		check: func(t *testing.T, m *Monitor, _ time.Duration) {
			fs := onlyFlow(t, m)
			d, o, r := fs.Shared[0], fs.Own0, fs.Own1
			if fs.Own1.Bytes > 0 {
				d, o, r = fs.Shared[1], fs.Own1, fs.Own0
			}
			if d.Conn != 2 || d.Outstanding != 0 || o.Pkts != 2 || o.Bytes != 20 || r.Pkts != 1 || d.MinRtt == 0 || o.LastId != 101 {
				t.Errorf("request direction state %+v %+v (reverse %+v), want open, nothing outstanding, 2 sent (20 B), 1 received, min RTT, last id 101", d, o, r)
			}
			if n := countEntries(t, m); n != 0 {
				t.Errorf("%d identifiers left in pkt_ts, want 0", n)
			}
		},
	}, {
		name:  "SYN skipped by default",
		steps: []step{eg(f.tcp(true, pktbuild.SYN, 1, 0, 0), c{"SkipSyn": 1})},
	}, {
		name: "SYN starts the flow with include-SYN; the handshake gives both RTTs",
		cfg:  func(c *Config) { c.IncludeSYN = true },
		steps: []step{
			eg(f.tcp(true, pktbuild.SYN, 1, 0, 0), c{"FlowCreated": 1, "TsStored": 1}),
			in(f.tcp(false, pktbuild.SYN|pktbuild.ACK, 900, 1, 0), c{"TsStored": 1, "FlowOpened": 1, "MatchRtt": 1}),
			eg(f.tcp(true, pktbuild.ACK, 2, 900, 0), c{"FlowOpened": 1, "MatchRtt": 1}),
		},
		rtts: []wantRTT{{flow: fromB, proto: "TCP", id: 1}, {flow: fromA, proto: "TCP", id: 900, egress: true}},
		flows: []wantFlow{
			{fromB, FlowOpening, ReasonSYN, SourceDest},
			{fromA, FlowOpening, ReasonSYNACK, SourceDest},
		},
	}, {
		name:  "no timestamp option",
		steps: []step{eg(f.tcp(true, flagData, -1, 0, 10), c{"SkipNoTcpTs": 1})},
	}, {
		name:  "pure ACK of an unknown flow",
		steps: []step{eg(f.tcp(true, pktbuild.ACK, 5, 6, 0), c{"MatchNone": 1})},
	}, {
		name:  "echo of an identifier never stored",
		steps: append(open, in(f.tcp(false, pktbuild.ACK, 7000, 99, 0), c{"FlowOpened": 1, "MatchMiss": 1})),
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "TSval wraps around 2^32",
		steps: []step{
			eg(f.tcp(true, flagData, 0xfffffff0, 50, 10), c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
			eg(f.tcp(true, flagData, 5, 50, 10), c{"TsStored": 1, "MatchNone": 1}),
			in(f.tcp(false, pktbuild.ACK, 7000, 5, 0), c{"FlowOpened": 1, "MatchRtt": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 5}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "reordered segment: an older TSval is not timestamped, its echo misses",
		steps: append(open,
			eg(f.tcp(true, flagData, 100, 50, 10), c{"TsNotNew": 1, "MatchNone": 1}),
			in(f.tcp(false, pktbuild.ACK, 7000, 100, 0), c{"FlowOpened": 1, "MatchMiss": 1}),
			in(f.tcp(false, pktbuild.ACK, 7001, 101, 0), c{"MatchRtt": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 101}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "retransmission with the same TSval, duplicate ACK: one sample",
		steps: append(open,
			eg(f.tcp(true, flagData, 101, 50, 10), c{"TsNotNew": 1, "MatchNone": 1}),
			in(f.tcp(false, pktbuild.ACK, 7000, 101, 0), c{"FlowOpened": 1, "MatchRtt": 1}),
			in(f.tcp(false, pktbuild.ACK, 7000, 101, 0), c{"MatchNone": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 101}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "rate limit",
		cfg:  func(c *Config) { c.RateLimit = time.Hour },
		steps: append(open,
			eg(f.tcp(true, flagData, 102, 50, 10), c{"TsRateLimited": 1, "MatchNone": 1})),
	}, {
		name: "FIN closes a direction, RST the rest",
		steps: append(open,
			in(f.tcp(false, flagData, 7000, 101, 10), c{"TsNotNew": 1, "FlowOpened": 1, "MatchRtt": 1}),
			eg(f.tcp(true, pktbuild.FIN|pktbuild.ACK, 102, 7000, 0), c{"FlowOpened": 1, "MatchNone": 1, "FlowClosed": 1}),
			in(f.tcp(false, pktbuild.RST|pktbuild.ACK, 7001, 102, 0), c{"MatchNone": 1, "FlowClosed": 1, "FlowDeleted": 1})),
		rtts: []wantRTT{{flow: fromB, proto: "TCP", id: 101}},
		flows: []wantFlow{
			{fromB, FlowOpening, ReasonFirstPacket, SourceDest},
			{fromA, FlowOpening, ReasonFirstPacket, SourceDest},
			{fromB, FlowClosing, ReasonFIN, SourceDest}, // A's FIN: B->A is A's "reply" direction
			{fromA, FlowClosing, ReasonRST, SourceDest}, // B's RST: A->B is B's "reply" direction
		},
		check: func(t *testing.T, m *Monitor, _ time.Duration) {
			if n := countFlows(t, m); n != 0 {
				t.Errorf("%d flows left after RST, want 0", n)
			}
		},
	}}
}

func icmpFixtures(f fam) []fixture {
	proto := "ICMP"
	unreach := 3
	if f.v6 {
		proto, unreach = "ICMPv6", 1
	}
	fromB := f.flowStr(true, 7, 7)
	req := func(seq uint16) []byte { return f.echo(true, 7, seq, -1) }
	rep := func(seq uint16) []byte { return f.echo(false, 7, seq, -1) }
	return []fixture{{
		name: "echo request matched by its reply",
		steps: []step{
			eg(req(1), c{"FlowCreated": 1, "TsStored": 1}),
			in(rep(1), c{"FlowOpened": 1, "MatchRtt": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: proto, id: 1, idType: IDICMPEcho}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "reply to another sequence number",
		steps: []step{
			eg(req(1), c{"FlowCreated": 1, "TsStored": 1}),
			in(rep(9), c{"FlowOpened": 1, "MatchMiss": 1}),
		},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name:  "not an echo",
		steps: []step{in(f.echo(false, 7, 1, unreach), c{"SkipIcmpType": 1})},
	}, {
		name: "replies reordered: both matched",
		steps: []step{
			eg(req(1), c{"FlowCreated": 1, "TsStored": 1}),
			eg(req(2), c{"TsStored": 1}),
			in(rep(2), c{"FlowOpened": 1, "MatchRtt": 1}),
			in(rep(1), c{"MatchRtt": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: proto, id: 2}, {flow: fromB, proto: proto, id: 1}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "request sent twice: no sample (Karn)",
		steps: []step{
			eg(req(1), c{"FlowCreated": 1, "TsStored": 1}),
			eg(req(1), c{"TsRetrans": 1}),
			in(rep(1), c{"FlowOpened": 1, "MatchNone": 1}),
		},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "each echo id is a flow",
		steps: []step{
			eg(f.echo(true, 1, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
			eg(f.echo(true, 2, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
		},
	}, {
		name:  "truncated header",
		steps: []step{eg(pktbuild.Truncate(req(1), len(req(1))-20), c{"ParseErr[15]": 1})},
	}, {
		name:  "ICMP off",
		cfg:   func(c *Config) { c.ICMP = false },
		steps: []step{eg(req(1), c{"SkipProto": 1})},
	}}
}

func dnsFixtures(f fam) []fixture {
	fromB := f.flowStr(true, 53, dnsClientPort)
	return []fixture{{
		name: "query matched by its response",
		steps: []step{
			eg(f.dns(true, 0x1234, false, 30), c{"FlowCreated": 1, "TsStored": 1}),
			in(f.dns(false, 0x1234, true, 46), c{"FlowOpened": 1, "MatchRtt": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: "UDP", id: 0x1234, idType: IDDNS}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "response with another id",
		steps: []step{
			eg(f.dns(true, 0x1234, false, 30), c{"FlowCreated": 1, "TsStored": 1}),
			in(f.dns(false, 0x4321, true, 46), c{"FlowOpened": 1, "MatchMiss": 1}),
		},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name:  "shorter than a DNS header",
		steps: []step{eg(f.dns(true, 0x1234, false, 8), c{"SkipUdpShort": 1})},
	}, {
		name: "QR bit on the wrong side",
		steps: []step{
			eg(f.dns(true, 0x1234, true, 30), c{"SkipProto": 1}),
			in(f.dns(false, 0x1234, false, 30), c{"SkipProto": 1}),
		},
	}, {
		name: "query retransmitted: no sample (Karn)",
		steps: []step{
			eg(f.dns(true, 0x1234, false, 30), c{"FlowCreated": 1, "TsStored": 1}),
			eg(f.dns(true, 0x1234, false, 30), c{"TsRetrans": 1}),
			in(f.dns(false, 0x1234, true, 46), c{"FlowOpened": 1, "MatchNone": 1}),
		},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name:  "DNS off",
		cfg:   func(c *Config) { c.DNS = false },
		steps: []step{eg(f.dns(true, 0x1234, false, 30), c{"SkipProto": 1})},
	}, {
		name:  "truncated UDP header",
		steps: []step{eg(pktbuild.Truncate(f.dns(true, 1, false, 30), len(f.dns(true, 1, false, 30))-34), c{"ParseErr[12]": 1})},
	}}
}

func udpFixtures(f fam) []fixture {
	fromB := f.flowStr(true, svcPort, svcClientPort)
	svc := func(c *Config) { c.Services = []Service{{Port: svcPort, Offset: 0, Len: 4}} }
	return []fixture{{
		name: "request id matched by the response",
		cfg:  svc,
		steps: []step{
			eg(f.udp(true, svcPort, 0xdeadbeef, 64), c{"FlowCreated": 1, "TsStored": 1}),
			in(f.udp(false, svcPort, 0xdeadbeef, 64), c{"FlowOpened": 1, "MatchRtt": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: "UDP", id: 0xdeadbeef, idType: IDUDPRequest}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name: "little-endian id at an offset",
		cfg:  func(c *Config) { c.Services = []Service{{Port: svcPort, Offset: 1, Len: 2, LittleEndian: true}} },
		steps: []step{
			eg(f.udp(true, svcPort, 0x00aabb00, 8), c{"FlowCreated": 1, "TsStored": 1}),
			in(f.udp(false, svcPort, 0x00aabb00, 8), c{"FlowOpened": 1, "MatchRtt": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: "UDP", id: 0xbbaa}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
	}, {
		name:  "request shorter than its id",
		cfg:   svc,
		steps: []step{eg(f.udp(true, svcPort, 0, 2), c{"SkipUdpShort": 1})},
	}, {
		name:  "other port",
		cfg:   svc,
		steps: []step{eg(f.udp(true, 7777, 1, 64), c{"SkipProto": 1})},
	}}
}

// tcpRaw is a segment from B to A (A:40000 <- B:80) with raw option bytes and an optional
// data offset (nil: the options' length), for malformed timestamp options.
func (f fam) tcpRaw(flags uint8, opts []byte, doff *int, payload int) []byte {
	return f.ip(false).TCP(pktbuild.TCP{Src: portB, Dst: portA, Flags: flags, Options: opts, DataOffset: doff}).
		Payload(make([]byte, payload)).Build()
}

// retireFixtures: an echo retires the TSvals of its request direction that are serially
// older than it (flow.h's pp_retire(), RFC 7323: TS.Recent does not go back), counted
// ts_retired at the echo's hook, without a sample; an equal echo still matches; echoes in
// malformed or truncated options retire nothing (their packets are counted as before).
func retireFixtures(f fam) []fixture {
	fromB := f.flowStr(true, portB, portA)
	opened := []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}}
	data := func(tsval uint32, want c) step { return eg(f.tcp(true, flagData, int64(tsval), 50, 10), want) }
	ack := func(tsval, tsecr uint32, want c) step {
		return in(f.tcp(false, pktbuild.ACK, int64(tsval), int64(tsecr), 0), want)
	}
	// open stores 101 (100 is seen mid-flow and waits for the TSval to change), then 102
	// and 103.
	open := []step{
		data(100, c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
		data(101, c{"TsStored": 1, "MatchNone": 1}),
		data(102, c{"TsStored": 1, "MatchNone": 1}),
		data(103, c{"TsStored": 1, "MatchNone": 1}),
	}
	return []fixture{{
		name: "echo of a newer TSval retires the older ones: one sample, for the echoed TSval",
		steps: append(slices.Clone(open),
			ack(7000, 102, c{"FlowOpened": 1, "TsRetired": 1, "MatchRtt": 1}), // 101 retired
			ack(7001, 101, c{"MatchMiss": 1}),                                 // reordered: 101 is gone
			ack(7002, 103, c{"MatchRtt": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 102, idType: IDTCPTimestamp}, {flow: fromB, proto: "TCP", id: 103}},
		flows: opened,
	}, {
		name: "equal echoes match in order, nothing retired",
		steps: append(slices.Clone(open),
			ack(7000, 101, c{"FlowOpened": 1, "MatchRtt": 1}),
			ack(7001, 101, c{"MatchMiss": 1}), // duplicate ACK: 102 and 103 stay
			ack(7002, 102, c{"MatchRtt": 1}),
			ack(7003, 103, c{"MatchRtt": 1}),
			ack(7004, 103, c{"MatchNone": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 101}, {flow: fromB, proto: "TCP", id: 102}, {flow: fromB, proto: "TCP", id: 103}},
		flows: opened,
	}, {
		name: "echo newer than every stored TSval: all retired, the next ACK finds nothing outstanding",
		steps: append(slices.Clone(open),
			ack(7000, 104, c{"FlowOpened": 1, "TsRetired": 3, "MatchMiss": 1}),
			ack(7001, 104, c{"MatchNone": 1})),
		flows: opened,
		check: func(t *testing.T, m *Monitor, _ time.Duration) {
			if n := countEntries(t, m); n != 0 {
				t.Errorf("%d identifiers left in pkt_ts, want 0", n)
			}
		},
	}, {
		name: "an echo older than every stored TSval retires nothing",
		steps: append(slices.Clone(open),
			ack(7000, 100, c{"FlowOpened": 1, "MatchMiss": 1}),
			ack(7001, 103, c{"TsRetired": 2, "MatchRtt": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 103}},
		flows: opened,
	}, {
		// 0xfffffffe is stored, then 0xffffffff and 1 after the wrap: 1 is newer than both
		// (serial arithmetic, RFC 7323 section 5.2), 0xfffffff0 older than all three.
		name: "serial comparison across 2^32",
		steps: []step{
			data(0xfffffffd, c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
			data(0xfffffffe, c{"TsStored": 1, "MatchNone": 1}),
			data(0xffffffff, c{"TsStored": 1, "MatchNone": 1}),
			data(1, c{"TsStored": 1, "MatchNone": 1}),
			ack(7000, 0xfffffff0, c{"FlowOpened": 1, "MatchMiss": 1}),
			ack(7001, 0xffffffff, c{"TsRetired": 1, "MatchRtt": 1}),
			ack(7002, 1, c{"MatchRtt": 1}),
		},
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 0xffffffff}, {flow: fromB, proto: "TCP", id: 1}},
		flows: opened,
	}, {
		// The queue holds PP_TS_QUEUE (4) TSvals; the fifth is left to the collector, and
		// an echo can still match it.
		name: "a TSval beyond the queue is not retired, and still matched",
		steps: append(slices.Clone(open),
			data(104, c{"TsStored": 1, "MatchNone": 1}),
			data(105, c{"TsStored": 1, "MatchNone": 1}),
			ack(7000, 106, c{"FlowOpened": 1, "TsRetired": 4, "MatchMiss": 1}),
			ack(7001, 105, c{"MatchRtt": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 105}},
		flows: opened,
	}, {
		// Each of these ACKs would echo 103 if its option parsed: a timestamp option with a
		// bad length, one cut off by the header length, one cut off by the frame's end.
		// They count what they counted before the queue, and 101-103 stay matchable.
		name: "malformed and truncated timestamp options retire nothing",
		steps: append(slices.Clone(open),
			in(f.tcpRaw(pktbuild.ACK, []byte{1, 1, 8, 1, 0, 0, 0x1b, 0x58, 0, 0, 0, 103}, nil, 0), c{"SkipNoTcpTs": 1}),
			in(f.tcpRaw(pktbuild.ACK, slices.Concat(pktbuild.OptNOP(), pktbuild.OptNOP(), pktbuild.OptTimestamp(7000, 103)), new(7), 0), c{"SkipNoTcpTs": 1}),
			in(pktbuild.Truncate(f.tcp(false, pktbuild.ACK, 7000, 103, 0), len(f.tcp(false, pktbuild.ACK, 7000, 103, 0))-6), c{"ParseErr[14]": 1}),
			ack(7000, 101, c{"FlowOpened": 1, "MatchRtt": 1})),
		rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 101}},
		flows: opened,
		check: func(t *testing.T, m *Monitor, _ time.Duration) {
			if n := countEntries(t, m); n != 2 {
				t.Errorf("%d identifiers left in pkt_ts, want 2 (102, 103)", n)
			}
		},
	}}
}

func TestFixtures(t *testing.T) { runFixtureGroups(t, nil) }

// TestFixturesGeneralPath runs every fixture with the fast path off (ident.h's
// pp_fast_tcp): each TCP packet it would take goes through parse_pkt() and pp_identify(),
// and every counter, sample and event must come out the same.
func TestFixturesGeneralPath(t *testing.T) {
	runFixtureGroups(t, func(c *Config) { c.noFastPath = true })
}

func runFixtureGroups(t *testing.T, mod func(*Config)) {
	groups := []struct {
		name string
		fxs  func(fam) []fixture
	}{{"tcp", tcpFixtures}, {"retire", retireFixtures}, {"icmp", icmpFixtures}, {"dns", dnsFixtures}, {"udp", udpFixtures}, {"quic", quicFixtures}}
	cache := newMonitorCache(t)
	for _, g := range groups {
		for _, f := range []fam{v4, v6} {
			for _, fx := range g.fxs(f) {
				fx.cache = cache
				if mod != nil {
					cfg := fx.cfg
					fx.cfg = func(c *Config) {
						if cfg != nil {
							cfg(c)
						}
						mod(c)
					}
				}
				t.Run(g.name+"/"+f.String()+"/"+fx.name, fx.runAllHooks)
			}
		}
	}
}

// TestFixturesHostACKs: an endpoint receiving data (B sends, A is this host). A's pure ACKs
// at egress carry a socket (BPF_PROG_TEST_RUN provides one) and are timed with HostACKs; the
// echo of one counts only if B sent something after A's last ACK with that TSval. Steps run
// as written (mirrored, the ACKs would reach ingress, where no socket marks them).
func TestFixturesHostACKs(t *testing.T) {
	cache := newMonitorCache(t)
	for _, f := range []fam{v4, v6} {
		fromA, fromB := f.flowStr(false, portA, portB), f.flowStr(true, portB, portA)
		ack := uint8(pktbuild.ACK)
		start := []step{
			in(f.tcp(false, flagData, 100, 0, 10), c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
			eg(f.tcp(true, ack, 7000, 100, 0), c{"TsNotNew": 1, "FlowOpened": 1, "MatchNone": 1}),
			eg(f.tcp(true, ack, 7001, 100, 0), c{"TsStored": 1, "MatchNone": 1}),
		}
		opened := []wantFlow{{fromA, FlowOpening, ReasonFirstPacket, SourceDest}, {fromB, FlowOpening, ReasonFirstPacket, SourceDest}}
		hostACKs := func(c *Config) { c.HostACKs = true }
		for _, fx := range []fixture{{
			name: "echo after the sender paused: discarded",
			cfg:  hostACKs,
			steps: append(slices.Clone(start),
				in(f.tcp(false, flagData, 101, 7001, 10), c{"TsStored": 1, "FlowOpened": 1, "MatchAckIdle": 1})),
			flows: opened,
		}, {
			name: "echo while the sender keeps sending: a sample",
			cfg:  hostACKs,
			steps: append(slices.Clone(start),
				in(f.tcp(false, flagData, 101, 7000, 10), c{"TsStored": 1, "FlowOpened": 1, "MatchMiss": 1}),
				in(f.tcp(false, flagData, 102, 7001, 10), c{"TsStored": 1, "MatchRtt": 1})),
			rtts:  []wantRTT{{flow: fromB, proto: "TCP", id: 7001, idType: IDTCPTimestamp}},
			flows: opened,
		}, {
			name:  "pure ACK at ingress: not timed",
			cfg:   hostACKs,
			steps: []step{in(f.tcp(false, ack, 5, 0, 0), c{"MatchNone": 1})},
		}, {
			name: "host ACKs off: pure ACKs not timed",
			steps: []step{
				in(f.tcp(false, flagData, 100, 0, 10), c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
				eg(f.tcp(true, ack, 7000, 100, 0), c{"FlowOpened": 1, "MatchNone": 1}),
				eg(f.tcp(true, ack, 7001, 100, 0), c{"MatchNone": 1}),
			},
			flows: opened[:1],
		}} {
			fx.cache = cache
			for _, hook := range []IngressHook{IngressTC, IngressXDP} {
				t.Run(f.String()+"/"+fx.name+"/"+hook.String(), fx.variant(hook, false).run)
			}
		}
	}
}

func TestMalformed(t *testing.T) {
	tcp := v4.tcp(true, flagData, 100, 50, 10)
	badDoff := v4.ip(true).TCP(pktbuild.TCP{Src: 1, Dst: 2, DataOffset: new(int)}).Build()
	laterFrag := pktbuild.New().IPv4(pktbuild.IPv4{Src: addrA4, Dst: addrB4, FragOffset: 8}).TCP(pktbuild.TCP{Src: 1, Dst: 2}).Build()
	arp := pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build()
	five := 5
	notIPv4 := pktbuild.New().IPv4(pktbuild.IPv4{Version: &five}).UDP(pktbuild.UDP{Src: 1, Dst: 2}).Build()
	other := v4.ip(true).Proto(47).Payload(make([]byte, 20)).Build() // GRE
	fixture{name: "malformed", cache: newMonitorCache(t), steps: []step{
		eg(pktbuild.Truncate(tcp, len(tcp)-20), c{"ParseErr[14]": 1}), // options cut off
		eg(badDoff, c{"ParseErr[14]": 1}),
		eg(laterFrag, c{"ParseErr[11]": 1}),
		eg(arp, c{"ParseErr[4]": 1}),
		eg(notIPv4, c{"ParseErr[5]": 1}),
		eg(other, c{"SkipProto": 1}),
	}}.runAllHooks(t)
}

func TestMapFull(t *testing.T) {
	small := func(c *Config) { c.MaxFlows = 2 }
	t.Run("flows", fixture{cfg: small, steps: []step{
		eg(v4.echo(true, 1, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
		eg(v4.echo(true, 2, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
		eg(v4.echo(true, 3, 1, -1), c{"FlowMapFull": 1}),
		eg(v4.echo(true, 4, 1, -1), c{"FlowMapFull": 1}), // counted again, warned once
	}, full: []string{"flow"}}.runEachIngress)
	t.Run("timestamps", fixture{cfg: small, steps: []step{ // pkt_ts holds 2 x 2
		eg(v4.echo(true, 1, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
		eg(v4.echo(true, 1, 2, -1), c{"TsStored": 1}),
		eg(v4.echo(true, 1, 3, -1), c{"TsStored": 1}),
		eg(v4.echo(true, 1, 4, -1), c{"TsStored": 1}),
		eg(v4.echo(true, 1, 5, -1), c{"TsMapFull": 1}),
	}, full: []string{"timestamp"}}.runEachIngress)
}

func TestAggregation(t *testing.T) {
	for _, hook := range []IngressHook{IngressTC, IngressXDP} {
		t.Run(hook.String(), func(t *testing.T) { testAggregation(t, hook) })
	}
}

// subnetWant is one subnet's expected report: its traffic and how many RTTs.
// subnetWant is one subnet's expected traffic and RTT count; key is its prefix and side as
// the standard output names them ("192.0.2.0/24 local").
type subnetWant struct {
	key    string
	rx, tx Traffic
	rtts   uint64
}

func other(pkts ...[]byte) Traffic {
	t := Traffic{OtherPkts: uint64(len(pkts))}
	for _, p := range pkts {
		t.OtherBytes += uint64(len(p))
	}
	return t
}

// testAggregation: every packet is counted under its remote endpoint's subnet and its local
// one's, rx when it arrived and tx when it left, so A's requests and B's replies stay apart;
// a sample goes to the reply source's subnet on the side it came from.
func testAggregation(t *testing.T, hook IngressHook) {
	// Room for one subnet per family and buffer, plus "other" on each side: A's on the
	// local side and B's on the remote one fill it.
	m := loadFixture(t, func(c *Config) { c.Aggregate = time.Hour; c.MaxSubnets = 1; c.IngressHook = hook })
	addrC := netip.MustParseAddr("203.0.113.9")
	echo := func(src, dst netip.Addr, typ uint8, id uint16) []byte {
		return pktbuild.New().IPv4(pktbuild.IPv4{Src: src, Dst: dst}).ICMP(pktbuild.ICMP{Type: typ, ID: id, Seq: 1}).Build()
	}
	req4, rep4 := v4.echo(true, 1, 1, -1), v4.echo(false, 1, 1, -1)
	req6, rep6 := v6.echo(true, 1, 1, -1), v6.echo(false, 1, 1, -1)
	tcpTS, tcpNoTS := v4.tcp(true, flagData, 100, 50, 10), v4.tcp(true, flagData, -1, 0, 10)
	udpToC := pktbuild.New().IPv4(pktbuild.IPv4{Src: addrA4, Dst: addrC}).UDP(pktbuild.UDP{Src: 1, Dst: 7777}).Payload(make([]byte, 20)).Build()
	arp := pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build()
	steps := []step{
		eg(req4, c{"FlowCreated": 1, "TsStored": 1}),
		in(rep4, c{"FlowOpened": 1, "MatchRtt": 1}),
		eg(req6, c{"FlowCreated": 1, "TsStored": 1}),
		in(rep6, c{"FlowOpened": 1, "MatchRtt": 1}),
		// TCP with and without the timestamp option.
		eg(tcpTS, c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
		eg(tcpNoTS, c{"SkipNoTcpTs": 1}),
		// Unmeasurable traffic creates no subnet: C's share goes to the remote "other"
		// (A's to its existing entry).
		eg(udpToC, c{"SkipProto": 1}),
		// Not IP: no subnet at all.
		in(arp, c{"ParseErr[4]": 1}),
	}
	runSteps(t, m, steps)
	rep, err := m.CollectAggregate()
	if err != nil {
		t.Fatal(err)
	}
	tcp := Traffic{TcpTsPkts: 1, TcpTsBytes: uint64(len(tcpTS)), TcpNotsPkts: 1, TcpNotsBytes: uint64(len(tcpNoTS))}
	aTx, bTx := other(req4, udpToC), other(req4)
	aTx.add(&tcp)
	bTx.add(&tcp)
	checkReport(t, rep, []subnetWant{
		{"192.0.2.0/24 local", other(rep4), aTx, 0},
		{"198.51.100.0/24 remote", other(rep4), bTx, 1},
		{"2001:db8::/48 local", other(rep6), other(req6), 0},
		{"2001:db8:1::/48 remote", other(rep6), other(req6), 1},
		{"0.0.0.0/0 remote", Traffic{}, other(udpToC), 0},
	})

	// The kernel wrote the other buffer meanwhile (nothing); the first is cleared.
	if rep, err = m.CollectAggregate(); err != nil || len(rep.Subnets) != 0 {
		t.Fatalf("second report %+v, %v; want empty", rep, err)
	}
	// Measured traffic creates its subnets; C's and D's do not fit: their packets and
	// their RTTs land in the remote "other", each failed creation counted.
	addrD := netip.MustParseAddr("100.64.0.1")
	reqC, repC := echo(addrA4, addrC, 8, 3), echo(addrC, addrA4, 0, 3)
	reqD, repD := echo(addrA4, addrD, 8, 4), echo(addrD, addrA4, 0, 4)
	clearMap(t, m.objs.Flows, new(ppingPpFlowState))
	runSteps(t, m, []step{
		eg(req4, c{"FlowCreated": 1, "TsStored": 1}),
		in(rep4, c{"FlowOpened": 1, "MatchRtt": 1}),
		eg(reqC, c{"FlowCreated": 1, "TsStored": 1, "AggMapFull": 1}),
		in(repC, c{"FlowOpened": 1, "MatchRtt": 1, "AggMapFull": 2}), // its source, then its RTT
		eg(reqD, c{"FlowCreated": 1, "TsStored": 1, "AggMapFull": 1}),
		in(repD, c{"FlowOpened": 1, "MatchRtt": 1, "AggMapFull": 2}),
	})
	if rep, err = m.CollectAggregate(); err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, []subnetWant{
		{"100.64.0.0/24 remote", Traffic{}, Traffic{}, 0}, // absent: listed to say so
		{"203.0.113.0/24 remote", Traffic{}, Traffic{}, 0},
		{"192.0.2.0/24 local", other(rep4, repC, repD), other(req4, reqC, reqD), 0},
		{"198.51.100.0/24 remote", other(rep4), other(req4), 1},
		{"0.0.0.0/0 remote", other(repC, repD), other(reqC, reqD), 2},
	})
	if evs := drain(t, m); len(evs) != 0 {
		t.Errorf("aggregation mode sent %d events, want none: %v", len(evs), evs)
	}
}

// TestAggregationOneSubnet: a download between two hosts of one subnet, seen on the
// client's interface. The data arriving and the ACKs leaving are counted apart, under the
// server's subnet as remote and the client's (the same /24) as local: nothing folds the two
// directions into one figure.
func TestAggregationOneSubnet(t *testing.T) {
	m := loadFixture(t, func(c *Config) { c.Aggregate = time.Hour; c.AggPrefixV4 = 24 })
	client, server := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	seg := func(fromServer bool, tsval, tsecr uint32, payload int) []byte {
		src, dst, h := client, server, pktbuild.TCP{Src: 40000, Dst: 80, Flags: pktbuild.ACK}
		if fromServer {
			src, dst, h.Src, h.Dst = server, client, 80, 40000
		}
		h.Options = slices.Concat(pktbuild.OptNOP(), pktbuild.OptNOP(), pktbuild.OptTimestamp(tsval, tsecr))
		return pktbuild.New().IPv4(pktbuild.IPv4{Src: src, Dst: dst}).TCP(h).Payload(make([]byte, payload)).Build()
	}
	data1, data2 := seg(true, 1000, 50, 1400), seg(true, 1001, 50, 1400)
	ack := seg(false, 51, 1001, 0)
	runSteps(t, m, []step{
		in(data1, c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
		in(data2, c{"TsStored": 1, "MatchNone": 1}),
		eg(ack, c{"FlowOpened": 1, "MatchRtt": 1}),
	})
	rep, err := m.CollectAggregate()
	if err != nil {
		t.Fatal(err)
	}
	data := Traffic{TcpTsPkts: 2, TcpTsBytes: uint64(len(data1) + len(data2))}
	acks := Traffic{TcpTsPkts: 1, TcpTsBytes: uint64(len(ack))}
	checkReport(t, rep, []subnetWant{
		// The sample's reply (the ACK) left through egress from the client: local side.
		{"192.0.2.0/24 remote", data, acks, 0},
		{"192.0.2.0/24 local", data, acks, 1},
	})
}

// checkReport checks every subnet's traffic exactly and its RTTs: the count, and a single
// sample in the kernel bucket Go computes for it. A want entry without traffic or RTTs
// must be absent from the report.
func checkReport(t *testing.T, rep *AggReport, want []subnetWant) {
	t.Helper()
	got := map[string]SubnetStats{}
	for _, s := range rep.Subnets {
		got[s.name()+" "+s.Side.String()] = s
	}
	for _, w := range want {
		s, ok := got[w.key]
		delete(got, w.key)
		if w.rx.Packets() == 0 && w.tx.Packets() == 0 && w.rtts == 0 {
			if ok {
				t.Errorf("%s reported (%+v), want absent", w.key, s)
			}
			continue
		}
		if !ok {
			t.Errorf("%s missing from the report", w.key)
			continue
		}
		if s.Rx != w.rx || s.Tx != w.tx {
			t.Errorf("%s: rx %+v tx %+v, want rx %+v tx %+v", w.key, s.Rx, s.Tx, w.rx, w.tx)
		}
		if s.Count != w.rtts {
			t.Errorf("%s: %d RTTs, want %d", w.key, s.Count, w.rtts)
		} else if s.Count == 1 && (s.Min != s.Max || s.Sum != s.Min || s.Bins[HistLayout.Bucket(s.Min)] != 1) {
			t.Errorf("%s: min %d max %d sum %d, bucket %d holds %d; want one sample in its bucket",
				w.key, s.Min, s.Max, s.Sum, HistLayout.Bucket(s.Min), s.Bins[HistLayout.Bucket(s.Min)])
		}
	}
	for name := range got {
		t.Errorf("unexpected subnet %s in the report", name)
	}
}

func TestGC(t *testing.T) {
	expireAll := func(c *Config) {
		c.CleanupInterval = time.Second
		c.TSMinLifetime, c.TSMaxLifetime = 1, 1
		c.DgramLifetime, c.UnopenedLifetime, c.FlowLifetime = 1, 1, 1
	}
	fromB := v4.flowStr(true, 7, 7)
	gc := func(t *testing.T, m *Monitor) []*FlowEvent {
		advance(t, m, time.Second) // past every lifetime
		var evs []*FlowEvent
		d, err := bpftest.Delta(readCounters(m), func() (err error) {
			evs, err = m.RunGC()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if d := d.Diff(c{"3.GcTsExpired": 1, "3.GcFlowExpired": 1}); d != "" {
			t.Errorf("GC counter changes (got, want):\n%s", d)
		}
		if n, f := countEntries(t, m), countFlows(t, m); n != 0 || f != 0 {
			t.Errorf("after GC: %d identifiers, %d flows; want none", n, f)
		}
		if evs := drain(t, m); len(evs) != 0 {
			t.Errorf("GC wrote %d events to the ring buffer, want none (it returns them): %v", len(evs), evs)
		}
		return evs
	}
	t.Run("unanswered request", fixture{cfg: expireAll, steps: []step{
		eg(v4.echo(true, 7, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
	}, check: func(t *testing.T, m *Monitor, _ time.Duration) {
		if evs := gc(t, m); len(evs) != 0 {
			t.Errorf("GC events %v, want none (the flow never opened)", evs)
		}
	}}.runEachIngress)
	t.Run("open flow times out", fixture{cfg: expireAll, steps: []step{
		eg(v4.echo(true, 7, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
		in(v4.echo(false, 7, 1, -1), c{"FlowOpened": 1, "MatchRtt": 1}),
		eg(v4.echo(true, 7, 2, -1), c{"TsStored": 1}),
	}, rtts: []wantRTT{{flow: fromB, proto: "ICMP", id: 1}},
		flows: []wantFlow{{fromB, FlowOpening, ReasonFirstPacket, SourceDest}},
		check: func(t *testing.T, m *Monitor, _ time.Duration) {
			evs := gc(t, m)
			if len(evs) != 1 {
				t.Fatalf("%d events from GC, want 1 flow closing: %v", len(evs), evs)
			}
			if e := evs[0]; e.Flow.String() != fromB || e.Type != FlowClosing || e.Reason != ReasonTimeout || e.Source != SourceGC {
				t.Errorf("GC event %+v, want %s closing due to flow timeout from garbage collection", e, fromB)
			}
		}}.runEachIngress)
	t.Run("nothing stale", fixture{cfg: func(c *Config) { c.CleanupInterval = time.Second }, steps: []step{
		eg(v4.echo(true, 7, 1, -1), c{"FlowCreated": 1, "TsStored": 1}),
	}, check: func(t *testing.T, m *Monitor, _ time.Duration) {
		d, err := bpftest.Delta(readCounters(m), func() error { _, err := m.RunGC(); return err })
		if err != nil {
			t.Fatal(err)
		}
		if d := d.Diff(c{}); d != "" {
			t.Errorf("GC removed fresh state:\n%s", d)
		}
	}}.runEachIngress)
}

func onlyFlow(t *testing.T, m *Monitor) ppingPpFlowState {
	t.Helper()
	var k ppingPpTuple
	var v ppingPpFlowState
	it := m.objs.Flows.Iterate()
	n := 0
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil || n != 1 {
		t.Fatalf("flows: %d entries (%v), want 1", n, err)
	}
	return v
}

func countFlows(t *testing.T, m *Monitor) int {
	t.Helper()
	var k ppingPpTuple
	var v ppingPpFlowState
	return count(t, m.objs.Flows.Iterate(), &k, &v)
}

func countEntries(t *testing.T, m *Monitor) int {
	t.Helper()
	var k ppingPpPktId
	var v uint64
	return count(t, m.objs.PktTs.Iterate(), &k, &v)
}

func count(t *testing.T, it interface {
	Next(k, v any) bool
	Err() error
}, k, v any) int {
	t.Helper()
	n := 0
	for it.Next(k, v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate: %v", err)
	}
	return n
}
