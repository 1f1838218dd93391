package hedge

// Fixtures for the BPF_PROG_TEST_RUN tests in bpf_test.go: a hedger collection loaded and
// filled exactly as Start does it (Hedger.load, Hedger.fillMaps), with its clock fixed
// (bpftest.FixClock: every run reads the fixture's time, so deadlines are exact), a
// namespace to run it in, packets, scoreboard keys, and the hedger's Runner for bpftest's
// tables: verdict, output packet, skb mark, counter changes and the scoreboard after each
// case.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/vishvananda/netlink"
)

// Scoreboard states (enum req_state in bpf/include/hedge.h, through bpf2go).
const (
	reqPending       = uint32(hedgeReqStateREQ_PENDING)
	reqNoClone       = uint32(hedgeReqStateREQ_NOCLONE)
	reqNoHedge       = uint32(hedgeReqStateREQ_NOHEDGE)
	reqHedged        = uint32(hedgeReqStateREQ_HEDGED)
	reqAnswered      = uint32(hedgeReqStateREQ_ANSWERED)
	reqAnsweredHedge = uint32(hedgeReqStateREQ_ANSWERED_HEDGED)
	reqRefused       = uint32(hedgeReqStateREQ_REFUSED)
)

var stateNames = map[uint32]string{
	0: "absent", reqPending: "PENDING", reqNoClone: "NOCLONE", reqNoHedge: "NOHEDGE",
	reqHedged: "HEDGED", reqAnswered: "ANSWERED", reqAnsweredHedge: "ANSWERED_HEDGED", reqRefused: "REFUSED",
}

// The clients and services of every fixture. Replicas sit on other ports than their
// service so a hedge or a rewritten response changes address and port.
var (
	client4  = netip.MustParseAddrPort("192.0.2.1:40000")
	client6  = netip.MustParseAddrPort("[2001:db8::1]:40000")
	svc4     = netip.MustParseAddrPort("198.51.100.10:9999")
	rep4     = netip.MustParseAddrPort("198.51.100.11:9998")
	svc6     = netip.MustParseAddrPort("[2001:db8::10]:9999")
	rep6     = netip.MustParseAddrPort("[2001:db8::11]:9998")
	svcLE    = netip.MustParseAddrPort("198.51.100.20:7777") // 8-byte little-endian id at offset 2
	svcSolo  = netip.MustParseAddrPort("198.51.100.30:5353") // no replica: hedges to itself
	svcRR    = netip.MustParseAddrPort("198.51.100.40:6000") // two replicas: round robin
	repRR1   = netip.MustParseAddrPort("198.51.100.41:6000")
	repRR2   = netip.MustParseAddrPort("198.51.100.42:6001")
	svcWin   = netip.MustParseAddrPort("198.51.100.50:7000") // window budget
	repWin   = netip.MustParseAddrPort("198.51.100.51:7000")
	stranger = netip.MustParseAddrPort("203.0.113.9:9999") // no service, no replica
	// The stored path (store_test.go): default store limit, two replicas besides the service.
	svcSt4 = netip.MustParseAddrPort("198.51.100.60:8000")
	repSt1 = netip.MustParseAddrPort("198.51.100.61:8000")
	repSt2 = netip.MustParseAddrPort("198.51.100.62:8001")
	svcSt6 = netip.MustParseAddrPort("[2001:db8::60]:8000")
	repSt6 = netip.MustParseAddrPort("[2001:db8::61]:8000")
	// The hedgeable rule (hedgeable_test.go): the presets and a generic service's own rule.
	svcDNS  = netip.MustParseAddrPort("198.51.100.70:53")
	repDNS  = netip.MustParseAddrPort("198.51.100.71:53")
	svcMC   = netip.MustParseAddrPort("198.51.100.80:11211")
	repMC   = netip.MustParseAddrPort("198.51.100.81:11211")
	svcRule = netip.MustParseAddrPort("198.51.100.90:9000")
)

// Service indices in testConfig (the stats/svc_cfgs slot).
const (
	sV4 = iota
	sV6
	sLE
	sSolo
	sRR
	sWin
	sSt4
	sSt6
	sDNS
	sMC
	sRule
)

const (
	testDelay = 10 * time.Millisecond
	// storeDelay: the stored path's services' delay (a cutoff of one delay, far above the
	// 50 ms floor).
	storeDelay = time.Second
	// Delay-line period: the rescuer sends a clone due within half of it (cfg_early_ns).
	testPeriod = 2 * time.Millisecond
	testEarly  = testPeriod / 2
	// v4 budget: 0.5 hedges per request (500 milli-tokens deposited per request), burst 2.
	v4Ratio = 0.5
	v4Burst = 2
	// win: window budget, 0.5 hedges per request over the window, floor 1.
	winRatio = 0.5
	winBurst = 1
)

// testConfig declares the fixtures' services; Validate fills the defaults Start would.
func testConfig(tb testing.TB, scoreboard uint32) *Config {
	tb.Helper()
	cfg := &Config{
		Interface:      "test0", // not looked up: the fixture sets the ifindexes itself
		ScoreboardSize: scoreboard,
		DelayLine:      DelayLineConfig{Period: Duration(testPeriod)},
		Services: []ServiceConfig{
			{Name: "v4", StoreLimit: ptr(0), Address: svc4.String(), Replicas: []string{rep4.String()},
				Delay: DelaySpec{Fixed: testDelay}, Budget: BudgetSpec{Mode: BudgetBucket, Ratio: v4Ratio, Burst: v4Burst}},
			{Name: "v6", StoreLimit: ptr(0), Address: svc6.String(), Replicas: []string{rep6.String()},
				Delay: DelaySpec{Fixed: testDelay}, Budget: BudgetSpec{Mode: BudgetBucket, Ratio: 1, Burst: 10}},
			{Name: "le8", StoreLimit: ptr(0), Address: svcLE.String(), RequestID: RequestIDSpec{Offset: 2, Length: 8, Order: "little"},
				Delay: DelaySpec{Fixed: testDelay}, Budget: BudgetSpec{Mode: BudgetBucket, Ratio: 1, Burst: 10}},
			{Name: "solo", StoreLimit: ptr(0), Address: svcSolo.String(),
				Delay: DelaySpec{Fixed: testDelay}, Budget: BudgetSpec{Mode: BudgetBucket, Ratio: 1, Burst: 10}},
			{Name: "rr", StoreLimit: ptr(0), Address: svcRR.String(), Replicas: []string{repRR1.String(), repRR2.String()},
				Delay: DelaySpec{Fixed: testDelay}, Budget: BudgetSpec{Mode: BudgetBucket, Ratio: 1, Burst: 10}},
			// The window budget: 0.5 hedges per request, floor 1.
			{Name: "win", StoreLimit: ptr(0), Address: svcWin.String(), Replicas: []string{repWin.String()},
				Delay: DelaySpec{Fixed: testDelay}, Budget: BudgetSpec{Mode: BudgetWindow, Ratio: winRatio, Burst: winBurst}},
			// The stored path: store_limit left to its default.
			{Name: "st4", Address: svcSt4.String(), Replicas: []string{repSt1.String(), repSt2.String()},
				Delay: DelaySpec{Fixed: storeDelay}, Budget: BudgetSpec{Mode: BudgetWindow, Ratio: 1, Burst: 10}},
			{Name: "st6", Address: svcSt6.String(), Replicas: []string{repSt6.String()},
				Delay: DelaySpec{Fixed: storeDelay}, Budget: BudgetSpec{Mode: BudgetWindow, Ratio: 1, Burst: 10}},
			// The presets, with their default ports, and a rule's edges: byte 3's low
			// nibble 5, or 8 bytes at 4 (the longest a rule compares).
			{Name: "dns", StoreLimit: ptr(0), Protocol: ProtocolDNS, Address: svcDNS.Addr().String(), Replicas: []string{repDNS.Addr().String()},
				Delay: DelaySpec{Fixed: testDelay}},
			{Name: "mc", StoreLimit: ptr(0), Protocol: ProtocolMemcachedUDP, Address: svcMC.Addr().String(), Replicas: []string{repMC.Addr().String()},
				Delay: DelaySpec{Fixed: testDelay}},
			{Name: "rule", StoreLimit: ptr(0), Address: svcRule.String(), Delay: DelaySpec{Fixed: testDelay},
				RequestID: RequestIDSpec{Offset: 1, Length: 2},
				Hedgeable: []HedgeRule{{Offset: 3, Value: []byte{0x05}, Mask: []byte{0x0f}}, {Offset: 4, Value: []byte("ABCDEFGH")}}},
		},
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatalf("validate test config: %v", err)
	}
	return cfg
}

// fixture is a loaded, filled hedger collection and the namespace its programs run in.
//
// BPF_PROG_TEST_RUN runs a TC program on an skb of the calling thread's namespace, and
// bpf_clone_redirect looks its target up there, so every run happens inside ns: the
// splitter's delay-line ifindex is a real veth (bt0, peer bt1) in it, and a clone really
// leaves (bt1 receives it and drops it: not addressed to it). bpf_redirect and
// bpf_redirect_neigh only record their target, which the test run never uses, so the
// other ifindexes (out, delay-line peer and device) name no device anywhere.
type fixture struct {
	h    *Hedger
	objs *hedgeObjects
	ns   *netnsx.Netns
	// ifindexes the programs were loaded with
	dlIfx, outIfx, peerIfx, devIfx int
	// now is the time the programs read (kedge_now) in runs outside a table (f.run); a
	// table's cases run at now0, where now starts too.
	now uint64
}

type fixtureOpts struct {
	scoreboard  uint32        // scoreboard max_entries; 0: the default
	backend     string        // delay-line backend the constants are set for; "": conveyor
	missingDLIf bool          // point cfg_dl_ifindex at an ifindex that does not exist
	noCarry     bool          // the hedger without a clone path (hedge_config.no_carry)
	events      bool          // the event stream on (hedge_config.events)
	realClock   bool          // the programs read the kernel's clock, as in production (cost benchmarks)
	tick        time.Duration // the timer's period (adaptive delay, scoreboard expiry); 0: the default
}

// Fake ifindexes: far above anything a fresh namespace allocates; checked to be absent.
const (
	fakeMissingIfx = 0x7e5700
	fakeOutIfx     = 0x7e5701
	fakePeerIfx    = 0x7e5702
	fakeDevIfx     = 0x7e5703
)

var fixtureSeq atomic.Int32

func newFixture(tb testing.TB, o fixtureOpts) *fixture {
	tb.Helper()
	bpftest.RequireRoot(tb)
	if err := checkKernel(); err != nil {
		tb.Skipf("hedger: %v", err)
	}
	if o.backend == "" {
		o.backend = BackendConveyor
	}
	f := &fixture{outIfx: fakeOutIfx, peerIfx: fakePeerIfx, devIfx: fakeDevIfx, now: now0}
	ns, err := netnsx.New(netnsx.OwnedName(fmt.Sprintf("hbpf%d", fixtureSeq.Add(1))))
	if err != nil {
		tb.Fatalf("create test namespace: %v", err)
	}
	f.ns = ns
	tb.Cleanup(func() {
		if err := ns.Close(); err != nil {
			tb.Errorf("remove test namespace: %v", err)
		}
	})
	if f.dlIfx, err = vethIn(ns); err != nil {
		tb.Fatal(err)
	}
	if o.missingDLIf {
		f.dlIfx = fakeMissingIfx
	}
	if err := absentIn(ns, fakeMissingIfx, fakeOutIfx, fakePeerIfx, fakeDevIfx); err != nil {
		tb.Fatal(err)
	}

	// Load exactly as Start does: Hedger.load sets the constants from the delay line and
	// the config, Hedger.fillMaps writes the services.
	f.h = &Hedger{
		Config:   testConfig(tb, o.scoreboard),
		Backend:  o.backend,
		IfIndex:  f.outIfx,
		pacerCli: pacer.Client{Config: fixturePacerConfig(o.backend, f)},
		noCarry:  o.noCarry,
		events:   o.events,
		prepare:  bpftest.FixClock,
	}
	if o.realClock {
		f.h.prepare = nil
	}
	if o.tick != 0 {
		f.h.Config.Tick = Duration(o.tick)
	}

	if err := f.h.load(); err != nil {
		var le *bpfx.LoadError
		if errors.As(err, &le) {
			tb.Log(le.Full())
		}
		tb.Fatalf("load hedger: %v", err)
	}
	f.objs = &f.h.objs
	tb.Cleanup(func() { f.objs.Close() })
	f.reset(tb)
	return f
}

// vethIn creates the veth pair bt0/bt1 in ns, both up, and returns bt0's ifindex.
func vethIn(ns *netnsx.Netns) (int, error) {
	nh, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		return 0, fmt.Errorf("open netlink in %s: %w", ns.Name, err)
	}
	defer nh.Close()
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bt0"}, PeerName: "bt1"}); err != nil {
		return 0, fmt.Errorf("add veth bt0/bt1: %w", err)
	}
	var ifx int
	for _, name := range []string{"bt1", "bt0"} {
		l, err := nh.LinkByName(name)
		if err != nil {
			return 0, fmt.Errorf("find %s: %w", name, err)
		}
		// No IPv6 link-local address, so no MLD report or router solicitation leaves bt0
		// and the tests' packet counts see only what the programs sent (a 6.1 guest once
		// counted 2 packets for one clone). The delay line does the same.
		if err := nh.LinkSetIP6AddrGenMode(l, 1 /* IN6_ADDR_GEN_MODE_NONE */); err != nil {
			return 0, fmt.Errorf("set %s addr_gen_mode none: %w", name, err)
		}
		if err := nh.LinkSetUp(l); err != nil {
			return 0, fmt.Errorf("set %s up: %w", name, err)
		}
		ifx = l.Attrs().Index
	}
	return ifx, nil
}

// dlTxPackets reads how many packets the delay-line veth (bt0) has sent.
func (f *fixture) dlTxPackets(tb testing.TB) uint64 {
	tb.Helper()
	nh, err := netlink.NewHandleAt(f.ns.Handle)
	if err != nil {
		tb.Fatalf("open netlink in %s: %v", f.ns.Name, err)
	}
	defer nh.Close()
	l, err := nh.LinkByIndex(f.dlIfx)
	if err != nil {
		tb.Fatalf("find the delay-line veth: %v", err)
	}
	return l.Attrs().Statistics.TxPackets
}

func absentIn(ns *netnsx.Netns, ifxs ...int) error {
	nh, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in %s: %w", ns.Name, err)
	}
	defer nh.Close()
	for _, ifx := range ifxs {
		if l, err := nh.LinkByIndex(ifx); err == nil {
			return fmt.Errorf("fake ifindex %d exists in %s (%s): pick another", ifx, ns.Name, l.Attrs().Name)
		}
	}
	return nil
}

// reset empties the scoreboard, the latency and precision histograms and the store rings,
// and rewrites the services (fillMaps: full budget, round robin and histogram slot
// back to 0). Counters are not reset: cases assert their changes.
func (f *fixture) reset(tb testing.TB) {
	tb.Helper()
	for k := range f.board(tb) {
		if err := f.objs.Scoreboard.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			tb.Fatalf("clear scoreboard: %v", err)
		}
	}
	var zero hedgeKhist
	for i := range f.h.Config.Services {
		for s := 0; s <= histSlots; s++ {
			if err := f.objs.LatHist.Put(uint32(i*(histSlots+1)+s), zero); err != nil {
				tb.Fatalf("clear lat_hist: %v", err)
			}
		}
		for s := 0; s < 2; s++ {
			if err := f.objs.DlPrecision.Put(uint32(i*2+s), zero); err != nil {
				tb.Fatalf("clear dl_precision: %v", err)
			}
		}
	}
	f.resetStore(tb)
	if err := f.h.fillMaps(); err != nil {
		tb.Fatalf("fill maps: %v", err)
	}
}

// counters reads the stats map as "<service name>.<Field>" ("global.<Field>" for slot
// SVC_MAX) and dl_counters as "dl.<Field>". The conveyor period statistics (sum, min, max)
// are left out: they depend on the clock, and the delay-line test checks them itself.
func (f *fixture) counters() (bpftest.Counters, error) {
	st, err := bpftest.SumPerCPU[hedgeHedgeStats](f.objs.Stats)
	if err != nil {
		return nil, err
	}
	out := bpftest.Counters{}
	for k, v := range st {
		slot, field, _ := strings.Cut(k, ".")
		out[f.slotName(slot)+"."+field] = v
	}
	dl, err := bpftest.SumPerCPU[pacer.RawStats](f.objs.PacerCounters)
	if err != nil {
		return nil, err
	}
	for k, v := range dl {
		switch {
		case strings.HasSuffix(k, "Ns"), strings.HasPrefix(k, "LateHist"): // clock values, not counts
			continue
		}
		out["dl."+k] = v
	}
	return out, nil
}

func (f *fixture) slotName(slot string) string {
	if slot == fmt.Sprint(svcMax) {
		return "global"
	}
	for i, s := range f.h.Config.Services {
		if slot == fmt.Sprint(i) {
			return s.Name
		}
	}
	return "slot" + slot
}

// fixturePacerConfig is pacer_cfg as a pacer would set it, on fixture devices: carried
// packets enter through the peer, which BPF_PROG_TEST_RUN's loopback (ifindex 1) stands
// for; tick requests (the stored path's) leave through the delay-line veth too.
func fixturePacerConfig(backend string, f *fixture) pacer.Config {
	c := pacer.Config{Backend: pacer.BackendID(backend), Ifindex: uint32(f.dlIfx), PeerIfindex: 1,
		TickIfindex: uint32(f.dlIfx), TickPeerIfindex: fakePeerIfx, DevIfindex: uint32(f.devIfx),
		TickBytes: 128, LostNs: uint64(time.Second)}
	if backend != BackendEDT {
		c.EarlyNs, c.CarryEarlyNs = uint64(testEarly), uint64(testEarly)
	}
	return c
}

// skBuff is the TC context BPF_PROG_TEST_RUN takes in and writes back out.
type skBuff = bpftest.SkBuff

// run test-runs prog once inside the fixture's namespace at the fixture's time (f.now), with
// skb->mark = mark.
func (f *fixture) run(prog *ebpf.Program, in []byte, mark uint32) (bpftest.Result, error) {
	return f.runAt(prog, in, mark, nil)
}

// runAt is run with prepare(f.now), if not nil, called right before it: entries written
// relative to the time the run reads.
func (f *fixture) runAt(prog *ebpf.Program, in []byte, mark uint32, prepare func(now uint64) error) (bpftest.Result, error) {
	return f.runCtx(prog, in, skBuff{Mark: mark}, prepare)
}

// runCtx is runAt with the whole context going in (skb->mark, tstamp).
func (f *fixture) runCtx(prog *ebpf.Program, in []byte, ctx skBuff, prepare func(now uint64) error) (bpftest.Result, error) {
	r := bpftest.Result{Now: f.now}
	if prepare != nil {
		if err := prepare(f.now); err != nil {
			return r, err
		}
	}
	if err := f.objs.KedgeClockNs.Set(f.now); err != nil {
		return r, fmt.Errorf("set the clock: %w", err)
	}
	opts := ebpf.RunOptions{
		Data:       in,
		DataOut:    make([]byte, len(in)+bpftest.OutPad),
		Context:    ctx,
		ContextOut: &r.Skb,
	}
	err := f.ns.Do(func() (err error) {
		r.Ret, err = prog.Run(&opts)
		return err
	})
	if err != nil {
		return r, fmt.Errorf("test-run %s: %w", prog, err)
	}
	r.Out = opts.DataOut
	return r, nil
}

// ---- packets ----

// datagram builds an Ethernet/IP/UDP frame from -> to with correct checksums.
func datagram(from, to netip.AddrPort, payload []byte) []byte {
	return frame{}.build(from, to, payload)
}

// frame varies the layers around a datagram: a VLAN tag, IPv4 options or fragment fields,
// IPv6 extension headers, UDP header overrides.
type frame struct {
	vlan bool
	ip4  pktbuild.IPv4 // addresses are filled in
	ip6  pktbuild.IPv6
	l4   pktbuild.UDP // ports are filled in
}

func (fr frame) build(from, to netip.AddrPort, payload []byte) []byte {
	b := pktbuild.New()
	if fr.vlan {
		b = b.VLAN(pktbuild.VLAN{VID: 42})
	}
	if from.Addr().Is4() {
		fr.ip4.Src, fr.ip4.Dst = from.Addr(), to.Addr()
		b = b.IPv4(fr.ip4)
	} else {
		fr.ip6.Src, fr.ip6.Dst = from.Addr(), to.Addr()
		b = b.IPv6(fr.ip6)
	}
	fr.l4.Src, fr.l4.Dst = from.Port(), to.Port()
	return b.UDP(fr.l4).Payload(payload).Build()
}

// idPayload is an n-byte payload starting with id as 4 big-endian bytes (the v4, v6, solo
// and rr services' request id), the rest a recognisable pattern.
func idPayload(id uint32, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(0xa0 + i)
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	copy(p, b[:min(n, 4)])
	return p
}

// lePayload is an n-byte payload with id as 8 little-endian bytes at offset 2 (service le8).
func lePayload(id uint64, n int) []byte {
	p := idPayload(0xeeeeeeee, n)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	if n > 2 {
		copy(p[2:], b[:min(n-2, 8)])
	}
	return p
}

// udpCsumOff is the offset of the UDP checksum in a datagram() frame.
func udpCsumOff(frame []byte) int {
	if binary.BigEndian.Uint16(frame[12:]) == pktbuild.EtherTypeIPv4 {
		return 14 + 20 + 6
	}
	return 14 + 40 + 6
}

// zeroSumPayload returns a payload (base with its last two bytes chosen) for which the UDP
// checksum of datagram(from, to, payload) computes to 0 and is therefore sent as 0xffff
// (RFC 768; mandatory for IPv6, where 0 means "no checksum" and is dropped). A packet
// rewritten into that datagram tests the helpers' handling of a computed zero.
func zeroSumPayload(tb testing.TB, from, to netip.AddrPort, base []byte) []byte {
	tb.Helper()
	p := slices.Clone(base)
	for x := 0; x <= 0xffff; x++ {
		binary.BigEndian.PutUint16(p[len(p)-2:], uint16(x))
		fr := datagram(from, to, p)
		if binary.BigEndian.Uint16(fr[udpCsumOff(fr):]) == 0xffff {
			return p
		}
	}
	tb.Fatalf("no payload makes the checksum of %s -> %s zero", from, to)
	return nil
}

// ---- scoreboard ----

// key returns the scoreboard key of a request from client to service svc with id.
func key(svc int, client netip.AddrPort, id uint64) hedgeHreqKey {
	var k hedgeHreqKey
	k.Caddr.In6U.U6Addr8 = client.Addr().As16() // IPv4 v4-mapped, as parse.h stores it
	k.Id = id
	k.Cport = bpfx.Htons(client.Port())
	k.Svc = uint16(svc)
	return k
}

func (k hedgeHreqKey) String() string {
	a := netip.AddrFrom16(k.Caddr.In6U.U6Addr8).Unmap()
	return fmt.Sprintf("{svc %d, client %s, id %#x}", k.Svc, netip.AddrPortFrom(a, bpfx.Htons(k.Cport)), k.Id)
}

// hedgedBy writes request k as hedged once, to replica rep, a delay after it was sent two
// delays ago (for f.at).
func hedgedBy(k hedgeHreqKey, rep uint8) func(*fixture, uint64) error {
	return func(f *fixture, now uint64) error {
		e := pending(now-uint64(2*testDelay), now-uint64(testDelay))
		e.State, e.HedgeReplica, e.HedgesSent, e.Tried, e.HedgedNs = reqHedged, rep, 1, 1|1<<rep, now-1000
		return f.objs.Scoreboard.Put(k, e)
	}
}

// pending is a scoreboard entry as the splitter writes it, sent at sent, due at deadline.
func pending(sent, deadline uint64) hedgeHreq {
	return hedgeHreq{SentNs: sent, DeadlineNs: deadline, State: reqPending, OrigReplica: 0, HedgeReplica: replicaNone, Tried: 1}
}

// put writes request k's state as e. A stored request that lives in its ring cell (f.held,
// the same send time) keeps living there when e is pending or answered (the cell's lap word
// says which); in any other state it is written to the scoreboard and its cell marked moved,
// as the tick does when it comes due. Anything else is written to the scoreboard.
func (f *fixture) put(tb testing.TB, k hedgeHreqKey, e hedgeHreq) {
	tb.Helper()
	if pos, he, ok := f.held(tb, k); ok && he.SentNs == e.SentNs {
		state := hedgeLapStateLAP_MOVED
		switch e.State {
		case reqPending:
			state = hedgeLapStateLAP_PENDING
		case reqAnswered:
			state = hedgeLapStateLAP_ANSWERED
		}
		var l hedgeStoreLap
		idx := cellIndex(int(k.Svc), pos)
		if err := f.objs.StoreLaps.Lookup(idx, &l); err != nil {
			tb.Fatal(err)
		}
		l.Lap = lapWord(pos, state)
		if state != hedgeLapStateLAP_MOVED {
			if err := f.objs.StoreLaps.Put(idx, l); err != nil {
				tb.Fatal(err)
			}
			return
		}
		defer func() {
			if err := f.objs.StoreLaps.Put(idx, l); err != nil {
				tb.Fatal(err)
			}
		}()
	}
	if err := f.objs.Scoreboard.Put(k, e); err != nil {
		tb.Fatalf("write scoreboard entry %v: %v", k, err)
	}
}

// entry returns request k's state: a stored request's from its cell while it lives there
// (f.held), else its scoreboard entry.
func (f *fixture) entry(tb testing.TB, k hedgeHreqKey) (hedgeHreq, bool) {
	tb.Helper()
	if _, e, ok := f.held(tb, k); ok {
		return e, true
	}
	var e hedgeHreq
	err := f.objs.Scoreboard.Lookup(k, &e)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return e, false
	}
	if err != nil {
		tb.Fatalf("read scoreboard entry %v: %v", k, err)
	}
	return e, true
}

// board returns every request's state: the scoreboard's entries, and the stored requests that
// live in their ring cells (pending or answered there: f.held).
func (f *fixture) board(tb testing.TB) map[hedgeHreqKey]uint32 {
	tb.Helper()
	out := map[hedgeHreqKey]uint32{}
	var k hedgeHreqKey
	var v hedgeHreq
	it := f.objs.Scoreboard.Iterate()
	for it.Next(&k, &v) {
		out[k] = v.State
	}
	if err := it.Err(); err != nil {
		tb.Fatalf("iterate scoreboard: %v", err)
	}
	for svc := range f.h.Config.Services {
		var h hedgeStorePos
		if err := f.objs.StoreHeads.Lookup(uint32(svc), &h); err != nil {
			tb.Fatalf("read store_heads[%d]: %v", svc, err)
		}
		for pos := h.Head; pos < h.Tail; pos++ {
			var l hedgeStoreLap
			if err := f.objs.StoreLaps.Lookup(cellIndex(svc, pos), &l); err != nil {
				tb.Fatalf("read store lap %d/%d: %v", svc, pos, err)
			}
			switch l.Lap {
			case lapWord(pos, hedgeLapStateLAP_PENDING):
				out[l.Key] = reqPending
			case lapWord(pos, hedgeLapStateLAP_ANSWERED):
				out[l.Key] = reqAnswered
			}
		}
	}
	return out
}

// lookup reads m[key] or fails the test.
func lookup[V any](tb testing.TB, m *ebpf.Map, key uint32) V {
	tb.Helper()
	var v V
	if err := m.Lookup(key, &v); err != nil {
		tb.Fatalf("read %s[%d]: %v", m, key, err)
	}
	return v
}

func (f *fixture) state(tb testing.TB, svc int) hedgeSvcState {
	tb.Helper()
	return lookup[hedgeSvcState](tb, f.objs.SvcStates, uint32(svc))
}

func (f *fixture) svcCfg(tb testing.TB, svc int) hedgeSvcCfg {
	tb.Helper()
	return lookup[hedgeSvcCfg](tb, f.objs.SvcCfgs, uint32(svc))
}

func (f *fixture) setTokens(tb testing.TB, svc int, milli int64) {
	tb.Helper()
	st := f.state(tb, svc)
	st.TokensMilli = milli
	if err := f.objs.SvcStates.Put(uint32(svc), st); err != nil {
		tb.Fatalf("write svc_states[%d]: %v", svc, err)
	}
}

// hist returns the khist at idx of m (lat_hist or dl_precision).
func histAt(tb testing.TB, m *ebpf.Map, idx int) hedgeKhist {
	tb.Helper()
	return lookup[hedgeKhist](tb, m, uint32(idx))
}

// nonZero lists the buckets of h that hold counts, as bucket -> count.
func nonZero(h hedgeKhist) map[int]uint32 {
	out := map[int]uint32{}
	for i, c := range h.B {
		if c != 0 {
			out[i] = c
		}
	}
	return out
}

func total(h hedgeKhist) (n uint64) {
	for _, c := range h.B {
		n += uint64(c)
	}
	return n
}

// ---- the hedger's Runner ----

// runner is bpftest's Runner for prog: the fixture reset before each case, every service's
// and the pacer's counters, the fixed clock, runs inside the fixture's namespace.
func (f *fixture) runner(prog *ebpf.Program) bpftest.Runner {
	return bpftest.Runner{
		Prog:     prog,
		Counters: f.counters,
		Reset:    f.reset,
		Clock:    f.objs.KedgeClockNs,
		Within:   f.ns.Do,
	}
}

// now0 is the time every table case runs at (its clock's start): entries in Setup are
// written relative to it.
const now0 = bpftest.ClockStart

// tickIn is a tick frame for the armed deadline now0 - 1 us, as the pacer delivers it: a
// case with In: tickIn has the pacer armed for it before its Setup.
var tickIn = tickFrame(now0-1000, 128)

// runCases runs a table on prog with the hedger's Runner. The hedger's tables are strict: a
// case that names no counter change, mark, output or scoreboard expects none - every counter
// still, the mark as it went in, the packet unchanged, an empty scoreboard (f.leaves).
func runCases(t *testing.T, f *fixture, prog *ebpf.Program, cases []bpftest.Case) {
	t.Helper()
	for i := range cases {
		f.strict(&cases[i])
	}
	f.runner(prog).Run(t, cases)
}

// strict fills in what a hedger case leaves unsaid (see runCases), and arms the pacer for a
// case whose packet is tickIn.
func (f *fixture) strict(c *bpftest.Case) {
	if c.WantCounters == nil {
		c.WantCounters = bpftest.Counters{}
	}
	if c.WantMark == nil {
		var m uint32
		if c.Skb != nil {
			m = c.Skb.Mark
		}
		c.WantMark = &m
	}
	if c.WantOut == nil {
		c.WantSame = true
	}
	if c.Check == nil {
		c.Check = f.leaves(nil)
	}
	if bytes.Equal(c.In, tickIn) {
		setup := c.Setup
		c.Setup = func(tb testing.TB) {
			f.armTick(tb, now0-1000)
			if setup != nil {
				setup(tb)
			}
		}
	}
}

// leaves checks that the scoreboard holds exactly board (state per key; nil: empty) after
// the run, then runs checks.
func (f *fixture) leaves(board map[hedgeHreqKey]uint32, checks ...func(testing.TB, bpftest.Result)) func(testing.TB, bpftest.Result) {
	return func(tb testing.TB, r bpftest.Result) {
		tb.Helper()
		if d := diffBoard(f.board(tb), board); d != "" {
			tb.Errorf("scoreboard (got, want):\n%s", d)
		}
		for _, c := range checks {
			c(tb, r)
		}
	}
}

func diffBoard(got, want map[hedgeHreqKey]uint32) string {
	var lines []string
	for k, s := range got {
		if want[k] != s {
			lines = append(lines, fmt.Sprintf("  %v: %s, want %s", k, stateNames[s], stateNames[want[k]]))
		}
	}
	for k, s := range want {
		if _, ok := got[k]; !ok && s != 0 {
			lines = append(lines, fmt.Sprintf("  %v: absent, want %s", k, stateNames[s]))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func verdict(v uint32) string {
	names := map[uint32]string{bpftest.TCActUnspec: "TC_ACT_UNSPEC", bpftest.TCActOK: "TC_ACT_OK",
		bpftest.TCActShot: "TC_ACT_SHOT", bpftest.TCActRedirect: "TC_ACT_REDIRECT"}
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf("%d (%#x)", int32(v), v)
}

// verifyChecksums is a case check: the packet out has valid IP and UDP checksums.
func verifyChecksums(tb testing.TB, r bpftest.Result) {
	tb.Helper()
	if err := pktbuild.VerifyChecksums(r.Out); err != nil {
		tb.Errorf("output packet: %v\n%x", err, r.Out)
	}
}

func ptr[T any](v T) *T { return &v }
