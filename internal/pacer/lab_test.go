package pacer

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
)

// The lab tests run the reference consumer (a delayed echo) between two namespaces: a
// client process in host a sends datagrams to host b, where echo_store stores each and the
// pacer's tick sends it back after the delay (the echo port), or carries each through the
// pacer until its deadline (the carry port, with Options.Carry). The client measures each
// echo's round trip.

// echoRig is host b's side: the pacer and the echo consumer.
type echoRig struct {
	lab  *lab.Lab
	p    *Pacer
	objs echoObjects
	at   bpfx.Attachment
}

const echoPort, echoCarryPort = 7000, 7001

func newEchoRig(t *testing.T, o Options, delay time.Duration) *echoRig {
	requireEcho(t)
	r := &echoRig{}
	l, err := lab.Up(lab.Spec{Name: "pcr", Hosts: []string{"a", "b"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	r.lab = l
	t.Cleanup(func() {
		if r.at != nil {
			r.at.Close()
		}
		if r.p != nil {
			if err := r.p.Close(); err != nil {
				t.Errorf("close pacer: %v", err)
			}
		}
		r.objs.Close()
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	b := l.Host("b")
	o.Netns = b.Handle
	o.Name = "pacer-lab"
	if r.p, err = New(o); err != nil {
		if o.Backend != BackendAuto && o.Backend != BackendConveyor {
			t.Skipf("backend %s not available here: %v", o.Backend, err)
		}
		t.Fatalf("new pacer: %v", err)
	}
	spec, err := loadEcho()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables["echo_cfg"].Set(echoEchoConfig{OutIfindex: uint32(b.IfIndex), Port: bpfx.Htons(echoPort),
		CarryPort: bpfx.Htons(echoCarryPort), DelayNs: uint64(delay)}); err != nil {
		t.Fatal(err)
	}
	var opts ebpf.CollectionOptions
	if err := r.p.Client().Bind(spec, &opts); err != nil {
		t.Fatal(err)
	}
	if err := bpfx.LoadAndAssign("echo", spec, &r.objs, &opts); err != nil {
		t.Fatal(err)
	}
	if err := r.p.Start(r.objs.EchoTick); err != nil {
		t.Fatalf("start pacer: %v", err)
	}
	if r.at, err = bpfx.AttachTC(r.objs.EchoStore, bpfx.TCTarget{Netns: b.Handle, IfIndex: b.IfIndex, Dir: bpfx.Ingress, Name: "echo_store"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("backend %s calibration %+v", r.p.Backend(), r.p.Calibration())
	return r
}

// echoClientEnv makes the test binary an echo client (TestEchoClientProcess).
const echoClientEnv = "KEDGE_PACER_ECHO_CLIENT"

// runClient runs the test binary as a client process in host a, sending to port of host b:
// count rounds, burst datagrams per round sent back to back, gap between rounds. It returns
// the round trips.
func (r *echoRig) runClient(t *testing.T, port, count, burst int, gap time.Duration) []time.Duration {
	t.Helper()
	a, b := r.lab.Host("a"), r.lab.Host("b")
	cmd := a.Command(os.Args[0], "-test.run=^TestEchoClientProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%d,%s", echoClientEnv,
		net.JoinHostPort(b.IPv4.String(), strconv.Itoa(port)), count, burst, gap, 2*time.Second))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := a.Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		st, _ := r.p.Stats()
		t.Fatalf("echo client: %v\n%s\npacer counters %v, echo counters %v", err, out.String(), nonZero(st.Counters), r.echoCounters(t))
	}
	var rtts []time.Duration
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "rtt_ns "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("client output %q: %v", sc.Text(), err)
			}
			rtts = append(rtts, time.Duration(n))
		}
	}
	if len(rtts) != count*burst {
		t.Fatalf("%d echoes of %d came back\n%s", len(rtts), count*burst, out.String())
	}
	return rtts
}

func (r *echoRig) echoCounters(t *testing.T) map[string]uint64 {
	s, err := bpfx.SumPerCPU[echoEchoStats](r.objs.EchoCounters, uint32(0), bpfx.Extrema)
	if err != nil {
		t.Fatal(err)
	}
	return counterMapOf(s)
}

// TestEchoClientProcess is the client process itself (skipped unless the parent set the env).
func TestEchoClientProcess(t *testing.T) {
	spec := os.Getenv(echoClientEnv)
	if spec == "" {
		t.Skip("the echo client process of the lab tests (started by them)")
	}
	f := strings.Split(spec, ",")
	count, _ := strconv.Atoi(f[1])
	burst, _ := strconv.Atoi(f[2])
	gap, _ := strconv.ParseInt(f[3], 10, 64)
	wait, _ := time.ParseDuration(f[4])
	conn, err := net.Dial("udp", f[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 64)
	for i := 0; i < count; i++ {
		sent := map[uint32]time.Time{}
		for j := 0; j < burst; j++ {
			id := uint32(i*burst + j)
			binary.BigEndian.PutUint32(buf, id)
			sent[id] = time.Now()
			if _, err := conn.Write(buf[:16]); err != nil {
				t.Fatal(err)
			}
		}
		for len(sent) > 0 {
			_ = conn.SetReadDeadline(time.Now().Add(wait))
			n, err := conn.Read(buf)
			if err != nil {
				t.Fatalf("round %d: %d echoes missing: %v", i, len(sent), err)
			}
			id := binary.BigEndian.Uint32(buf[:n])
			if s, ok := sent[id]; ok {
				fmt.Printf("rtt_ns %d\n", time.Since(s).Nanoseconds())
				delete(sent, id)
			}
		}
		time.Sleep(time.Duration(gap))
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// checkEchoes: every echo came back no earlier than the delay minus half a pass (a tick's,
// or a carried packet's with carried) and a margin for the clocks of two processes, and on
// real CPUs no later than a generous bound. Figures are printed; the bound catches a pacer
// that does not tick, not a slow machine.
func checkEchoes(t *testing.T, r *echoRig, rtts []time.Duration, delay time.Duration, carried bool) {
	t.Helper()
	pass := r.p.pass(carried)
	lo := delay - pass/2 - 200*time.Microsecond
	hi := delay + 2*pass + 200*time.Millisecond
	late := make([]time.Duration, len(rtts))
	// In emulated (TCG) matrix guests time means nothing beyond the lower bound: an echo
	// must not come early; how late it comes is printed only.
	upper := !bpftest.InGuest()
	for i, v := range rtts {
		late[i] = v - delay
		if v < lo || (upper && v > hi) {
			t.Errorf("echo %d after %v: want %v..%v (delay %v, pass %v)", i, v, lo, hi, delay, pass)
		}
	}
	st, err := r.p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("backend %s carried %v delay %v: echo round trip minus delay p50 %v p99 %v max %v (n=%d); pacer tick lateness %+v",
		r.p.Backend(), carried, delay, quantile(late, 0.5), quantile(late, 0.99), slices.Max(late), len(late), st.Precision)
	t.Logf("pacer counters %v", nonZero(st.Counters))
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// backendsToTest: every backend; those the kernel lacks skip in newEchoRig.
var backendsToTest = []string{BackendEDT, BackendNetem, BackendConveyor}

func TestLabEcho(t *testing.T) {
	const delay = 5 * time.Millisecond
	type run struct {
		name string
		o    Options
	}
	var runs []run
	for _, b := range backendsToTest {
		runs = append(runs, run{b, Options{Backend: b, Period: time.Millisecond}})
	}
	// Carry: edt and netem carry with their own passes; the conveyor keeps a 10ms filler
	// queue and ticks ride the filler passes. The conveyor's not in emulated guests: tbf
	// paces the fillers in real time, which TCG does not keep.
	runs = append(runs, run{"edt-carry", Options{Backend: BackendEDT, Period: time.Millisecond, Carry: true}},
		run{"netem-carry", Options{Backend: BackendNetem, Period: time.Millisecond, Carry: true}})
	if !bpftest.InGuest() {
		runs = append(runs, run{"conveyor-carry", Options{Backend: BackendConveyor, Period: 10 * time.Millisecond, Carry: true}})
	}
	watchdogDone := false
	for _, c := range runs {
		t.Run(c.name, func(t *testing.T) {
			r := newEchoRig(t, c.o, delay)
			rtts := r.runClient(t, echoPort, 20, 1, 3*time.Millisecond)
			checkEchoes(t, r, rtts, delay, false)
			// Bursts: several echoes due at one tick, each a clone of the tick's skb.
			rtts = r.runClient(t, echoPort, 5, 4, 3*time.Millisecond)
			checkEchoes(t, r, rtts, delay, false)
			st, err := r.p.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.Counters["ticks_delivered"] >= 20+5*4+5 {
				t.Errorf("%d ticks delivered for 40 echoes in 25 rounds: a burst should share ticks", st.Counters["ticks_delivered"])
			}
			if c.o.Carry {
				r.checkCarry(t, delay)
			}
			r.checkIdle(t)
			if !watchdogDone {
				r.checkWatchdog(t)
				watchdogDone = true
			}
		})
	}
}

// checkCarry sends datagrams the consumer carries through the pacer (pacer_carry) until
// their deadline. On edt each rides one pass, its deadline travelling as the clone's delivery
// time: a carried packet that came back at once (its time lost on the way) would be sent
// round again and again until due, so recirculations stay below one per datagram (fq may
// release one a little early).
func (r *echoRig) checkCarry(t *testing.T, delay time.Duration) {
	t.Helper()
	const n = 20
	before, _ := r.p.Stats()
	ebefore := r.echoCounters(t)
	rtts := r.runClient(t, echoCarryPort, n, 1, 3*time.Millisecond)
	checkEchoes(t, r, rtts, delay, true)
	after, err := r.p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	eafter := r.echoCounters(t)
	carried, recirc := eafter["carried"]-ebefore["carried"], eafter["recirculated"]-ebefore["recirculated"]
	t.Logf("carried %d, recirculated %d, edt_set %d", carried, recirc, after.Counters["edt_set"]-before.Counters["edt_set"])
	if carried != n || after.Counters["carried_in"]-before.Counters["carried_in"] < n {
		t.Errorf("carried %d (pacer carried_in %d), want %d", carried, after.Counters["carried_in"]-before.Counters["carried_in"], n)
	}
	if r.p.Backend() == BackendEDT {
		if set := after.Counters["edt_set"] - before.Counters["edt_set"]; set != carried+recirc {
			t.Errorf("edt_set %d, want one per carry and recirculation (%d)", set, carried+recirc)
		}
		if recirc >= n {
			t.Errorf("%d recirculations for %d carried datagrams on edt: the deadline did not travel with them", recirc, n)
		}
	}
}

// checkIdle: with nothing pending the pacer sends nothing round (no tick passes, no
// fillers without carry) - "ticks only while something is pending".
func (r *echoRig) checkIdle(t *testing.T) {
	t.Helper()
	// Wait until the last tick has been delivered and nothing is armed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := r.p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.ArmedNs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a tick is still armed (%d) with nothing pending", st.ArmedNs)
		}
		time.Sleep(time.Millisecond)
	}
	before, _ := r.p.Stats()
	time.Sleep(300 * time.Millisecond) // an idle window to observe, not synchronisation
	after, err := r.p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"ticks_entered", "tick_passes", "filler_passes", "ticks_delivered"} {
		if d := after.Counters[c] - before.Counters[c]; d != 0 && !(c == "filler_passes" && r.p.opts.Carry) {
			t.Errorf("idle pacer: %s went up by %d in 300ms", c, d)
		}
	}
}

// checkWatchdog: a tick lost inside the pacer (state says armed, nothing is in flight) is
// re-armed by the watchdog within LostAfter, with no request to do it.
func (r *echoRig) checkWatchdog(t *testing.T) {
	t.Helper()
	// Pretend a tick was armed long ago and lost: state says armed, nothing is in flight.
	if err := r.p.objs.PacerArming.Put(uint32(0), pacerPacerState{ArmedNs: uint64(Now() - time.Second)}); err != nil {
		t.Fatal(err)
	}
	before, _ := r.p.Stats()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := r.p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.Counters["ticks_delivered"] > before.Counters["ticks_delivered"] && st.ArmedNs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watchdog did not re-arm the lost tick: %v", nonZero(st.Counters))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
