package pping

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// capture is an AF_PACKET socket on one interface that records, with the kernel's receive
// timestamps (SO_TIMESTAMPNS: the time the packet entered the stack, for outgoing packets
// the time it was handed to the driver), the first arrival of each TCP data segment's TSval
// and the first departure of each ACK's TSecr: the points a tap on the link would see.
type capture struct {
	fd int

	mu      sync.Mutex
	dataIn  map[uint32]int64 // TSval of incoming data -> first time seen (CLOCK_REALTIME ns)
	ackOut  map[uint32]int64 // TSecr of outgoing ACKs -> first time seen
	packets int
}

func startCapture(t *testing.T, ns *netnsx.Netns, ifindex int) *capture {
	t.Helper()
	c := &capture{dataIn: map[uint32]int64{}, ackOut: map[uint32]int64{}}
	proto := int(bpfx.Htons(unix.ETH_P_ALL))
	if err := ns.Do(func() (err error) {
		c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		return err
	}); err != nil {
		t.Fatalf("packet socket: %v", err)
	}
	if err := unix.Bind(c.fd, &unix.SockaddrLinklayer{Protocol: bpfx.Htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		unix.Close(c.fd)
		t.Fatalf("bind packet socket: %v", err)
	}
	if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		unix.Close(c.fd)
		t.Fatalf("SO_TIMESTAMPNS: %v", err)
	}
	_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	tv := unix.Timeval{Usec: 100_000}
	_ = unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		buf, oob := make([]byte, 256), make([]byte, 128)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, oobn, _, from, err := unix.Recvmsg(c.fd, buf, oob, unix.MSG_TRUNC)
			if err != nil {
				continue // timeout: look at stop again
			}
			ts := rxTime(oob[:oobn])
			sll, _ := from.(*unix.SockaddrLinklayer)
			if ts == 0 || sll == nil {
				continue
			}
			c.record(buf[:min(n, len(buf))], n, sll.Pkttype == unix.PACKET_OUTGOING, ts)
		}
	}()
	t.Cleanup(func() { close(stop); <-done; unix.Close(c.fd) })
	return c
}

// rxTime returns the SCM_TIMESTAMPNS time in ns (0: none).
func rxTime(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return ts.Nano()
		}
	}
	return 0
}

// record parses an Ethernet/IPv4/TCP frame (headers only; wire is its full length).
func (c *capture) record(b []byte, wire int, outgoing bool, ts int64) {
	if len(b) < 14+20 || binary.BigEndian.Uint16(b[12:]) != 0x0800 || b[14+9] != unix.IPPROTO_TCP {
		return
	}
	ihl := int(b[14]&0x0f) * 4
	tcp := 14 + ihl
	if len(b) < tcp+20 {
		return
	}
	doff := int(b[tcp+12]>>4) * 4
	payload := int(binary.BigEndian.Uint16(b[16:])) - ihl - doff
	tsval, tsecr, ok := tcpTimestamps(b[tcp+20 : min(len(b), tcp+doff)])
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.packets++
	if !outgoing && payload > 0 {
		if _, seen := c.dataIn[tsval]; !seen {
			c.dataIn[tsval] = ts
		}
	}
	if outgoing && b[tcp+13]&0x10 != 0 {
		if _, seen := c.ackOut[tsecr]; !seen {
			c.ackOut[tsecr] = ts
		}
	}
}

// tcpTimestamps finds the timestamp option in TCP options.
func tcpTimestamps(opts []byte) (tsval, tsecr uint32, ok bool) {
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			return 0, 0, false
		case 1:
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 {
			return 0, 0, false
		}
		if opts[i] == 8 && opts[i+1] == 10 && i+10 <= len(opts) {
			return binary.BigEndian.Uint32(opts[i+2:]), binary.BigEndian.Uint32(opts[i+6:]), true
		}
		i += int(opts[i+1])
	}
	return 0, 0, false
}

// rtt is the capture's RTT of identifier id: first ACK out echoing it minus first data in
// carrying it.
func (c *capture) rtt(id uint32) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok1 := c.dataIn[id]
	out, ok2 := c.ackOut[id]
	return time.Duration(out - in), ok1 && ok2 && out >= in
}

// TestTimestampPoint compares kedge's RTTs with a packet capture on the same interface,
// sample by sample, on forwarded TCP (ePPing's middlebox vantage point: the router's
// sender-facing interface, data arriving, ACKs leaving). The capture's times are where a
// tap on the link would see the packets: an incoming frame when it enters the stack (before
// the softirq backlog and TC ingress), an outgoing one when it goes to the driver (after TC
// egress and the qdisc). kedge's points lie between them, so for every pair
// 0 < kedge <= capture, and capture - kedge is what the host itself adds on the way in and
// out. With -I xdp the data's timestamp moves before the capture's (XDP runs before the
// stack builds and queues the skb), so there the pairs are only reported.
func TestTimestampPoint(t *testing.T) {
	for _, hook := range []IngressHook{IngressTC, IngressXDP} {
		t.Run(hook.String(), func(t *testing.T) { testTimestampPoint(t, hook) })
	}
}

func testTimestampPoint(t *testing.T, hook IngressHook) {
	l, err := lab.Up(lab.Spec{Name: "tsp", Fabric: lab.Router, Hosts: []string{"sender", "receiver"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	defer l.Close()
	sender, receiver := l.Host("sender"), l.Host("receiver")
	fh, err := netlink.NewHandleAt(l.Fabric.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	v1, err := fh.LinkByName("v1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.RateLimit = 10 * time.Millisecond
	cfg.IngressHook = hook
	m, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	capt := startCapture(t, l.Fabric, v1.Attrs().Index)
	if err := m.Attach(l.Fabric.Handle, v1.Attrs().Index, bpfx.TCAuto); err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, col) }()
	defer func() { cancel(); <-done }()

	// 1 s of bulk TCP from sender to receiver through the router, at 200 Mbit/s so the
	// capture keeps up with every frame.
	shape(t, sender, 200e6)
	to := serveTCP(t, receiver, receiver.IPv4, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	conn := dialTCP(t, sender, to.String())
	buf := make([]byte, 64<<10)
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		if _, err := conn.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	all := waitAllRead(t, m, col)

	// A frame the capture dropped could make it see an identifier first on a later packet;
	// then the pairs are only reported.
	st, err := unix.GetsockoptTpacketStats(capt.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	strict := hook == IngressTC && err == nil && st.Drops == 0
	if err == nil && st.Drops > 0 {
		t.Logf("the capture dropped %d of %d frames: pairs reported, not checked", st.Drops, st.Packets)
	}
	var diffs, kedge []time.Duration
	for _, e := range col.rtts(func(e *RTTEvent) bool {
		return e.Flow.IDType == IDTCPTimestamp && e.Flow.Src.Addr() == netip.AddrFrom4(receiver.IPv4.As4())
	}) {
		ref, ok := capt.rtt(uint32(e.ID))
		if !ok {
			continue
		}
		if strict && (e.RTT <= 0 || e.RTT > ref) {
			t.Errorf("TSval %d: kedge %v, capture %v: want 0 < kedge <= capture", e.ID, e.RTT, ref)
		}
		diffs = append(diffs, ref-e.RTT)
		kedge = append(kedge, e.RTT)
	}
	if len(diffs) < 10 && !emulated || len(diffs) == 0 {
		t.Fatalf("%d samples paired with the capture (%d captured packets, counters %+v), want at least 10", len(diffs), capt.packets, all[HookIngress])
	}
	slices.Sort(diffs)
	t.Logf("%s ingress: %d pairs; kedge median %v; capture - kedge: min %v median %v p90 %v max %v", hook, len(diffs),
		bench.MedianDuration(kedge), diffs[0], diffs[len(diffs)/2], diffs[len(diffs)*9/10], diffs[len(diffs)-1])
}
