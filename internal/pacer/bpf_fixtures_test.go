package pacer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/vishvananda/netlink"
)

// Fixtures: the pacer's programs and the reference consumer's under BPF_PROG_TEST_RUN, one
// packet in, verdict, packet out and counters checked. The consumer is bound to the pacer as
// in a run (Pacer.Client: the pacer's maps replace its own). They run inside a test
// namespace whose veth pt0/pt1 stands in for the pacer's veth (bpf_clone_redirect needs a
// device).

const fixturePort, fixtureCarryPort = 7777, 7778

type fixture struct {
	t      *testing.T
	ns     *lab.Netns
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
	ns, err := lab.NewNetns(lab.OwnedName(fmt.Sprintf("pacer-fx-%d", backend)))
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
	f.objs, f.echo = loadWithEcho(t, f.cfg, echoEchoConfig{OutIfindex: uint32(f.outIfx), Port: htons(fixturePort),
		CarryPort: htons(fixtureCarryPort), DelayNs: uint64(5 * time.Millisecond)})
	return f
}

// loadWithEcho loads the pacer's object with cfg and the reference consumer bound to it, as
// Pacer.New and a consumer do; both close with the test.
func loadWithEcho(t testing.TB, cfg Config, ecfg echoEchoConfig) (pacerObjects, echoObjects) {
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
	if err := bpfx.LoadAndAssign("pacer", spec, &objs, nil); err != nil {
		logFull(t, err)
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	espec, err := loadEcho()
	if err != nil {
		t.Fatal(err)
	}
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

// run runs prog on in as if it arrived on device ifx (0: loopback), inside the test
// namespace.
func (f *fixture) run(prog *ebpf.Program, in []byte, ifx int) (ret uint32, out []byte) {
	f.t.Helper()
	ret, out, _ = f.runStamped(prog, in, ifx, 0)
	return ret, out
}

// skbTstampOff is the offset of tstamp in struct __sk_buff.
const skbTstampOff = 152

// runStamped is run with skb->tstamp = tstamp going in; it returns the tstamp coming out.
func (f *fixture) runStamped(prog *ebpf.Program, in []byte, ifx int, tstamp uint64) (ret uint32, out []byte, tstampOut uint64) {
	f.t.Helper()
	ctx := make([]byte, skbTstampOff+8) // struct __sk_buff up to and including tstamp
	binary.NativeEndian.PutUint32(ctx[40:], uint32(ifx))
	binary.NativeEndian.PutUint64(ctx[skbTstampOff:], tstamp)
	ctxOut := make([]byte, 256) // room for the kernel's whole struct __sk_buff
	opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+bpftest.OutPad), Context: ctx, ContextOut: ctxOut, Repeat: 1}
	var err error
	if derr := f.ns.Do(func() error { ret, err = prog.Run(&opts); return nil }); derr != nil {
		f.t.Fatal(derr)
	}
	if err != nil {
		f.t.Fatalf("run: %v", err)
	}
	return ret, opts.DataOut, binary.NativeEndian.Uint64(ctxOut[skbTstampOff:])
}

func (f *fixture) counters() bpftest.Counters {
	f.t.Helper()
	c, err := bpftest.SumPerCPU[pacerPacerStats](f.objs.PacerCounters)
	if err != nil {
		f.t.Fatal(err)
	}
	e, err := bpftest.SumPerCPU[echoEchoStats](f.echo.EchoCounters)
	if err != nil {
		f.t.Fatal(err)
	}
	for k, v := range e {
		c["Echo"+k] = v
	}
	return c
}

// delta runs fn and returns the counters that changed.
func (f *fixture) delta(fn func()) bpftest.Counters {
	before := f.counters()
	fn()
	return f.counters().Sub(before)
}

func (f *fixture) setArmed(ns uint64) {
	f.t.Helper()
	if err := f.objs.PacerArming.Put(uint32(0), pacerPacerState{ArmedNs: ns}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) armed() uint64 {
	f.t.Helper()
	var st pacerPacerState
	if err := f.objs.PacerArming.Lookup(uint32(0), &st); err != nil {
		f.t.Fatal(err)
	}
	return st.ArmedNs
}

// tickFrame is a tick frame as pacer_enter builds it (IPv4, protocol 253, no addresses).
func tickFrame(deadline uint64, magic uint64, payload int) []byte {
	p := make([]byte, 32)
	binary.NativeEndian.PutUint64(p[0:], magic)
	binary.NativeEndian.PutUint64(p[8:], deadline)
	return pktbuild.New().IPv4(pktbuild.IPv4{Src: netip.IPv4Unspecified(), Dst: netip.IPv4Unspecified()}).
		Proto(uint8(pacerPacerConstsPACER_IPPROTO)).Payload(p[:payload]).Build()
}

func udpTo(port uint16) []byte {
	return pktbuild.New().IPv4(pktbuild.IPv4{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}).
		UDP(pktbuild.UDP{Src: 5555, Dst: port}).Payload([]byte("0123456789")).Build()
}

var tickMagic = uint64(pacerPacerMagicPACER_TICK_MAGIC)

func wantDelta(t *testing.T, got, want bpftest.Counters) {
	t.Helper()
	if d := got.Diff(want); d != "" {
		t.Errorf("counters: %s", d)
	}
}

func wantRet(t *testing.T, got, want uint32) {
	t.Helper()
	if got != want {
		t.Errorf("verdict %d, want %d", int32(got), int32(want))
	}
}

func TestFixturesEnter(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	prio := f.outIfx // the tick veth's peer
	carry := f.ifx   // the main veth's peer

	t.Run("packet from another device dropped", func(t *testing.T) {
		var ret uint32
		d := f.delta(func() { ret, _ = f.run(f.objs.PacerEnter, udpTo(53), 0) })
		wantRet(t, ret, bpftest.TCActShot)
		wantDelta(t, d, bpftest.Counters{"Foreign": 1})
	})
	t.Run("tick request becomes a tick frame for the armed deadline", func(t *testing.T) {
		const deadline = 123456789
		f.setArmed(deadline)
		var ret uint32
		var out []byte
		d := f.delta(func() { ret, out = f.run(f.objs.PacerEnter, udpTo(53), prio) })
		wantRet(t, ret, bpftest.TCActRedirect)
		wantDelta(t, d, bpftest.Counters{"TicksEntered": 1})
		if len(out) != tickMinBytes {
			t.Fatalf("tick frame %d bytes, want %d", len(out), tickMinBytes)
		}
		if err := pktbuild.VerifyChecksums(out); err != nil {
			t.Errorf("tick frame: %v", err)
		}
		if out[14+9] != byte(pacerPacerConstsPACER_IPPROTO) {
			t.Errorf("protocol %d, want %d", out[14+9], pacerPacerConstsPACER_IPPROTO)
		}
		tk := out[34:]
		if m, dl := binary.NativeEndian.Uint64(tk[0:]), binary.NativeEndian.Uint64(tk[8:]); m != tickMagic || dl != deadline {
			t.Errorf("tick magic %#x deadline %d, want %#x %d", m, dl, tickMagic, deadline)
		}
	})
	t.Run("a 14-byte tick request grows to a tick frame", func(t *testing.T) {
		f.setArmed(42)
		in := make([]byte, 14)
		ret, out := f.run(f.objs.PacerEnter, in, prio)
		wantRet(t, ret, bpftest.TCActRedirect)
		if len(out) != tickMinBytes {
			t.Errorf("tick frame %d bytes, want %d", len(out), tickMinBytes)
		}
	})
	t.Run("carried packet goes in unchanged", func(t *testing.T) {
		in := udpTo(53)
		var ret uint32
		var out []byte
		d := f.delta(func() { ret, out = f.run(f.objs.PacerEnter, in, carry) })
		wantRet(t, ret, bpftest.TCActRedirect)
		wantDelta(t, d, bpftest.Counters{"CarriedIn": 1})
		if string(out) != string(in) {
			t.Errorf("carried packet changed: %s", bpftest.DiffBytes(out, in))
		}
	})
}

// TestFixturesEnterEDT: on edt a carried packet enters as it came; the pacer stamps nothing
// (its deadline travels in skb->tstamp, set by the consumer's pacer_carry).
func TestFixturesEnterEDT(t *testing.T) {
	if haveSetTstamp() != nil {
		t.Skip("bpf_skb_set_tstamp missing (Linux 5.18+): edt does not load here")
	}
	f := newFixture(t, pacerPacerBackendPACER_EDT)
	var ret uint32
	var tstamp uint64
	d := f.delta(func() { ret, _, tstamp = f.runStamped(f.objs.PacerEnter, udpTo(53), f.ifx, 0) })
	wantRet(t, ret, bpftest.TCActRedirect)
	wantDelta(t, d, bpftest.Counters{"CarriedIn": 1})
	if tstamp != 0 {
		t.Errorf("carried packet left with tstamp %d, want it untouched (0)", tstamp)
	}
}

// TestFixturesCarry: the client's carry path through the reference consumer. A datagram to
// the carry port is carried (cloned into the pacer veth) with its deadline recorded; on edt
// the clone is stamped and the datagram itself keeps the time it had. Back at the tick
// program, a carried datagram not yet due goes round again, a due one is turned around.
func TestFixturesCarry(t *testing.T) {
	in := udpTo(fixtureCarryPort)
	backends := []pacerPacerBackend{pacerPacerBackendPACER_NETEM}
	if haveSetTstamp() == nil {
		backends = append(backends, pacerPacerBackendPACER_EDT)
	}
	for _, b := range backends {
		edt := b == pacerPacerBackendPACER_EDT
		t.Run(fmt.Sprintf("backend %d", b), func(t *testing.T) {
			f := newFixture(t, b)
			const rxTime = 12345 // a receive time (not a delivery time) the datagram came with
			var ret uint32
			var tstamp uint64
			d := f.delta(func() { ret, _, tstamp = f.runStamped(f.echo.EchoStore, in, 0, rxTime) })
			wantRet(t, ret, bpftest.TCActShot)
			want := bpftest.Counters{"EchoCarried": 1}
			if edt {
				want["EdtSet"] = 1
			}
			wantDelta(t, d, want)
			if tstamp != rxTime {
				t.Errorf("the datagram left with tstamp %d, want its own %d back", tstamp, rxTime)
			}
			// Back before its deadline: round again, on edt stamped anew. The deadlines are
			// set here, not left to the 5 ms the store gave: a slow (emulated) machine may
			// take longer than that between two runs.
			setDeadline := func(d time.Duration) {
				t.Helper()
				if err := f.echo.EchoCarried.Update(echoKey(5555, in), uint64(Now()+d), ebpf.UpdateExist); err != nil {
					t.Fatalf("the carried datagram's deadline: %v", err)
				}
			}
			setDeadline(time.Hour)
			d = f.delta(func() { ret, _ = f.run(f.echo.EchoTick, in, 0) })
			wantRet(t, ret, bpftest.TCActRedirect)
			want = bpftest.Counters{"EchoRecirculated": 1, "CarriedRecirculated": 1}
			if edt {
				want["EdtSet"] = 1
			}
			wantDelta(t, d, want)
			// Due: turned around and sent.
			setDeadline(-time.Millisecond)
			var out []byte
			d = f.delta(func() { ret, out = f.run(f.echo.EchoTick, in, 0) })
			wantRet(t, ret, bpftest.TCActRedirect)
			if d["EchoEchoesSent"] != 1 || d["EchoRecirculated"] != 0 {
				t.Errorf("counters %v", d)
			}
			back := pktbuild.New().IPv4(pktbuild.IPv4{Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.0.0.1")}).
				UDP(pktbuild.UDP{Src: fixtureCarryPort, Dst: 5555}).Payload([]byte("0123456789")).Build()
			copy(back[0:6], in[6:12]) // the MACs swapped too
			copy(back[6:12], in[0:6])
			if string(out) != string(back) {
				t.Errorf("echo: %s", bpftest.DiffBytes(out, back))
			}
			// Back again (a duplicate): no deadline recorded any more.
			d = f.delta(func() { ret, _ = f.run(f.echo.EchoTick, in, 0) })
			wantRet(t, ret, bpftest.TCActShot)
			wantDelta(t, d, bpftest.Counters{"EchoCarriedUnknown": 1})
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
	now := uint64(Now())
	cases := []struct {
		name    string
		in      []byte
		armed   uint64
		want    uint32
		counter bpftest.Counters
		passes  uint32 // checked on the output tick when > 0
	}{
		{"due tick leaves", tickFrame(now-uint64(time.Millisecond), tickMagic, 32), now - uint64(time.Millisecond), bpftest.TCActRedirect, bpftest.Counters{}, 0},
		{"tick not due goes round again", tickFrame(now+uint64(time.Hour), tickMagic, 32), now + uint64(time.Hour), bpftest.TCActRedirect, bpftest.Counters{"TickPasses": 1}, 1},
		{"superseded tick dropped", tickFrame(now+uint64(time.Hour), tickMagic, 32), now + uint64(time.Minute), bpftest.TCActShot, bpftest.Counters{"TicksSuperseded": 1}, 0},
		{"tick with a bad magic dropped", tickFrame(now, 0xdead, 32), now, bpftest.TCActShot, bpftest.Counters{"MalformedTicks": 1}, 0},
		{"truncated tick dropped", tickFrame(now, tickMagic, 12), now, bpftest.TCActShot, bpftest.Counters{"MalformedTicks": 1}, 0},
		{"carried packet leaves", udpTo(53), 0, bpftest.TCActRedirect, bpftest.Counters{"CarriedOut": 1}, 0},
		{"truncated Ethernet frame counts as carried and leaves", make([]byte, 14), 0, bpftest.TCActRedirect, bpftest.Counters{"CarriedOut": 1}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.setArmed(c.armed)
			var ret uint32
			var out []byte
			d := f.delta(func() { ret, out = f.run(f.objs.PacerPass, c.in, 0) })
			wantRet(t, ret, c.want)
			wantDelta(t, d, c.counter)
			if c.passes > 0 {
				if got := binary.NativeEndian.Uint32(out[34+28:]); got != c.passes {
					t.Errorf("passes %d, want %d", got, c.passes)
				}
			}
		})
	}
}

// TestFixturesTickResize: on the conveyor without fillers a tick not yet due leaves for its
// next pass resized to the bytes whose transmission time at the rate is what is left of its
// wait, between the smallest tick frame and tick_max_bytes; a due one leaves as it came.
func TestFixturesTickResize(t *testing.T) {
	// 100 kbit/s, 80 us a byte: the run's own time (a loaded machine: milliseconds) moves the
	// size little and makes no case due.
	const rate, maxBytes = 12_500, 4000
	f := newFixtureWith(t, pacerPacerBackendPACER_CONVEYOR, func(c *pacerPacerConfig) {
		c.TickBytes, c.TickMaxBytes, c.RateBytes = 200, maxBytes, rate
		c.EarlyNs, c.CarryEarlyNs = uint64(50*time.Microsecond), 0
	})
	in := tickFrame(0, tickMagic, 32)
	in = append(in, make([]byte, 200-len(in))...) // as pacer_enter sends it: tick_bytes long
	bytesFor := func(left time.Duration) int {
		return min(max(int(left.Microseconds()*rate/1_000_000), tickMinBytes), maxBytes)
	}
	for _, c := range []struct {
		name string
		left time.Duration
	}{
		{"far: the largest frame", time.Hour},
		{"100 ms left: 1250 bytes", 100 * time.Millisecond},
		{"5 ms left: the smallest frame", 5 * time.Millisecond},
		{"due: unchanged", -time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			deadline := Now() + c.left
			frame := slices.Clone(in)
			binary.NativeEndian.PutUint64(frame[14+20+8:], uint64(deadline))
			f.setArmed(uint64(deadline))
			var ret uint32
			var out []byte
			t0 := Now()
			d := f.delta(func() { ret, out = f.run(f.objs.PacerPass, frame, 0) })
			t1 := Now()
			wantRet(t, ret, bpftest.TCActRedirect)
			if d["TickTrimErrors"] != 0 {
				t.Errorf("resize failed: %v", d)
			}
			lo, hi := len(in), len(in) // due: as it came
			if c.left > 0 {
				lo, hi = bytesFor(deadline-t1), bytesFor(deadline-t0)
				if d["TickPasses"] != 1 {
					t.Errorf("not sent round again: %v", d)
				}
			}
			// The test run cuts DataOut to the frame's length.
			if len(out) < lo || len(out) > hi {
				t.Errorf("frame left with %d bytes, want %d..%d", len(out), lo, hi)
			}
		})
	}
}

func TestFixturesFiller(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_CONVEYOR)
	frame := make([]byte, tickMinBytes) // the smallest filler Options allow
	binary.BigEndian.PutUint16(frame[12:], fillerEthP)
	binary.NativeEndian.PutUint64(frame[14:], fillerMagic)
	binary.NativeEndian.PutUint64(frame[22:], uint64(Now()-10*time.Millisecond))
	var ret uint32
	d := f.delta(func() { ret, _ = f.run(f.objs.PacerPass, frame, 0) })
	wantRet(t, ret, bpftest.TCActRedirect)
	if d["FillerPasses"] != 1 || d["PeriodCount"] != 1 {
		t.Errorf("filler pass not counted: %v", d)
	}
	// A due tick rides this filler pass: the filler is cloned out as a tick frame and
	// restored; the tick frame still queued for that deadline is then superseded.
	due := uint64(Now() - time.Millisecond)
	f.setArmed(due)
	var out []byte
	d = f.delta(func() { ret, out = f.run(f.objs.PacerPass, frame, 0) })
	wantRet(t, ret, bpftest.TCActRedirect)
	if d["TicksPiggybacked"] != 1 || d["FillerPasses"] != 1 || d["TickBuildErrors"] != 0 {
		t.Errorf("piggyback not counted: %v", d)
	}
	if string(out[:22]) != string(frame[:22]) {
		t.Errorf("filler not restored: %s", bpftest.DiffBytes(out[:22], frame[:22]))
	}
	var st pacerPacerState
	if err := f.objs.PacerArming.Lookup(uint32(0), &st); err != nil || st.FiredNs != due {
		t.Errorf("fired %d (%v), want %d", st.FiredNs, err, due)
	}
	d = f.delta(func() { ret, _ = f.run(f.objs.PacerPass, frame, 0) })
	if d["TicksPiggybacked"] != 0 {
		t.Errorf("a fired deadline fired again: %v", d)
	}
	d = f.delta(func() { ret, _ = f.run(f.objs.PacerPass, tickFrame(due, tickMagic, 32), 0) })
	wantRet(t, ret, bpftest.TCActShot)
	wantDelta(t, d, bpftest.Counters{"TicksSuperseded": 1})
	f.setArmed(0)
	if err := f.objs.PacerControl.Put(uint32(0), pacerPacerCtl{FillersToDrop: 1}); err != nil {
		t.Fatal(err)
	}
	d = f.delta(func() { ret, _ = f.run(f.objs.PacerPass, frame, 0) })
	wantRet(t, ret, bpftest.TCActShot)
	wantDelta(t, d, bpftest.Counters{"FillersDropped": 1})
}

// storeSlot writes a due or pending echo into slot i.
func (f *fixture) storeSlot(i uint32, deadline uint64, frame []byte) {
	f.t.Helper()
	s := echoEchoSlot{DeadlineNs: deadline, Len: uint32(len(frame)), Busy: 1}
	copy(s.Frame[:], frame)
	if err := f.echo.EchoSlots.Put(i, s); err != nil {
		f.t.Fatal(err)
	}
}

func TestFixturesTick(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	now := uint64(Now())

	t.Run("tick with nothing due", func(t *testing.T) {
		f.setArmed(now)
		var ret uint32
		d := f.delta(func() { ret, _ = f.run(f.echo.EchoTick, tickFrame(now, tickMagic, 32), 0) })
		wantRet(t, ret, bpftest.TCActShot)
		if d["TicksDelivered"] != 1 || d["EchoTicks"] != 1 || d["EchoTicksIdle"] != 1 || d["TicksStale"] != 0 || d["EchoEchoesSent"] != 0 {
			t.Errorf("counters %v", d)
		}
		if a := f.armed(); a != 0 {
			t.Errorf("armed %d after the armed tick was delivered, want 0", a)
		}
	})
	t.Run("stale tick is still delivered and counted", func(t *testing.T) {
		f.setArmed(now + 5)
		d := f.delta(func() { f.run(f.echo.EchoTick, tickFrame(now, tickMagic, 32), 0) })
		if d["TicksDelivered"] != 1 || d["TicksStale"] != 1 {
			t.Errorf("counters %v", d)
		}
		if a := f.armed(); a != now+5 {
			t.Errorf("armed %d, want the newer tick's %d kept", a, now+5)
		}
	})
	t.Run("tick with due work sends it and re-arms for the rest", func(t *testing.T) {
		f.setArmed(now)
		echo := udpTo(9)
		later := uint64(Now() + time.Hour)
		f.storeSlot(0, now-uint64(time.Millisecond), echo)
		f.storeSlot(1, now-uint64(2*time.Millisecond), echo)
		f.storeSlot(2, later, echo)
		var ret uint32
		var out []byte
		d := f.delta(func() { ret, out = f.run(f.echo.EchoTick, tickFrame(now, tickMagic, 32), 0) })
		wantRet(t, ret, bpftest.TCActShot)
		if d["EchoEchoesSent"] != 2 || d["EchoSendErrors"] != 0 || d["TicksArmed"] != 1 || d["EchoRearmed"] != 1 {
			t.Errorf("counters %v", d)
		}
		if string(out) != string(echo) {
			t.Errorf("the tick's skb was not rebuilt as the echo: %s", bpftest.DiffBytes(out, echo))
		}
		if a := f.armed(); a != later {
			t.Errorf("armed %d, want the pending echo's deadline %d", a, later)
		}
		var s echoEchoSlot
		for i, busy := range []uint32{0, 0, 1} {
			if err := f.echo.EchoSlots.Lookup(uint32(i), &s); err != nil || s.Busy != busy {
				t.Errorf("slot %d busy %d (%v), want %d", i, s.Busy, err, busy)
			}
		}
		if err := f.echo.EchoSlots.Put(uint32(2), echoEchoSlot{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("malformed tick dropped", func(t *testing.T) {
		var ret uint32
		d := f.delta(func() { ret, _ = f.run(f.echo.EchoTick, tickFrame(now, 1, 32), 0) })
		wantRet(t, ret, bpftest.TCActShot)
		wantDelta(t, d, bpftest.Counters{"MalformedTicks": 1, "EchoRxMalformed": 1})
	})
	t.Run("carried packet the consumer does not know: dropped", func(t *testing.T) {
		var ret uint32
		d := f.delta(func() { ret, _ = f.run(f.echo.EchoTick, udpTo(53), 0) })
		wantRet(t, ret, bpftest.TCActShot)
		wantDelta(t, d, bpftest.Counters{"EchoCarriedUnknown": 1})
	})
}

func TestFixturesStore(t *testing.T) {
	f := newFixture(t, pacerPacerBackendPACER_NETEM)
	t.Run("datagram to the echo port is stored and a tick requested", func(t *testing.T) {
		f.setArmed(0)
		var ret uint32
		d := f.delta(func() { ret, _ = f.run(f.echo.EchoStore, udpTo(fixturePort), 0) })
		wantRet(t, ret, bpftest.TCActShot)
		wantDelta(t, d, bpftest.Counters{"EchoStored": 1, "TicksRequested": 1, "TicksArmed": 1})
		if f.armed() == 0 {
			t.Error("no tick armed")
		}
	})
	t.Run("a second datagram coalesces with the armed tick", func(t *testing.T) {
		d := f.delta(func() { f.run(f.echo.EchoStore, udpTo(fixturePort), 0) })
		wantDelta(t, d, bpftest.Counters{"EchoStored": 1, "TicksRequested": 1, "TicksCoalesced": 1})
	})
	t.Run("a lost tick is re-armed by the next request", func(t *testing.T) {
		f.setArmed(uint64(Now() - 2*time.Second)) // overdue by more than lost_ns (1s)
		d := f.delta(func() { f.run(f.echo.EchoStore, udpTo(fixturePort), 0) })
		wantDelta(t, d, bpftest.Counters{"EchoStored": 1, "TicksRequested": 1, "TicksArmed": 1, "TicksLost": 1})
	})
	t.Run("other port passes", func(t *testing.T) {
		var ret uint32
		d := f.delta(func() { ret, _ = f.run(f.echo.EchoStore, udpTo(53), 0) })
		wantRet(t, ret, bpftest.TCActUnspec)
		wantDelta(t, d, bpftest.Counters{})
	})
	t.Run("truncated UDP header passes, counted", func(t *testing.T) {
		var ret uint32
		d := f.delta(func() { ret, _ = f.run(f.echo.EchoStore, udpTo(fixturePort)[:38], 0) })
		wantRet(t, ret, bpftest.TCActUnspec)
		wantDelta(t, d, bpftest.Counters{"EchoMalformed": 1})
	})
}
