package lab

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// fixtureNS runs fn in a fresh namespace: BPF_PROG_TEST_RUN gives the packet that
// namespace's loopback (ifindex 1), so a duplicate cloned back "into the port" lands there.
func fixtureNS(t *testing.T, fn func() error) {
	t.Helper()
	ns, err := netnsx.New(netnsx.OwnedName("fabfix"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.Do(fn); err != nil {
		t.Fatal(err)
	}
}

func TestFabricProgramFixtures(t *testing.T) {
	requireRoot(t)
	// The test packet arrives on ifindex 1 (loopback): host 1. Hosts 2..7 each carry one rule.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	addr4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i), 2}) }
	addr6 := func(i int) netip.Addr { return v6(uint16(i), 2) }
	rules := map[int]fabricFabFault{
		2: {Partition: 1},
		3: {Loss: math.MaxUint32},
		4: {Dup: math.MaxUint32},
		5: {Delay: math.MaxUint32},
		// 6: no rule
		7: {}, // a rule that does nothing
		8: {Dup: math.MaxUint32, Delay: math.MaxUint32},
	}
	// load loads the program with a delay device (0: none) and fills its maps.
	load := func(delayIfindex uint32) *fabricObjects {
		t.Helper()
		var objs fabricObjects
		must(loadFabricProgram(&objs, delayIfindex))
		t.Cleanup(func() { objs.Close() })
		must(objs.FabPorts.Put(uint32(1), uint32(1)))
		for i := 2; i <= 8; i++ {
			must(objs.FabHosts.Put(addr4(i).As16(), uint32(i)))
			must(objs.FabHosts.Put(addr6(i).As16(), uint32(i)))
		}
		for dst, r := range rules {
			must(objs.FabLinks.Put(fabricFabLinkKey{Src: 1, Dst: uint32(dst)}, r))
		}
		return &objs
	}
	objs := load(0)
	udp4 := func(dst int) []byte {
		return pktbuild.New().IPv4(pktbuild.IPv4{Src: addr4(1), Dst: addr4(dst)}).UDP(pktbuild.UDP{Src: 1, Dst: 2}).Payload([]byte("x")).Build()
	}
	udp6 := func(dst int) []byte {
		return pktbuild.New().IPv6(pktbuild.IPv6{Src: addr6(1), Dst: addr6(dst)}).UDP(pktbuild.UDP{Src: 1, Dst: 2}).Payload([]byte("x")).Build()
	}
	arp := append(make([]byte, 12), 0x08, 0x06)
	arp = append(arp, make([]byte, 28)...)
	counters := func() (bpftest.Counters, error) { return bpftest.SumPerCPU[fabricFabStats](objs.FabCounters) }
	r := bpftest.Runner{Prog: objs.FabricIngress, Counters: counters}
	cases := []bpftest.Case{
		{Name: "arp passes", In: arp, WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"NotIp": 1}},
		{Name: "ethernet only", In: arp[:14], WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"NotIp": 1}},
		// (BPF_PROG_TEST_RUN refuses IP frames shorter than the fixed IP header.)
		{Name: "ipv4 options beyond the packet", In: pktbuild.Truncate(pktbuild.New().IPv4(pktbuild.IPv4{Src: addr4(1), Dst: addr4(2), IHL: ptr(15)}).UDP(pktbuild.UDP{}).Build(), 14+24),
			WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"Malformed": 1}},
		{Name: "ipv6 wrong version", In: pktbuild.New().IPv6(pktbuild.IPv6{Src: addr6(1), Dst: addr6(2), Version: ptr(4)}).UDP(pktbuild.UDP{}).Build(),
			WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"Malformed": 1}},
		{Name: "ipv4 ihl too small", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: addr4(1), Dst: addr4(2), IHL: ptr(4)}).UDP(pktbuild.UDP{}).Build(),
			WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"Malformed": 1}},
		{Name: "unknown destination", In: pktbuild.New().IPv4(pktbuild.IPv4{Src: addr4(1), Dst: netip.MustParseAddr("198.18.99.2")}).UDP(pktbuild.UDP{}).Build(),
			WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"NoHost": 1}},
		{Name: "partition v4", In: udp4(2), WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"Partitioned": 1}},
		{Name: "partition v6", In: udp6(2), WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"Partitioned": 1}},
		{Name: "loss", In: udp4(3), WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"Lost": 1}},
		{Name: "dup", In: udp6(4), WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"Duplicated": 1, "Passed": 1}},
		{Name: "delay without device", In: udp4(5), WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"DelayOff": 1}},
		{Name: "no rule", In: udp4(6), WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"NoRule": 1}},
		{Name: "empty rule", In: udp6(7), WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"Passed": 1}},
	}
	fixtureNS(t, func() error { r.Run(t, cases); return nil })

	// With a delay device: the program redirects (the test run reports the verdict only).
	delayed := load(1)
	r = bpftest.Runner{Prog: delayed.FabricIngress, Counters: func() (bpftest.Counters, error) {
		return bpftest.SumPerCPU[fabricFabStats](delayed.FabCounters)
	}}
	fixtureNS(t, func() error {
		r.Run(t, []bpftest.Case{
			{Name: "delay", In: udp4(5), WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"Delayed": 1}},
			{Name: "dup and delay", In: udp4(8), WantRet: bpftest.TCActRedirect, WantCounters: bpftest.Counters{"Duplicated": 1, "Delayed": 1}},
		})
		return nil
	})

	// A copy coming back (dup mark) passes untouched, even on a partitioned link, and loses its mark.
	r = bpftest.Runner{Prog: objs.FabricIngress, Counters: counters}
	fixtureNS(t, func() error {
		r.Run(t, []bpftest.Case{{Name: "dup copy", In: udp4(2), Skb: &bpftest.SkBuff{Mark: dupMark},
			WantRet: bpftest.TCActUnspec, WantSame: true, WantMark: bpftest.Mark(0), WantCounters: bpftest.Counters{"DupCopy": 1}}})
		return nil
	})
}

func ptr(v int) *int { return &v }

// sink counts the datagrams a host receives per sender and how many arrived out of order.
type sink struct {
	addr netip.AddrPort
	conn *net.UDPConn

	mu       sync.Mutex
	got      map[netip.Addr]int
	last     map[netip.Addr]uint32
	reorders map[netip.Addr]int
}

func newSink(t *testing.T, h *Host) *sink {
	t.Helper()
	s := &sink{got: map[netip.Addr]int{}, last: map[netip.Addr]uint32{}, reorders: map[netip.Addr]int{}}
	err := h.Do(func() (err error) {
		s.conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h.IPv4, 0)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.conn.SetReadBuffer(4 << 20)
	s.addr = s.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	t.Cleanup(func() { s.conn.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := s.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if n < 4 {
				continue
			}
			seq := binary.BigEndian.Uint32(buf)
			s.mu.Lock()
			a := from.Addr()
			s.got[a]++
			if seq < s.last[a] {
				s.reorders[a]++
			} else {
				s.last[a] = seq
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sink) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.got)
	clear(s.last)
	clear(s.reorders)
}

func (s *sink) count(from netip.Addr) (got, reorders int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[from], s.reorders[from]
}

// send sends n numbered datagrams from h to addr, paced lightly so no socket buffer overflows.
func send(t *testing.T, h *Host, to netip.AddrPort, n int) {
	t.Helper()
	var conn *net.UDPConn
	err := h.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 64)
	for i := range n {
		binary.BigEndian.PutUint32(buf, uint32(i+1))
		if _, err := conn.Write(buf); err != nil {
			t.Fatalf("send %d from %s: %v", i, h.HostName, err)
		}
		if i%32 == 31 {
			time.Sleep(100 * time.Microsecond) // pacing a sender, not synchronising
		}
	}
}

// settle waits until the sink's count from src reaches want or stops growing, and returns it.
func settle(s *sink, src netip.Addr, want int) int {
	deadline := time.Now().Add(5 * time.Second)
	last, lastChange := -1, time.Now()
	for time.Now().Before(deadline) {
		got, _ := s.count(src)
		if got >= want {
			return got
		}
		if got != last {
			last, lastChange = got, time.Now()
		} else if time.Since(lastChange) > 300*time.Millisecond {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
	got, _ := s.count(src)
	return got
}

func TestFaultFabricUDP(t *testing.T) {
	l, f := faultLab(t, "fab", Router, "a", "b", "c")
	if f.DelayBackend() != "tun" {
		t.Fatalf("router fabric: delay backend %q, want tun", f.DelayBackend())
	}
	a, b, c := l.Host("a"), l.Host("b"), l.Host("c")
	sa, sb, sc := newSink(t, a), newSink(t, b), newSink(t, c)
	const n = 400

	// round sends n datagrams on each given link and returns what arrived (and reorderings),
	// with the fabric's counter deltas.
	type flow struct{ from, to *Host }
	sinkOf := map[*Host]*sink{a: sa, b: sb, c: sc}
	round := func(t *testing.T, flows ...flow) ([]int, []int, FabricStats) {
		t.Helper()
		for _, s := range sinkOf {
			s.reset()
		}
		before, err := f.Stats()
		if err != nil {
			t.Fatal(err)
		}
		for _, fl := range flows {
			send(t, fl.from, sinkOf[fl.to].addr, n)
		}
		got, reord := make([]int, len(flows)), make([]int, len(flows))
		for i, fl := range flows {
			got[i] = settle(sinkOf[fl.to], fl.from.IPv4, 10*n)
			_, reord[i] = sinkOf[fl.to].count(fl.from.IPv4)
		}
		after, err := f.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return got, reord, statsSub(after, before)
	}

	t.Run("no fault", func(t *testing.T) {
		got, _, st := round(t, flow{a, b}, flow{b, a})
		if got[0] != n || got[1] != n || st.NoRule != 2*n {
			t.Errorf("got %v of %d each, no_rule %d", got, n, st.NoRule)
		}
	})
	t.Run("symmetric partition", func(t *testing.T) {
		must(t, f.Partition([]string{"a"}, []string{"b", "c"}))
		defer func() { must(t, f.Heal()) }()
		must(t, nil)
		got, _, st := round(t, flow{a, b}, flow{b, a}, flow{b, c}, flow{c, a})
		if got[0] != 0 || got[1] != 0 || got[3] != 0 || got[2] != n {
			t.Errorf("a|bc: a->b %d, b->a %d, b->c %d, c->a %d (want 0 0 %d 0)", got[0], got[1], got[2], got[3], n)
		}
		if st.Partitioned != 3*n {
			t.Errorf("partitioned %d, want %d", st.Partitioned, 3*n)
		}
	})
	t.Run("one-way partition", func(t *testing.T) {
		must(t, f.Set(LinkFault{Partition: true}, OneWay([]string{"a"}, []string{"b"})...))
		defer func() { must(t, f.Heal()) }()
		got, _, st := round(t, flow{a, b}, flow{b, a}, flow{a, c})
		if got[0] != 0 || got[1] != n || got[2] != n || st.Partitioned != n {
			t.Errorf("a->b cut: a->b %d, b->a %d, a->c %d, partitioned %d", got[0], got[1], got[2], st.Partitioned)
		}
	})
	t.Run("node partition", func(t *testing.T) {
		must(t, f.Set(LinkFault{Partition: true}, f.NodeLinks("c")...))
		defer func() { must(t, f.Heal()) }()
		got, _, _ := round(t, flow{a, c}, flow{c, b}, flow{a, b})
		if got[0] != 0 || got[1] != 0 || got[2] != n {
			t.Errorf("c isolated: a->c %d, c->b %d, a->b %d", got[0], got[1], got[2])
		}
	})
	t.Run("loss", func(t *testing.T) {
		must(t, f.Set(LinkFault{Loss: 0.3}, Link{"a", "b"}))
		defer func() { must(t, f.Heal()) }()
		got, _, st := round(t, flow{a, b}, flow{a, c})
		if uint64(got[0])+st.Lost != n || got[1] != n {
			t.Errorf("loss 30%%: a->b %d + lost %d != %d (a->c %d)", got[0], st.Lost, n, got[1])
		}
		// 120 expected, sd 9: outside 40..200 means the probability is wrong, not bad luck.
		if st.Lost < 40 || st.Lost > 200 {
			t.Errorf("loss 30%% of %d: %d lost", n, st.Lost)
		}
	})
	t.Run("duplication", func(t *testing.T) {
		must(t, f.Set(LinkFault{Dup: 1}, Link{"a", "b"}))
		must(t, f.Set(LinkFault{Dup: 0.5}, Link{"b", "a"}))
		defer func() { must(t, f.Heal()) }()
		got, _, st := round(t, flow{a, b}, flow{b, a})
		if got[0] != 2*n {
			t.Errorf("dup 100%%: a->b %d, want %d", got[0], 2*n)
		}
		if uint64(got[1]) != n+st.Duplicated-n || st.DupCopy != st.Duplicated || st.DupFailed != 0 {
			t.Errorf("dup 50%%: b->a %d, duplicated %d (of which %d for a->b), copies %d, failed %d",
				got[1], st.Duplicated, n, st.DupCopy, st.DupFailed)
		}
		if half := st.Duplicated - n; half < 100 || half > 300 {
			t.Errorf("dup 50%% of %d: %d copies", n, half)
		}
	})
	t.Run("delay", func(t *testing.T) {
		const d = 40 * time.Millisecond
		must(t, f.Set(LinkFault{Delay: d}, Link{"a", "b"}))
		defer func() { must(t, f.Heal()) }()
		got, _, st := round(t, flow{a, b})
		if got[0] != n || st.Delayed != n || st.DelayReleased != n {
			t.Errorf("delay: got %d, delayed %d, released %d, want %d", got[0], st.Delayed, st.DelayReleased, n)
		}
		// A lower bound only: a packet cannot come back before it was held d.
		echo := udpEcho(t, b, b.IPv4)
		start := time.Now()
		roundTrip(t, a, echo)
		if rtt := time.Since(start); rtt < d {
			t.Errorf("round trip a->b->a %v, below the %v delay on a->b", rtt, d)
		}
	})
	t.Run("reordering", func(t *testing.T) {
		must(t, f.Set(LinkFault{Delay: 20 * time.Millisecond, DelayShare: 0.3}, Link{"a", "b"}))
		defer func() { must(t, f.Heal()) }()
		got, reord, st := round(t, flow{a, b})
		if got[0] != n || reord[0] == 0 {
			t.Errorf("reorder: got %d of %d, %d out of order (delayed %d)", got[0], n, reord[0], st.Delayed)
		}
		t.Logf("30%% delayed by 20ms: %d of %d arrived out of order", reord[0], n)
	})
	t.Run("tcp through every fault", func(t *testing.T) {
		fault := LinkFault{Loss: 0.02, Dup: 0.05, Delay: 2 * time.Millisecond, Jitter: 3 * time.Millisecond, DelayShare: 0.5}
		must(t, f.Set(fault, Link{"a", "b"}, Link{"b", "a"}))
		defer func() { must(t, f.Heal()) }()
		before, _ := f.Stats()
		tcpTransfer(t, a, b, 1<<20)
		after, _ := f.Stats()
		st := statsSub(after, before)
		if st.Lost == 0 || st.Duplicated == 0 || st.Delayed == 0 {
			t.Errorf("tcp under faults: lost %d, duplicated %d, delayed %d: each should be > 0", st.Lost, st.Duplicated, st.Delayed)
		}
	})
	t.Run("validation", func(t *testing.T) {
		for _, bad := range []LinkFault{{Loss: 1.5}, {Dup: -0.1}, {Delay: -time.Second}, {DelayShare: 0.5}, {Delay: time.Hour}} {
			if err := f.Set(bad, Link{"a", "b"}); err == nil {
				t.Errorf("Set(%+v) accepted", bad)
			}
		}
		if err := f.Set(LinkFault{Loss: 0.1}, Link{"a", "zz"}); err == nil {
			t.Error("unknown host accepted")
		}
		if err := f.Set(LinkFault{Loss: 0.1}, Link{"a", "a"}); err == nil {
			t.Error("self link accepted")
		}
		if len(f.Rules()) != 0 {
			t.Errorf("rules left after rejected sets: %v", f.Rules())
		}
	})
}

func TestFaultFabricBridge(t *testing.T) {
	l, f := faultLab(t, "fabbr", Bridge, "a", "b")
	if err := f.Set(LinkFault{Delay: time.Millisecond}, Link{"a", "b"}); err == nil {
		t.Error("delay on a bridge fabric accepted")
	}
	sb := newSink(t, l.Host("b"))
	must(t, f.Set(LinkFault{Dup: 1}, Link{"a", "b"}))
	send(t, l.Host("a"), sb.addr, 100)
	if got := settle(sb, l.Host("a").IPv4, 200); got != 200 {
		t.Errorf("bridge dup 100%%: got %d of 200", got)
	}
	must(t, f.Partition([]string{"a"}, []string{"b"}))
	sb.reset()
	send(t, l.Host("a"), sb.addr, 100)
	if got := settle(sb, l.Host("a").IPv4, 1); got != 0 {
		t.Errorf("bridge partition: %d arrived", got)
	}
}

// faultLab brings up a lab with its fault fabric; both go when the test ends.
func faultLab(t *testing.T, name string, fabric Fabric, hosts ...string) (*Lab, *FaultFabric) {
	t.Helper()
	requireRoot(t)
	l, err := Up(Spec{Name: name, Fabric: fabric, Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	f, err := l.Faults()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("fault fabric close: %v", err)
		}
	})
	return l, f
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func statsSub(a, b FabricStats) FabricStats {
	return FabricStats{
		Passed: a.Passed - b.Passed, NoRule: a.NoRule - b.NoRule, Partitioned: a.Partitioned - b.Partitioned,
		Lost: a.Lost - b.Lost, Duplicated: a.Duplicated - b.Duplicated, DupFailed: a.DupFailed - b.DupFailed,
		DupCopy: a.DupCopy - b.DupCopy, Delayed: a.Delayed - b.Delayed, DelayOff: a.DelayOff - b.DelayOff,
		DelayFailed: a.DelayFailed - b.DelayFailed, NotIP: a.NotIP - b.NotIP, Malformed: a.Malformed - b.Malformed,
		NoHost: a.NoHost - b.NoHost, DelayReleased: a.DelayReleased - b.DelayReleased,
		DelayOverflow: a.DelayOverflow - b.DelayOverflow, DelayWriteErr: a.DelayWriteErr - b.DelayWriteErr,
	}
}

// tcpTransfer sends size bytes from a to b over TCP and checks they arrive intact.
func tcpTransfer(t *testing.T, a, b *Host, size int) {
	t.Helper()
	var ln net.Listener
	err := b.Do(func() (err error) { ln, err = net.Listen("tcp", netip.AddrPortFrom(b.IPv4, 0).String()); return err })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	res := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		buf, err := io.ReadAll(c)
		if err == nil && len(buf) != size {
			err = fmt.Errorf("received %d bytes, want %d", len(buf), size)
		}
		for i := 0; err == nil && i < len(buf); i++ {
			if buf[i] != byte(i*7) {
				err = fmt.Errorf("byte %d corrupted", i)
			}
		}
		res <- err
	}()
	var c net.Conn
	err = a.Do(func() (err error) { c, err = net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second); return err })
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-res; err != nil {
		t.Fatalf("tcp transfer: %v", err)
	}
}
