package pping

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// IDType says which identifier a flow is measured with (enum pp_id_type).
type IDType uint8

const (
	IDNone IDType = iota
	IDTCPTimestamp
	IDICMPEcho
	IDDNS
	IDUDPRequest
	IDQUICSpin // QUIC's spin bit; the flow is named by the server's connection id too
	IDKernel   // the kernel's RTT of a TCP socket of this host (events only)
)

func (t IDType) String() string {
	switch t {
	case IDTCPTimestamp:
		return "tcp_ts"
	case IDICMPEcho:
		return "icmp_echo"
	case IDDNS:
		return "dns_id"
	case IDUDPRequest:
		return "udp_reqid"
	case IDQUICSpin:
		return "quic_spin"
	case IDKernel:
		return "kernel"
	}
	return "none"
}

// Source names the kind of RTT sample an identifier gives, as the output reports it:
// tsval (TCP timestamps), icmp, dns, udp (a --udp-service), quic (spin bit), kernel (the
// TCP stack's own RTT of a local socket).
func (t IDType) Source() string {
	switch t {
	case IDTCPTimestamp:
		return "tsval"
	case IDICMPEcho:
		return "icmp"
	case IDDNS:
		return "dns"
	case IDUDPRequest:
		return "udp"
	case IDQUICSpin:
		return "quic"
	case IDKernel:
		return "kernel"
	}
	return "none"
}

// Sources lists every Source name.
var Sources = []string{"tsval", "icmp", "dns", "udp", "quic", "kernel"}

// Flow is one direction of a flow. For ICMP echo both ports hold the echo identifier.
type Flow struct {
	Src, Dst netip.AddrPort
	Proto    uint8 // IP protocol number
	IDType   IDType
}

// Protocol names the protocol as ePPing does ("TCP", "ICMP", "ICMPv6"), plus "UDP" (DNS,
// services and QUIC).
func (f Flow) Protocol() string {
	switch f.Proto {
	case unix.IPPROTO_TCP:
		return "TCP"
	case unix.IPPROTO_UDP:
		return "UDP"
	case unix.IPPROTO_ICMP:
		return "ICMP"
	case unix.IPPROTO_ICMPV6:
		return "ICMPv6"
	}
	return fmt.Sprint(f.Proto)
}

// String formats the flow as ePPing and ppviz do: src:port+dst:port.
func (f Flow) String() string {
	return fmt.Sprintf("%s:%d+%s:%d", f.Src.Addr(), f.Src.Port(), f.Dst.Addr(), f.Dst.Port())
}

// Event is an RTTEvent, a FlowEvent or a MapFullEvent.
type Event interface{ eventTime() time.Time }

// RTTEvent is one RTT sample. Flow is the reply's direction: Src is the far end.
type RTTEvent struct {
	Time          time.Time
	Flow          Flow
	RTT, MinRTT   time.Duration
	SRTT          time.Duration
	SentPackets   uint64 // request direction: packets and payload bytes sent
	SentBytes     uint64
	RecPackets    uint64 // ... and received back
	RecBytes      uint64
	ID            uint64 // the matched identifier (QUIC: ConnID's bytes, big-endian)
	MatchOnEgress bool
	// ConnID is a QUIC flow's server connection id (the client's destination id), its
	// first 8 bytes at most; nil for other sources or when the handshake was not seen.
	ConnID []byte
}

// FlowEventType is opening or closing.
type FlowEventType uint8

const (
	FlowOpening FlowEventType = 1
	FlowClosing FlowEventType = 2
)

func (t FlowEventType) String() string {
	switch t {
	case FlowOpening:
		return "opening"
	case FlowClosing:
		return "closing"
	}
	return "unknown"
}

// FlowReason is why a flow opened or closed (enum pp_flow_reason).
type FlowReason uint8

const (
	ReasonNone FlowReason = iota
	ReasonSYN
	ReasonSYNACK
	ReasonFirstPacket
	ReasonFIN
	ReasonRST
	ReasonTimeout
)

var flowReasons = [...]string{"none", "SYN", "SYN-ACK", "first observed packet", "FIN", "RST", "flow timeout"}

func (r FlowReason) String() string {
	if int(r) < len(flowReasons) {
		return flowReasons[r]
	}
	return "unknown"
}

// FlowSource is which endpoint of the reported flow triggered the event (enum
// pp_flow_source).
type FlowSource uint8

const (
	SourceSrc FlowSource = iota
	SourceDest
	SourceGC
)

var flowSources = [...]string{"src", "dest", "garbage collection"}

func (s FlowSource) String() string {
	if int(s) < len(flowSources) {
		return flowSources[s]
	}
	return "unknown"
}

// FlowEvent is a flow opening or closing. Flow is given reply-side first.
type FlowEvent struct {
	Time   time.Time
	Flow   Flow
	Type   FlowEventType
	Reason FlowReason
	Source FlowSource
}

// MapFullEvent warns that a map was full (at most once per second per map).
type MapFullEvent struct {
	Time time.Time
	Flow Flow
	Map  string // "flow", "timestamp" or "aggregation"
}

func (e *RTTEvent) eventTime() time.Time     { return e.Time }
func (e *FlowEvent) eventTime() time.Time    { return e.Time }
func (e *MapFullEvent) eventTime() time.Time { return e.Time }

var mapNames = [...]string{"flow", "timestamp", "aggregation"}

func (t *ppingPpTuple) flow() Flow {
	addr := func(b [16]uint8) netip.Addr {
		a := netip.AddrFrom16(b)
		if t.Ipv == 4 {
			return a.Unmap()
		}
		return a
	}
	return Flow{
		Src:    netip.AddrPortFrom(addr(t.Saddr.In6U.U6Addr8), bpfx.Htons(t.Sport)),
		Dst:    netip.AddrPortFrom(addr(t.Daddr.In6U.U6Addr8), bpfx.Htons(t.Dport)),
		Proto:  t.Proto,
		IDType: IDType(t.IdType),
	}
}

// decodeEvent turns one ring-buffer record into an Event.
func decodeEvent(raw []byte, clock *monoClock) (Event, error) {
	if len(raw) < 8 {
		return nil, fmt.Errorf("decode event: %d-byte record", len(raw))
	}
	typ := *(*uint64)(unsafe.Pointer(&raw[0]))
	var need uintptr
	switch typ {
	case eventRTT:
		need = unsafe.Sizeof(ppingPpRttEvent{})
	case eventFlow:
		need = unsafe.Sizeof(ppingPpFlowEvent{})
	case eventMapFull:
		need = unsafe.Sizeof(ppingPpMapFullEvent{})
	default:
		return nil, fmt.Errorf("decode event: unknown type %d", typ)
	}
	if uintptr(len(raw)) < need {
		return nil, fmt.Errorf("decode event: type %d record has %d bytes, want %d", typ, len(raw), need)
	}
	p := unsafe.Pointer(&raw[0])
	switch typ {
	case eventRTT:
		e := (*ppingPpRttEvent)(p)
		ev := &RTTEvent{
			Time: clock.wall(e.Timestamp), Flow: e.Flow.flow(),
			RTT: time.Duration(e.Rtt), MinRTT: time.Duration(e.MinRtt), SRTT: time.Duration(e.Srtt),
			SentPackets: e.SentPkts, SentBytes: e.SentBytes, RecPackets: e.RecPkts, RecBytes: e.RecBytes,
			ID: e.Id, MatchOnEgress: e.MatchOnEgress != 0,
		}
		if n := int(e.IdLen); n > 0 && n <= 8 {
			ev.ConnID = binary.BigEndian.AppendUint64(nil, e.Id)[:n]
		}
		return ev, nil
	case eventFlow:
		e := (*ppingPpFlowEvent)(p)
		return &FlowEvent{Time: clock.wall(e.Timestamp), Flow: e.Flow.flow(),
			Type: FlowEventType(e.Event), Reason: FlowReason(e.Reason), Source: FlowSource(e.Source)}, nil
	default:
		e := (*ppingPpMapFullEvent)(p)
		name := "unknown"
		if int(e.Map) < len(mapNames) {
			name = mapNames[e.Map]
		}
		return &MapFullEvent{Time: clock.wall(e.Timestamp), Flow: e.Flow.flow(), Map: name}, nil
	}
}

// enum pp_event_type
const (
	eventRTT     = uint64(ppingPpEventTypePP_EVENT_RTT)
	eventFlow    = uint64(ppingPpEventTypePP_EVENT_FLOW)
	eventMapFull = uint64(ppingPpEventTypePP_EVENT_MAP_FULL)
)

// EventReader reads events from the monitor's ring buffer.
type EventReader struct {
	r     *ringbuf.Reader
	clock *monoClock
	rec   ringbuf.Record
}

// Events opens a reader on the event ring buffer. Only one reader should be open.
func (m *Monitor) Events() (*EventReader, error) {
	r, err := ringbuf.NewReader(m.objs.Events)
	if err != nil {
		return nil, fmt.Errorf("open event ring buffer: %w", err)
	}
	return &EventReader{r: r, clock: &m.clock}, nil
}

// Read blocks until an event arrives, the deadline passes (os.ErrDeadlineExceeded), or the
// reader is closed (ErrClosed).
func (er *EventReader) Read() (Event, error) {
	if err := er.r.ReadInto(&er.rec); err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return nil, ErrClosed
		}
		return nil, err
	}
	ev, err := decodeEvent(er.rec.RawSample, er.clock)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	return ev, nil
}

// ErrDecode marks a ring-buffer record that does not match the contract in pping.h.
var ErrDecode = errors.New("undecodable event")

// SetDeadline makes Read return os.ErrDeadlineExceeded after t (zero: no deadline).
func (er *EventReader) SetDeadline(t time.Time) { er.r.SetDeadline(t) }

// Close unblocks a pending Read.
func (er *EventReader) Close() error { return er.r.Close() }

// ErrClosed is returned by Read after Close.
var ErrClosed = errors.New("event reader closed")

// monoClock converts CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns) to wall-clock time,
// re-reading the offset between the clocks at most once a second.
type monoClock struct {
	mu      sync.Mutex
	offset  int64
	updated time.Time
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (c *monoClock) wall(mono uint64) time.Time {
	c.mu.Lock()
	now := time.Now()
	if now.Sub(c.updated) > time.Second || c.updated.IsZero() {
		c.offset = now.UnixNano() - monoNow()
		c.updated = now
	}
	off := c.offset
	c.mu.Unlock()
	return time.Unix(0, int64(mono)+off)
}
