package pping

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// flusher is implemented by sinks that buffer (Writer).
type flusher interface{ Flush() error }

// Run feeds events (and, in aggregation mode, a report every Aggregate interval) to sink,
// and runs the garbage collectors every CleanupInterval, until ctx is done. On the way out
// it drains the ring buffer and reports the last partial aggregation interval.
func (m *Monitor) Run(ctx context.Context, sink Sink) error {
	rd, err := m.Events()
	if err != nil {
		return err
	}
	defer rd.Close()
	readErr := make(chan error, 1)
	stop := make(chan struct{})
	go func() { readErr <- readEvents(rd, sink, stop) }()

	tick := func(d time.Duration) <-chan time.Time {
		if d <= 0 {
			return nil
		}
		t := time.NewTicker(d)
		context.AfterFunc(ctx, t.Stop)
		return t.C
	}
	gcC, aggC := tick(m.cfg.CleanupInterval), tick(m.cfg.Aggregate)
	var errs []error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-readErr:
			return err
		case <-gcC:
			if err := m.collectGarbage(sink); err != nil {
				errs = append(errs, err)
				break loop
			}
		case <-aggC:
			if err := m.reportAggregate(sink); err != nil {
				errs = append(errs, err)
				break loop
			}
		}
	}
	close(stop)
	errs = append(errs, <-readErr)
	if m.cfg.Aggregate > 0 {
		errs = append(errs, m.reportAggregate(sink))
	}
	if f, ok := sink.(flusher); ok {
		errs = append(errs, f.Flush())
	}
	return errors.Join(errs...)
}

// collectGarbage runs the collector and reports the flows that timed out.
func (m *Monitor) collectGarbage(sink Sink) error {
	evs, err := m.RunGC()
	for _, ev := range evs {
		if serr := sink.Event(ev); serr != nil {
			return errors.Join(err, fmt.Errorf("deliver event: %w", serr))
		}
	}
	return err
}

func (m *Monitor) reportAggregate(sink Sink) error {
	rep, err := m.CollectAggregate()
	if err != nil {
		return err
	}
	return sink.Aggregate(rep)
}

// readEvents passes events to sink until stop is closed, then drains what is queued. It
// flushes the sink whenever the ring buffer is empty. The reader's deadline is only ever
// set here: cilium/ebpf's Reader holds its lock while it waits.
func readEvents(rd *EventReader, sink Sink, stop <-chan struct{}) error {
	const poll = 100 * time.Millisecond
	f, canFlush := sink.(flusher)
	draining := false
	rd.SetDeadline(time.Now().Add(poll))
	for {
		ev, err := rd.Read()
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if draining {
				return nil
			}
			select {
			case <-stop:
				draining = true
				rd.SetDeadline(time.Now()) // Read returns what is queued, then this error
			default:
				rd.SetDeadline(time.Now().Add(poll))
			}
			continue
		case errors.Is(err, ErrClosed):
			return nil
		case errors.Is(err, ErrDecode):
			// A contract mismatch: say so and go on with the next record.
			slog.Warn("pping: skip event", "err", err)
			continue
		case err != nil:
			return fmt.Errorf("read events: %w", err)
		}
		if err := sink.Event(ev); err != nil {
			return fmt.Errorf("deliver event: %w", err)
		}
		if canFlush && rd.r.AvailableBytes() == 0 {
			if err := f.Flush(); err != nil {
				return fmt.Errorf("flush output: %w", err)
			}
		}
	}
}
