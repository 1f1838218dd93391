package hedge

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Event is one entry of the event stream (Options.Events; `kedge hedge run -F json|jsonl`):
// a hedge sent, a hedged request's first response (won: from a hedge's replica; lost: from
// the replica the client addressed) or a due hedge refused (budget, every replica ejected,
// far overdue).
type Event struct {
	Time      time.Time `json:"time"`
	Type      string    `json:"type"` // sent | won | lost | refused
	Service   string    `json:"service"`
	Client    string    `json:"client"`
	RequestID uint64    `json:"request_id"`
	// Replica: sent - where the hedge went; won, lost - who answered first.
	Replica string `json:"replica,omitempty"`
	// Hedges of the request so far.
	Hedges int `json:"hedges"`
	// Latency: won, lost - request to first response; sent, refused - request to now.
	Latency time.Duration `json:"latency_ns"`
	// Reason a hedge was refused: budget, ejected, overdue.
	Reason string `json:"reason,omitempty"`
}

var eventTypes = map[uint8]string{
	uint8(hedgeHedgeEventTypeHEDGE_EV_SENT): "sent", uint8(hedgeHedgeEventTypeHEDGE_EV_WON): "won",
	uint8(hedgeHedgeEventTypeHEDGE_EV_LOST): "lost", uint8(hedgeHedgeEventTypeHEDGE_EV_REFUSED): "refused",
}

var refusals = map[uint8]string{
	uint8(hedgeHedgeRefusalHEDGE_REFUSED_BUDGET): "budget", uint8(hedgeHedgeRefusalHEDGE_REFUSED_EJECTED): "ejected",
	uint8(hedgeHedgeRefusalHEDGE_REFUSED_OVERDUE): "overdue",
}

// eventsBytes is the ring buffer's size with events on (EVENTS_BYTES); off, it is one page.
var eventsBytes = uint32(hedgeHedgeLimitsEVENTS_BYTES)

// ErrNoEvents is returned by Events for a hedger started without Options.Events.
var ErrNoEvents = errors.New("the hedger was started without events")

// Events reads the event stream and calls fn for each event until ctx ends (then it returns
// nil). fn runs on the calling goroutine, one event at a time.
func (h *Hedger) Events(ctx context.Context, fn func(Event)) error {
	if !h.events {
		return ErrNoEvents
	}
	rd, err := ringbuf.NewReader(h.objs.HedgeEvents)
	if err != nil {
		return fmt.Errorf("read hedge events: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { rd.Close() })
	defer stop()
	defer rd.Close()
	toWall := monoToWall()
	for {
		rec, err := rd.Read()
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read hedge events: %w", err)
		}
		raw, ok := decodeEvent(rec.RawSample)
		if !ok {
			continue // a short record: nothing the programs write
		}
		fn(h.event(&raw, toWall))
	}
}

// decodeEvent reads one ring-buffer record as the programs write it.
func decodeEvent(b []byte) (hedgeHedgeEvent, bool) {
	var raw hedgeHedgeEvent
	err := binary.Read(bytes.NewReader(b), binary.NativeEndian, &raw)
	return raw, err == nil
}

// event turns a raw event into an Event with the service's and replicas' names.
func (h *Hedger) event(raw *hedgeHedgeEvent, toWall func(uint64) time.Time) Event {
	ev := Event{Time: toWall(raw.TimeNs), Type: eventTypes[raw.Type], RequestID: raw.Id, Hedges: int(raw.Hedges),
		Latency: time.Duration(raw.LatencyNs), Reason: refusals[raw.Reason]}
	ip := netip.AddrFrom16(raw.Caddr.In6U.U6Addr8).Unmap()
	ev.Client = netip.AddrPortFrom(ip, ntohs(raw.Cport)).String()
	h.mu.RLock()
	defer h.mu.RUnlock()
	for i, s := range h.Config.Services {
		if h.slot(i) != uint32(raw.Svc) {
			continue
		}
		ev.Service = s.Name
		if int(raw.Replica) < len(s.replicas) {
			ev.Replica = s.replicas[raw.Replica].String()
		}
	}
	return ev
}

func ntohs(v uint16) uint16 { return v>>8 | v<<8 }

// monoToWall converts CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns) to wall-clock time, by
// the offset between the two clocks now.
func monoToWall() func(uint64) time.Time {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	wall := time.Now()
	mono := uint64(ts.Nano())
	return func(ns uint64) time.Time { return wall.Add(time.Duration(int64(ns) - int64(mono))) }
}

// EventWriter writes events as JSON: "json" one array (closed by Close), "jsonl" one object
// per line - the shapes of kedge pping's -F json and jsonl.
type EventWriter struct {
	mu    sync.Mutex
	w     io.Writer
	lines bool
	n     int
}

// EventFormats are the formats NewEventWriter takes.
var EventFormats = []string{"json", "jsonl"}

// NewEventWriter writes events to w in format ("json" or "jsonl").
func NewEventWriter(w io.Writer, format string) (*EventWriter, error) {
	switch format {
	case "json":
		if _, err := io.WriteString(w, "["); err != nil {
			return nil, err
		}
		return &EventWriter{w: w}, nil
	case "jsonl":
		return &EventWriter{w: w, lines: true}, nil
	}
	return nil, fmt.Errorf("unknown event format %q (want json or jsonl)", format)
}

// Write writes one event.
func (ew *EventWriter) Write(ev Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	ew.mu.Lock()
	defer ew.mu.Unlock()
	switch {
	case ew.lines:
		b = append(b, '\n')
	case ew.n > 0:
		b = append([]byte(",\n"), b...)
	default:
		b = append([]byte("\n"), b...)
	}
	ew.n++
	_, err = ew.w.Write(b)
	return err
}

// Close ends a JSON array.
func (ew *EventWriter) Close() error {
	if ew.lines {
		return nil
	}
	_, err := io.WriteString(ew.w, "\n]\n")
	return err
}
