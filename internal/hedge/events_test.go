package hedge

// The event stream (bpf/hedge/events.h, events.go): BPF_PROG_TEST_RUN fixtures with events on
// - a hedge sent, a hedged request's first response from the hedge's replica (won) and from
// the address the client used (lost), hedges refused (every replica ejected, far overdue) -
// each read back from the ring buffer as an Event; with events off nothing is written; and
// the writer's json and jsonl shapes.

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// eventsOf drains the fixture's ring buffer: the events its programs wrote.
func eventsOf(tb testing.TB, f *fixture) []Event {
	tb.Helper()
	rd, err := ringbuf.NewReader(f.objs.HedgeEvents)
	if err != nil {
		tb.Fatal(err)
	}
	defer rd.Close()
	toWall := monoToWall()
	var out []Event
	for {
		rd.SetDeadline(time.Now().Add(20 * time.Millisecond))
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			tb.Fatal(err)
		}
		raw, ok := decodeEvent(rec.RawSample)
		if !ok {
			tb.Fatalf("event of %d bytes", len(rec.RawSample))
		}
		out = append(out, f.h.event(&raw, toWall))
	}
}

// emits checks that a case wrote exactly these events (type, service, client, request id,
// replica, hedges, reason; time and latency as the fixed clock gives them).
func emits(f *fixture, want ...Event) func(testing.TB, bpftest.Result) {
	return func(tb testing.TB, _ bpftest.Result) {
		tb.Helper()
		got := eventsOf(tb, f)
		if len(got) != len(want) {
			tb.Fatalf("%d events %+v, want %d %+v", len(got), got, len(want), want)
		}
		for i, g := range got {
			w := want[i]
			if g.Type != w.Type || g.Service != w.Service || g.Client != w.Client || g.RequestID != w.RequestID ||
				g.Replica != w.Replica || g.Hedges != w.Hedges || g.Reason != w.Reason || g.Latency != w.Latency {
				tb.Errorf("event %d: %+v, want %+v", i, g, w)
			}
			// The fixture's fixed clock stands at now0 (plus the case's seconds): the event's
			// time is that monotonic instant on the wall clock (in a guest booted seconds ago,
			// it lies in the future).
			fixed := monoToWall()(now0)
			if d := g.Time.Sub(fixed); d < -time.Minute || d > time.Hour {
				tb.Errorf("event %d at %v: not the wall-clock time of the fixture's clock (%v)", i, g.Time, fixed)
			}
		}
	}
}

func TestEvents(t *testing.T) {
	f := newFixture(t, fixtureOpts{events: true})
	const id = 0x99
	p := idPayload(id, 32)
	k := key(sRR, client4, id)
	req := datagram(client4, svcRR, p)
	due := f.at(func(f *fixture, now uint64) error { return f.objs.Scoreboard.Put(k, dueEntry(now)) })
	sentAgo := now0 - dueEntry(now0).SentNs // the fixed clock: request to now
	ev := func(typ, replica string, hedges int, latency time.Duration, reason string) Event {
		return Event{Type: typ, Service: "rr", Client: client4.String(), RequestID: id, Replica: replica,
			Hedges: hedges, Latency: latency, Reason: reason}
	}
	outAll := func(tb testing.TB) {
		st := f.state(tb, sRR)
		st.RepOutUntilNs[1], st.RepOutUntilNs[2] = now0+uint64(time.Second), now0+uint64(time.Second)
		if err := f.objs.SvcStates.Put(uint32(sRR), st); err != nil {
			tb.Fatal(err)
		}
	}
	overdue := f.at(func(f *fixture, now uint64) error {
		e := dueEntry(now)
		e.SentNs, e.DeadlineNs = now-uint64(time.Second), now-uint64(time.Second)+uint64(testDelay)
		return f.objs.Scoreboard.Put(k, e)
	})
	runCases(t, f, f.objs.HedgeRescue, []bpftest.Case{
		{Name: "a hedge sent: sent, to replica 1, its first hedge", In: req, Setup: due,
			WantRet: redirect, WantOut: datagram(client4, repRR1, p), WantMark: bpftest.Mark(hedgeMark),
			WantCounters: bpftest.Counters{"rr.HedgesSent": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqHedged}, emits(f, ev("sent", repRR1.String(), 1, time.Duration(sentAgo), "")))},
		{Name: "every replica ejected: refused, ejected", In: req, Setup: bpftest.Seq(outAll, due), WantRet: shot,
			WantCounters: bpftest.Counters{"rr.ReplicasOut": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqNoHedge}, emits(f, ev("refused", "", 0, time.Duration(sentAgo), "ejected")))},
		{Name: "far overdue: refused, overdue", In: req, Setup: overdue, WantRet: shot,
			WantCounters: bpftest.Counters{"rr.OverdueDropped": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqNoHedge}, emits(f, ev("refused", "", 0, time.Second, "overdue")))},
	})

	// The first response of a hedged request: won from the hedge's replica, lost from the
	// address the client used.
	runCases(t, f, f.objs.HedgeResp, []bpftest.Case{
		{Name: "the hedge's replica answers first: won", In: datagram(repRR2, client4, p), Setup: f.at(hedgedBy(k, 2)),
			WantRet: unspec, WantOut: datagram(svcRR, client4, p),
			WantCounters: bpftest.Counters{"rr.Responses": 1, "rr.HedgesWon": 1, "rr.ResponsesRewritten": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqAnsweredHedge}, emits(f, ev("won", repRR2.String(), 1, 2*testDelay, "")))},
		{Name: "the address the client used answers first: lost", In: datagram(svcRR, client4, p), Setup: f.at(hedgedBy(k, 2)),
			WantRet: unspec, WantCounters: bpftest.Counters{"rr.Responses": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k: reqAnsweredHedge}, emits(f, ev("lost", svcRR.String(), 1, 2*testDelay, "")))},
	})
}

// TestEventsOff: without Options.Events the programs write nothing, and Events says so.
func TestEventsOff(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x9a
	p := idPayload(id, 32)
	k := key(sRR, client4, id)
	runCases(t, f, f.objs.HedgeRescue, []bpftest.Case{
		{Name: "a hedge sent, no event", In: datagram(client4, svcRR, p),
			Setup:   f.at(func(f *fixture, now uint64) error { return f.objs.Scoreboard.Put(k, dueEntry(now)) }),
			WantRet: redirect, WantOut: datagram(client4, repRR1, p), WantMark: bpftest.Mark(hedgeMark),
			WantCounters: bpftest.Counters{"rr.HedgesSent": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k: reqHedged}, emits(f))},
	})
	if err := f.h.Events(t.Context(), func(Event) {}); !errors.Is(err, ErrNoEvents) {
		t.Errorf("Events on a hedger without events: %v, want ErrNoEvents", err)
	}
}

func TestEventWriter(t *testing.T) {
	evs := []Event{
		{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Type: "sent", Service: "dns", Client: "10.0.0.1:4000",
			RequestID: 7, Replica: "10.0.0.3:53", Hedges: 1, Latency: 10 * time.Millisecond},
		{Time: time.Date(2026, 1, 2, 3, 4, 5, 1000, time.UTC), Type: "won", Service: "dns", Client: "10.0.0.1:4000",
			RequestID: 7, Replica: "10.0.0.3:53", Hedges: 1, Latency: 11 * time.Millisecond},
	}
	for _, format := range EventFormats {
		var b bytes.Buffer
		w, err := NewEventWriter(&b, format)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if err := w.Write(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		var got []Event
		switch format {
		case "json":
			err = json.Unmarshal(b.Bytes(), &got)
		case "jsonl":
			for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
				var ev Event
				if err = json.Unmarshal([]byte(line), &ev); err != nil {
					break
				}
				got = append(got, ev)
			}
		}
		if err != nil || len(got) != len(evs) || got[1] != evs[1] || !got[0].Time.Equal(evs[0].Time) {
			t.Errorf("%s: %v, read back %+v from %s", format, err, got, b.String())
		}
		if !strings.Contains(b.String(), `"latency_ns":10000000`) {
			t.Errorf("%s: latency not in nanoseconds: %s", format, b.String())
		}
	}
	if _, err := NewEventWriter(&bytes.Buffer{}, "csv"); err == nil {
		t.Error("format csv accepted")
	}
}
