package pacer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/vishvananda/netlink"
)

// Fixtures: the pacer's programs and the reference consumer's under BPF_PROG_TEST_RUN, in
// bpftest's table style: one packet in, verdict, packet out, counters and the pacer's state
// checked. The consumer is bound to the pacer as in a run (the pacer's maps replace its
// own), and both objects' clocks are fixed (bpftest.FixClock): every case runs at
// bpftest.ClockStart (or its Now), so deadlines are exact. They run inside a test namespace
// whose veth pt0/pt1 stands in for the pacer's veth (bpf_clone_redirect needs a device).

const fixturePort, fixtureCarryPort = 7777, 7778

// now0 is the time a case runs at unless it sets Now.
const now0 = bpftest.ClockStart

type fixture struct {
	t      *testing.T
	ns     *netnsx.Netns
	objs   pacerObjects // the pacer's own
	echo   echoObjects  // the consumer's, sharing the pacer's maps
	ifx    int          // pt0: the "pacer veth" (carried clones go here; also stands for the peer)
	outIfx int          // pt1: where echoes leave; also stands for the tick veth and its peer
	cfg    pacerPacerConfig
}

func newFixture(t *testing.T, backend pacerPacerBackend) *fixture {
	return newFixtureWith(t, backend, nil)
}

// newFixtureWith is newFixture with pacer_cfg changed by set before load.
func newFixtureWith(t *testing.T, backend pacerPacerBackend, set func(*pacerPacerConfig)) *fixture {
	requireEcho(t)
	f := &fixture{t: t}
	ns, err := netnsx.New(netnsx.OwnedName(fmt.Sprintf("pacer-fx-%d", backend)))
	if err != nil {
		t.Fatalf("create test namespace: %v", err)
	}
	f.ns = ns
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Errorf("remove test namespace: %v", err)
		}
	})
	nh, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pt0"}, PeerName: "pt1"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	for _, n := range []string{"pt0", "pt1"} {
		l, err := nh.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := nh.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		if n == "pt0" {
			f.ifx = l.Attrs().Index
		} else {
			f.outIfx = l.Attrs().Index
		}
	}
	f.cfg = pacerPacerConfig{
		Backend: uint32(backend), Ifindex: uint32(f.ifx), PeerIfindex: uint32(f.ifx),
		TickIfindex: uint32(f.outIfx), TickPeerIfindex: uint32(f.outIfx), DevIfindex: 1002,
		TickBytes: uint32(tickMinBytes), LostNs: uint64(time.Second),
	}
	if backend != pacerPacerBackendPACER_EDT {
		f.cfg.EarlyNs, f.cfg.CarryEarlyNs = uint64(time.Millisecond/2), uint64(time.Millisecond/2)
	}
	if set != nil {
		set(&f.cfg)
	}
	f.objs, f.echo = loadWithEcho(t, f.cfg, echoEchoConfig{OutIfindex: uint32(f.outIfx), Port: bpfx.Htons(fixturePort),
		CarryPort: bpfx.Htons(fixtureCarryPort), DelayNs: uint64(5 * time.Millisecond)}, true)
	return f
}

// loadWithEcho loads the pacer's object with cfg and the reference consumer bound to it, as
// Pacer.New and a consumer do, with both clocks fixed when fixed is set; both close with
// the test.
func loadWithEcho(t testing.TB, cfg Config, ecfg echoEchoConfig, fixed bool) (pacerObjects, echoObjects) {
	t.Helper()
	var objs pacerObjects
	var echo echoObjects
	spec, err := loadPacer()
	if err != nil {
		t.Fatal(err)
	}
	if err := (Client{Config: cfg}).Bind(spec, nil); err != nil {
		t.Fatal(err)
	}
	espec, err := loadEcho()
	if err != nil {
		t.Fatal(err)
	}
	if fixed {
		for _, s := range []*ebpf.CollectionSpec{spec, espec} {
			if err := bpftest.FixClock(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := bpfx.LoadAndAssign("pacer", spec, &objs, nil); err != nil {
		logFull(t, err)
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	if err := espec.Variables["echo_cfg"].Set(ecfg); err != nil {
		t.Fatal(err)
	}
	var opts ebpf.CollectionOptions
	cli := Client{Config: cfg, Maps: map[string]*ebpf.Map{MapState: objs.PacerArming, MapCounters: objs.PacerCounters}}
	if err := cli.Bind(espec, &opts); err != nil {
		t.Fatal(err)
	}
	if err := bpfx.LoadAndAssign("echo", espec, &echo, &opts); err != nil {
		logFull(t, err)
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	return objs, echo
}

// logFull logs a verifier error's whole log.
func logFull(t testing.TB, err error) {
	var le *bpfx.LoadError
	if errors.As(err, &le) {
		t.Log(le.Full())
	}
}

// pacer is the Runner for the pacer's own programs, echo for the consumer's: the pacer's and
// the consumer's counters (the latter as Echo<Field>), their object's fixed clock, runs in
// the test namespace. State is shared between cases: each sets what it needs (Setup).
func (f *fixture) pacer(prog *ebpf.Program) bpftest.Runner {
	return bpftest.Runner{Prog: prog, Counters: f.counters, Clock: f.objs.KedgeClockNs, Within: f.ns.Do}
}

func (f *fixture) consumer(prog *ebpf.Program) bpftest.Runner {
	return bpftest.Runner{Prog: prog, Counters: f.counters, Clock: f.echo.KedgeClockNs, Within: f.ns.Do}
}

func (f *fixture) counters() (bpftest.Counters, error) {
	c, err := bpftest.SumPerCPU[pacerPacerStats](f.objs.PacerCounters)
	if err != nil {
		return nil, err
	}
	e, err := bpftest.SumPerCPU[echoEchoStats](f.echo.EchoCounters)
	if err != nil {
		return nil, err
	}
	for k, v := range e {
		c["Echo"+k] = v
	}
	// Per-CPU minima and maxima do not add up over CPUs (a case may run on another CPU than
	// the one before): left out, checked where a case means them (extremes).
	for k := range c {
		if strings.HasSuffix(k, "MinNs") || strings.HasSuffix(k, "MaxNs") {
			delete(c, k)
		}
	}
	return c, nil
}

// extremes reads the pacer's counters with minima and maxima taken over the CPUs.
func (f *fixture) extremes(tb testing.TB) pacerPacerStats {
	tb.Helper()
	s, err := bpfx.SumPerCPU[pacerPacerStats](f.objs.PacerCounters, uint32(0), bpfx.Extrema)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// from is the context of a packet that arrived on device ifx.
func from(ifx int) *bpftest.SkBuff { return &bpftest.SkBuff{Ifindex: uint32(ifx)} }

// setArmed is a Setup: the pacer's armed deadline.
func (f *fixture) setArmed(ns uint64) func(testing.TB) {
	return func(tb testing.TB) {
		tb.Helper()
		if err := f.objs.PacerArming.Put(uint32(0), pacerPacerState{ArmedNs: ns}); err != nil {
			tb.Fatal(err)
		}
	}
}

// armedIs is a Check: the pacer's armed deadline after the run.
func (f *fixture) armedIs(want uint64) func(testing.TB, bpftest.Result) {
	return func(tb testing.TB, _ bpftest.Result) {
		tb.Helper()
		var st pacerPacerState
		if err := f.objs.PacerArming.Lookup(uint32(0), &st); err != nil {
			tb.Fatal(err)
		}
		if st.ArmedNs != want {
			tb.Errorf("armed %d, want %d", st.ArmedNs, want)
		}
	}
}

// tickFrame is a tick frame for deadline with magic, cut to its first payload bytes of
// struct pacer_tick (its IPv4 length cut too).
func tickFrame(deadline uint64, magic uint64, payload int) []byte {
	b := TickFrame(Tick{Magic: magic, DeadlineNs: deadline}, 0)[:ethHeaderLen+ipv4HeaderLen+payload]
	ip := b[ethHeaderLen:]
	binary.BigEndian.PutUint16(ip[2:], uint16(ipv4HeaderLen+payload))
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:ipv4HeaderLen]))
	return b
}

// tickOf decodes the struct pacer_tick of a tick frame.
func tickOf(tb testing.TB, frame []byte) Tick {
	tb.Helper()
	var t Tick
	if _, err := binary.Decode(frame[ethHeaderLen+ipv4HeaderLen:], binary.NativeEndian, &t); err != nil {
		tb.Fatalf("decode the tick: %v", err)
	}
	return t
}

func udpTo(port uint16) []byte {
	return pktbuild.New().IPv4(pktbuild.IPv4{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}).
		UDP(pktbuild.UDP{Src: 5555, Dst: port}).Payload([]byte("0123456789")).Build()
}

var tickMagic = uint64(pacerPacerMagicPACER_TICK_MAGIC)

// tickIs is a Check: the output is a tick frame of n bytes for deadline with valid headers.
func tickIs(n int, deadline uint64) func(testing.TB, bpftest.Result) {
	return func(tb testing.TB, r bpftest.Result) {
		tb.Helper()
		if len(r.Out) != n {
			tb.Fatalf("tick frame %d bytes, want %d", len(r.Out), n)
		}
		if err := pktbuild.VerifyChecksums(r.Out); err != nil {
			tb.Errorf("tick frame: %v", err)
		}
		if r.Out[ethHeaderLen+9] != byte(pacerPacerConstsPACER_IPPROTO) {
			tb.Errorf("protocol %d, want %d", r.Out[ethHeaderLen+9], pacerPacerConstsPACER_IPPROTO)
		}
		if tk := tickOf(tb, r.Out); tk.Magic != tickMagic || tk.DeadlineNs != deadline {
			tb.Errorf("tick magic %#x deadline %d, want %#x %d", tk.Magic, tk.DeadlineNs, tickMagic, deadline)
		}
	}
}

// TestTickFrameMatchesEnter pins TickFrame, Go's tick frame (what consumers' fixtures feed
// their tick programs), to the frame pacer_enter writes: byte for byte, every field of
// struct pacer_tick included.
func TestTickFrameMatchesEnter(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	const deadline, seq = 987654321, 7
	want := TickFrame(Tick{Magic: tickMagic, DeadlineNs: deadline, SentNs: now0, Seq: seq}, tickMinBytes)
	f.pacer(f.objs.PacerEnter).Run(t, []bpftest.Case{{
		Name: "tick request", In: udpTo(53), Skb: from(f.outIfx),
		Setup: func(tb testing.TB) {
			if err := f.objs.PacerArming.Put(uint32(0), pacerPacerState{ArmedNs: deadline, Seq: seq}); err != nil {
				tb.Fatal(err)
			}
		},
		WantRet: bpftest.TCActRedirect, WantOut: want, WantCounters: bpftest.Counters{"TicksEntered": 1},
	}})
}

func TestFixturesEnter(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	prio := f.outIfx // the tick veth's peer
	carry := f.ifx   // the main veth's peer
	const deadline = 123456789
	f.pacer(f.objs.PacerEnter).Run(t, []bpftest.Case{
		{Name: "packet from another device dropped", In: udpTo(53), Skb: from(0),
			WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"Foreign": 1}},
		{Name: "tick request becomes a tick frame for the armed deadline", In: udpTo(53), Skb: from(prio),
			Setup: f.setArmed(deadline), WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"TicksEntered": 1},
			Check: tickIs(tickMinBytes, deadline)},
		{Name: "a tick request with nothing armed: a tick for now, harmless", In: udpTo(53), Skb: from(prio),
			Setup: f.setArmed(0), WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"TicksEntered": 1},
			Check: tickIs(tickMinBytes, now0)},
		{Name: "a 14-byte tick request grows to a tick frame", In: make([]byte, 14), Skb: from(prio),
			Setup: f.setArmed(42), WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"TicksEntered": 1},
			Check: tickIs(tickMinBytes, 42)},
		{Name: "carried packet goes in unchanged", In: udpTo(53), Skb: from(carry),
			WantRet: bpftest.TCActRedirect, WantSame: true, WantCounters: bpftest.Counters{"CarriedIn": 1}},
	})
}

// TestFixturesEnterEDT: on edt a carried packet enters as it came; the pacer stamps nothing
// (its deadline travels in skb->tstamp, set by the consumer's pacer_carry).
func TestFixturesEnterEDT(t *testing.T) {
	if haveSetTstamp() != nil {
		t.Skip("bpf_skb_set_tstamp missing (Linux 5.18+): edt does not load here")
	}
	f := newFixture(t, pacerPacerBackendPACER_EDT)
	f.pacer(f.objs.PacerEnter).Run(t, []bpftest.Case{
		{Name: "carried packet: redirected, its tstamp untouched", In: udpTo(53), Skb: &bpftest.SkBuff{Ifindex: uint32(f.ifx), Tstamp: 12345},
			WantRet: bpftest.TCActRedirect, WantSame: true, WantCounters: bpftest.Counters{"CarriedIn": 1},
			Check: func(tb testing.TB, r bpftest.Result) {
				if r.Skb.Tstamp != 12345 {
					tb.Errorf("carried packet left with tstamp %d, want its own 12345", r.Skb.Tstamp)
				}
			}},
	})
}

// TestFixturesCarry: the client's carry path through the reference consumer. A datagram to
// the carry port is carried (cloned into the pacer veth) with its deadline recorded; on edt
// the clone is stamped and the datagram itself keeps the time it had. Back at the tick
// program, a carried datagram not yet due goes round again, a due one is turned around.
func TestFixturesCarry(t *testing.T) {
	in := udpTo(fixtureCarryPort)
	back := pktbuild.New().IPv4(pktbuild.IPv4{Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.0.0.1")}).
		UDP(pktbuild.UDP{Src: fixtureCarryPort, Dst: 5555}).Payload([]byte("0123456789")).Build()
	copy(back[0:6], in[6:12]) // the MACs swapped too
	copy(back[6:12], in[0:6])
	const rxTime = 12345 // a receive time (not a delivery time) the datagram came with
	backends := []pacerPacerBackend{pacerPacerBackendPACER_NETEM}
	if haveSetTstamp() == nil {
		backends = append(backends, pacerPacerBackendPACER_EDT)
	}
	for _, b := range backends {
		edt := b == pacerPacerBackendPACER_EDT
		stamp := func(c bpftest.Counters) bpftest.Counters {
			if edt {
				c["EdtSet"] = 1
			}
			return c
		}
		t.Run(fmt.Sprintf("backend %d", b), func(t *testing.T) {
			f := newFixture(t, b)
			// deadline is a Setup: the carried datagram's recorded deadline.
			deadline := func(d uint64) func(testing.TB) {
				return func(tb testing.TB) {
					tb.Helper()
					if err := f.echo.EchoCarried.Update(echoKey(5555, in), d, ebpf.UpdateExist); err != nil {
						tb.Fatalf("the carried datagram's deadline: %v", err)
					}
				}
			}
			t.Run("stored", func(t *testing.T) {
				f.consumer(f.echo.EchoStore).Run(t, []bpftest.Case{
					{Name: "carried, its own time kept", In: in, Skb: &bpftest.SkBuff{Tstamp: rxTime},
						WantRet: bpftest.TCActShot, WantCounters: stamp(bpftest.Counters{"EchoCarried": 1}),
						Check: func(tb testing.TB, r bpftest.Result) {
							if r.Skb.Tstamp != rxTime {
								tb.Errorf("the datagram left with tstamp %d, want its own %d back", r.Skb.Tstamp, rxTime)
							}
							var d uint64
							if err := f.echo.EchoCarried.Lookup(echoKey(5555, in), &d); err != nil || d != now0+uint64(5*time.Millisecond) {
								tb.Errorf("recorded deadline %d (%v), want now + the 5 ms delay", d, err)
							}
						}},
				})
			})
			f.consumer(f.echo.EchoTick).Run(t, []bpftest.Case{
				{Name: "back before its deadline (beyond the early margin): round again (edt: stamped anew)", In: in,
					Setup:   deadline(now0 + uint64(time.Millisecond)),
					WantRet: bpftest.TCActRedirect, WantSame: true,
					WantCounters: stamp(bpftest.Counters{"EchoRecirculated": 1, "CarriedRecirculated": 1})},
				{Name: "back at its deadline: turned around and sent", In: in, Setup: deadline(now0),
					WantRet: bpftest.TCActRedirect, WantOut: back,
					WantCounters: bpftest.Counters{"EchoEchoesSent": 1, "EchoEchoLateCount": 1}},
				{Name: "back again (a duplicate): no deadline recorded any more, dropped", In: in,
					WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"EchoCarriedUnknown": 1}},
			})
		})
	}
}

// echoKey is struct echo_key of a carried datagram from sport whose payload starts as in's.
func echoKey(sport uint16, in []byte) []byte {
	k := make([]byte, 8)
	copy(k[0:4], in[14+20+8:])
	binary.BigEndian.PutUint16(k[4:], sport)
	return k
}

func TestFixturesPass(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	ms := uint64(time.Millisecond)
	// passes: the output is a tick sent round again with its pass count incremented.
	passes := func(n uint32) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, r bpftest.Result) {
			if got := tickOf(tb, r.Out).Passes; got != n {
				tb.Errorf("passes %d, want %d", got, n)
			}
		}
	}
	f.pacer(f.objs.PacerPass).Run(t, []bpftest.Case{
		{Name: "due tick leaves", In: tickFrame(now0-ms, tickMagic, 32), Setup: f.setArmed(now0 - ms),
			WantRet: bpftest.TCActRedirect, WantSame: true, WantCounters: bpftest.Counters{}},
		{Name: "tick due within the early margin (half a pass) leaves", In: tickFrame(now0+ms/2, tickMagic, 32), Setup: f.setArmed(now0 + ms/2),
			WantRet: bpftest.TCActRedirect, WantSame: true, WantCounters: bpftest.Counters{}},
		{Name: "tick just beyond the early margin goes round again", In: tickFrame(now0+ms/2+1, tickMagic, 32), Setup: f.setArmed(now0 + ms/2 + 1),
			WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"TickPasses": 1}, Check: passes(1)},
		{Name: "tick not due goes round again", In: tickFrame(now0+uint64(time.Hour), tickMagic, 32), Setup: f.setArmed(now0 + uint64(time.Hour)),
			WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"TickPasses": 1}, Check: passes(1)},
		{Name: "superseded tick dropped", In: tickFrame(now0+uint64(time.Hour), tickMagic, 32), Setup: f.setArmed(now0 + uint64(time.Minute)),
			WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"TicksSuperseded": 1}},
		{Name: "tick with a bad magic dropped", In: tickFrame(now0, 0xdead, 32), Setup: f.setArmed(now0),
			WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"MalformedTicks": 1}},
		{Name: "truncated tick dropped", In: tickFrame(now0, tickMagic, 12), Setup: f.setArmed(now0),
			WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"MalformedTicks": 1}},
		{Name: "carried packet leaves", In: udpTo(53), Setup: f.setArmed(0),
			WantRet: bpftest.TCActRedirect, WantSame: true, WantCounters: bpftest.Counters{"CarriedOut": 1}},
		{Name: "truncated Ethernet frame counts as carried and leaves", In: make([]byte, 14), Setup: f.setArmed(0),
			WantRet: bpftest.TCActRedirect, WantSame: true, WantCounters: bpftest.Counters{"CarriedOut": 1}},
	})
}

// TestFixturesTickResize: on the conveyor without fillers a tick not yet due leaves for its
// next pass resized to the bytes whose transmission time at the rate is what is left of its
// wait, between the smallest tick frame and tick_max_bytes; a due one leaves as it came.
func TestFixturesTickResize(t *testing.T) {
	const rate, maxBytes = 12_500, 4000 // 100 kbit/s: 80 us a byte
	f := newFixtureWith(t, pacerPacerBackendPACER_CONVEYOR, func(c *pacerPacerConfig) {
		c.TickBytes, c.TickMaxBytes, c.RateBytes = 200, maxBytes, rate
		c.EarlyNs, c.CarryEarlyNs = uint64(50*time.Microsecond), 0
	})
	// As pacer_enter sends it: tick_bytes (200) long.
	frame := func(left time.Duration) []byte {
		return TickFrame(Tick{Magic: tickMagic, DeadlineNs: uint64(int64(now0) + int64(left))}, 200)
	}
	resized := func(left time.Duration) bpftest.Case {
		want := min(max(int(left.Microseconds()*rate/1_000_000), tickMinBytes), maxBytes)
		return bpftest.Case{In: frame(left), Setup: f.setArmed(uint64(int64(now0) + int64(left))),
			WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"TickPasses": 1},
			Check: func(tb testing.TB, r bpftest.Result) {
				if len(r.Out) != want {
					tb.Errorf("frame left with %d bytes, want %d", len(r.Out), want)
				}
			}}
	}
	named := func(name string, c bpftest.Case) bpftest.Case { c.Name = name; return c }
	f.pacer(f.objs.PacerPass).Run(t, []bpftest.Case{
		named("far: the largest frame", resized(time.Hour)),
		named("100 ms left: 1250 bytes", resized(100*time.Millisecond)),
		named("5 ms left: the smallest frame", resized(5*time.Millisecond)),
		{Name: "due: unchanged", In: frame(-time.Millisecond), Setup: f.setArmed(now0 - uint64(time.Millisecond)),
			WantRet: bpftest.TCActRedirect, WantSame: true, WantCounters: bpftest.Counters{}},
	})
}

func TestFixturesFiller(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_CONVEYOR)
	// The smallest filler Options allow, as addFillers sends it, last stamped 10 ms ago.
	stamped := func(stamp uint64) []byte {
		b := fillerFrame(tickMinBytes, nil)
		if _, err := binary.Encode(b[ethHeaderLen:], binary.NativeEndian, pacerPacerFiller{Magic: fillerMagic, StampNs: stamp}); err != nil {
			t.Fatal(err)
		}
		return b
	}
	frame := stamped(now0 - uint64(10*time.Millisecond))
	due := now0 - uint64(time.Millisecond)
	// A filler goes round with its stamp moved to now (its round trip recorded).
	restamped := stamped(now0)
	period := bpftest.Counters{"FillerPasses": 1, "PeriodCount": 1, "PeriodSumNs": int64(10 * time.Millisecond)}
	fillerHead := ethHeaderLen + binary.Size(pacerPacerFiller{}) // PACER_FILLER_HEAD
	fired := func(want uint64) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, _ bpftest.Result) {
			var st pacerPacerState
			if err := f.objs.PacerArming.Lookup(uint32(0), &st); err != nil || st.FiredNs != want {
				tb.Errorf("fired %d (%v), want %d", st.FiredNs, err, want)
			}
		}
	}
	f.pacer(f.objs.PacerPass).Run(t, []bpftest.Case{
		{Name: "filler goes round, its round trip recorded", In: frame, Setup: f.setArmed(0),
			WantRet: bpftest.TCActRedirect, WantOut: restamped, WantCounters: period,
			Check: func(tb testing.TB, _ bpftest.Result) {
				if s := f.extremes(tb); s.PeriodMinNs != uint64(10*time.Millisecond) || s.PeriodMaxNs != uint64(10*time.Millisecond) {
					tb.Errorf("period min %d max %d, want both 10 ms", s.PeriodMinNs, s.PeriodMaxNs)
				}
			}},
		// A due tick rides this filler pass: the filler is cloned out as a tick frame and
		// restored; the tick frame still queued for that deadline is then superseded.
		{Name: "a due tick rides the filler pass", In: frame, Setup: f.setArmed(due),
			WantRet: bpftest.TCActRedirect, WantCounters: period.With(bpftest.Counters{"TicksPiggybacked": 1}),
			Check: func(tb testing.TB, r bpftest.Result) {
				fired(due)(tb, r)
				// The filler's head (Ethernet, magic, stamp) restored; what follows is padding.
				if !slices.Equal(r.Out[:fillerHead], restamped[:fillerHead]) {
					tb.Errorf("filler not restored: %s", bpftest.DiffBytes(r.Out[:fillerHead], restamped[:fillerHead]))
				}
			}},
		{Name: "a fired deadline does not fire again", In: frame,
			WantRet: bpftest.TCActRedirect, WantOut: restamped, WantCounters: period, Check: fired(due)},
		{Name: "the queued tick frame for the fired deadline is superseded", In: tickFrame(due, tickMagic, 32),
			WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"TicksSuperseded": 1}},
		{Name: "a filler user space asked to drop is dropped", In: frame,
			Setup: bpftest.Seq(f.setArmed(0), func(tb testing.TB) {
				if err := f.objs.PacerControl.Put(uint32(0), pacerPacerCtl{FillersToDrop: 1}); err != nil {
					tb.Fatal(err)
				}
			}),
			WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"FillersDropped": 1}},
	})
}

// storeSlot is a Setup: a due or pending echo in slot i.
func (f *fixture) storeSlot(i uint32, deadline uint64, frame []byte) func(testing.TB) {
	return func(tb testing.TB) {
		tb.Helper()
		s := echoEchoSlot{DeadlineNs: deadline, Len: uint32(len(frame)), Busy: 1}
		copy(s.Frame[:], frame)
		if err := f.echo.EchoSlots.Put(i, s); err != nil {
			tb.Fatal(err)
		}
	}
}

func TestFixturesTick(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	echo := udpTo(9)
	later := now0 + uint64(time.Hour)
	ms := uint64(time.Millisecond)
	// busy: the echo slots' busy flags after the run (the slots are cleared after).
	busy := func(want ...uint32) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, _ bpftest.Result) {
			var s echoEchoSlot
			for i, b := range want {
				if err := f.echo.EchoSlots.Lookup(uint32(i), &s); err != nil || s.Busy != b {
					tb.Errorf("slot %d busy %d (%v), want %d", i, s.Busy, err, b)
				}
				if err := f.echo.EchoSlots.Put(uint32(i), echoEchoSlot{}); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	tick := bpftest.Counters{"TicksDelivered": 1, "EchoTicks": 1, "LateCount": 1, "LateHist[0]": 1}
	f.consumer(f.echo.EchoTick).Run(t, []bpftest.Case{
		{Name: "tick with nothing due: delivered, disarmed", In: tickFrame(now0, tickMagic, 32), Setup: f.setArmed(now0),
			WantRet: bpftest.TCActShot, WantCounters: tick.With(bpftest.Counters{"EchoTicksIdle": 1}), Check: f.armedIs(0)},
		{Name: "stale tick is still delivered and counted, the newer armed one kept", In: tickFrame(now0, tickMagic, 32),
			Setup: f.setArmed(now0 + 5), WantRet: bpftest.TCActShot,
			WantCounters: tick.With(bpftest.Counters{"EchoTicksIdle": 1, "TicksStale": 1}), Check: f.armedIs(now0 + 5)},
		{Name: "early tick: counted early, by how much", In: tickFrame(now0+ms, tickMagic, 32), Setup: f.setArmed(now0 + ms),
			WantRet:      bpftest.TCActShot,
			WantCounters: bpftest.Counters{"TicksDelivered": 1, "EchoTicks": 1, "EchoTicksIdle": 1, "EarlyCount": 1},
			Check: func(tb testing.TB, r bpftest.Result) {
				f.armedIs(0)(tb, r)
				if s := f.extremes(tb); s.EarlyMaxNs != ms {
					tb.Errorf("early_max_ns %d, want %d (the tick's lead)", s.EarlyMaxNs, ms)
				}
			}},
		{Name: "tick with due work sends it and re-arms for the rest", In: tickFrame(now0, tickMagic, 32),
			Setup:   bpftest.Seq(f.setArmed(now0), f.storeSlot(0, now0-ms, echo), f.storeSlot(1, now0-2*ms, echo), f.storeSlot(2, later, echo)),
			WantRet: bpftest.TCActShot, WantOut: echo, // the tick's skb rebuilt as the echo (each echo a clone of it)
			WantCounters: tick.With(bpftest.Counters{"EchoEchoesSent": 2, "EchoEchoLateCount": 2, "EchoEchoLateSumNs": int64(3 * ms),
				"TicksRequested": 1, "TicksArmed": 1, "EchoRearmed": 1}),
			Check: func(tb testing.TB, r bpftest.Result) {
				f.armedIs(later)(tb, r) // the pending echo's deadline
				busy(0, 0, 1)(tb, r)
			}},
		{Name: "malformed tick dropped", In: tickFrame(now0, 1, 32), WantRet: bpftest.TCActShot,
			WantCounters: bpftest.Counters{"MalformedTicks": 1, "EchoRxMalformed": 1}},
		{Name: "carried packet the consumer does not know: dropped", In: udpTo(53), WantRet: bpftest.TCActShot,
			WantCounters: bpftest.Counters{"EchoCarriedUnknown": 1}},
	})
}

func TestFixturesStore(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	deadline := now0 + uint64(5*time.Millisecond) // the echo's 5 ms delay
	f.consumer(f.echo.EchoStore).Run(t, []bpftest.Case{
		{Name: "datagram to the echo port is stored and a tick requested at its deadline", In: udpTo(fixturePort),
			Setup: f.setArmed(0), WantRet: bpftest.TCActShot,
			WantCounters: bpftest.Counters{"EchoStored": 1, "TicksRequested": 1, "TicksArmed": 1}, Check: f.armedIs(deadline)},
		{Name: "a second datagram coalesces with the armed tick", In: udpTo(fixturePort), WantRet: bpftest.TCActShot,
			WantCounters: bpftest.Counters{"EchoStored": 1, "TicksRequested": 1, "TicksCoalesced": 1}, Check: f.armedIs(deadline)},
		{Name: "an armed tick overdue by lost_ns (1 s) is re-armed by the next request", In: udpTo(fixturePort),
			Setup: f.setArmed(now0 - uint64(time.Second)), WantRet: bpftest.TCActShot,
			WantCounters: bpftest.Counters{"EchoStored": 1, "TicksRequested": 1, "TicksArmed": 1, "TicksLost": 1}, Check: f.armedIs(deadline)},
		{Name: "an armed tick overdue by less than lost_ns still coalesces", In: udpTo(fixturePort),
			Setup: f.setArmed(now0 - uint64(time.Second) + 1), WantRet: bpftest.TCActShot,
			WantCounters: bpftest.Counters{"EchoStored": 1, "TicksRequested": 1, "TicksCoalesced": 1}, Check: f.armedIs(now0 - uint64(time.Second) + 1)},
		{Name: "other port passes", In: udpTo(53), WantRet: bpftest.TCActUnspec, WantSame: true, WantCounters: bpftest.Counters{}},
		{Name: "truncated UDP header passes, counted", In: udpTo(fixturePort)[:38], WantRet: bpftest.TCActUnspec, WantSame: true,
			WantCounters: bpftest.Counters{"EchoMalformed": 1}},
	})
}
