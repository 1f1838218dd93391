package sg

import (
	"context"
	"fmt"
	"sync"
	"time"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

// The slot protocol: a request takes a free slot and sends; the kernel completes the slot;
// a reader (readers.go) delivers the result to the waiting request, or a request that woke
// late recovers it from the slot.

// Scatter sends payload to every worker and returns the result.
func (g *Group) Scatter(ctx context.Context, payload []byte) (Result, error) {
	return g.ScatterWith(ctx, payload, RequestOptions{})
}

// ScatterWith is Scatter with per-request options.
func (g *Group) ScatterWith(ctx context.Context, payload []byte, o RequestOptions) (Result, error) {
	if g.closed.Load() {
		return Result{}, ErrClosed
	}
	if o.Need < 0 || o.Need > len(g.cfg.Workers) {
		return Result{}, fmt.Errorf("sg request: need %d of %d workers", o.Need, len(g.cfg.Workers))
	}
	var slot uint16
	if g.cfg.OnFull == Fail {
		select {
		case slot = <-g.free:
		default:
			return Result{}, ErrInFlight
		}
	} else {
		select {
		case slot = <-g.free:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-g.done:
			return Result{}, ErrClosed
		}
	}
	timeout := g.cfg.Timeout
	if o.Timeout > 0 {
		timeout = o.Timeout
	}
	if o.Need == 0 {
		o.Need = g.cfg.Need // the group's policy (0: all)
	}
	id := g.seq.Add(1)<<10 | uint64(slot)
	w := waiters.Get().(*waiter)
	w.id, w.sent = id, time.Now()
	g.mu.Lock()
	g.pending[slot] = w
	g.mu.Unlock()

	h := isg.Header{Version: isg.Version, Op: isg.OpRequest, Group: g.cfg.Group, ReqID: id,
		Need: uint16(o.Need), TimeoutUS: uint32(o.Timeout / time.Microsecond), PayloadLen: uint32(len(payload))}
	w.buf = append(h.Append(w.buf[:0]), payload...)
	if _, err := g.conn.WriteToUDPAddrPort(w.buf, g.target); err != nil {
		g.forget(slot, id)
		return Result{}, fmt.Errorf("send sg request: %w", err)
	}
	// The kernel completes every request by its deadline; this timer only guards against a
	// result that never comes (ring buffer full, timer not armed).
	if d := timeout + 50*time.Millisecond + timeout/2; w.guard == nil {
		w.guard = time.NewTimer(d)
	} else {
		w.guard.Reset(d)
	}
	for {
		select {
		case r := <-w.ch:
			w.release()
			return r, nil
		case <-ctx.Done():
			w.guard.Stop()             // w stays with its slot: the result is sent to it when it comes
			return Result{}, ctx.Err() // the slot is freed when its result arrives
		case <-g.done:
			w.guard.Stop()
			return Result{}, ErrClosed
		case <-w.guard.C:
			r, owed, err := g.recover(slot, w)
			if err != nil {
				return Result{}, err
			}
			if owed {
				// The kernel still holds the request pending: its result is owed, not
				// lost (a starved process can see its guard fire first). Look again.
				w.guard.Reset(timeout/2 + 50*time.Millisecond)
				continue
			}
			w.release()
			return r, nil
		}
	}
}

// waiters are reused: a request's waiter, its channel, guard timer and request buffer
// cost four allocations otherwise.
var waiters = sync.Pool{New: func() any { return &waiter{ch: make(chan Result, 1)} }}

// release returns w for reuse, once its result was received and no reader holds it:
// deliver and recover clear pending[slot] before they hand the result over, and the
// guard has fired or is stopped here. A waiter abandoned with its slot (a cancelled
// context, Close) is never reused: its result may still be sent to it.
func (w *waiter) release() {
	w.guard.Stop()
	waiters.Put(w)
}

// forget drops a waiter whose request never left; its slot is free again.
func (g *Group) forget(slot uint16, id uint64) {
	g.mu.Lock()
	if w := g.pending[slot]; w != nil && w.id == id {
		g.pending[slot] = nil
	}
	g.mu.Unlock()
	g.free <- slot
}

// recover reads a result from its slot when the ring buffer did not deliver it. owed:
// the slot still holds the request pending, so the kernel will complete it (its timer or
// the next sweep) and the caller waits again. An error wraps ErrLost with what the slot
// held: the request never registered there, or its result went nowhere.
func (g *Group) recover(slot uint16, w *waiter) (r Result, owed bool, err error) {
	_, sweepErr := g.objs.RunSweep() // expires it now if its timer did not
	// A result whose wake-up never came (its passed reply dropped before the socket, by a
	// firewall or a bad UDP checksum) is in the ring: read it. If the reader holds the
	// ring, it is reading it now.
	if g.pumpMu.TryLock() {
		g.pumpLocked(byRecover)
		g.pumpMu.Unlock()
	}
	select {
	case r := <-w.ch:
		return r, false, nil
	case <-time.After(10 * time.Millisecond):
	}
	g.mu.Lock()
	mine := g.pending[slot] == w
	g.mu.Unlock()
	if !mine {
		// A reader claimed the result (deliver clears the waiter under g.mu, then decodes
		// and sends): it is in flight to us however starved that reader is.
		g.inFlightWaits.Add(1)
		return <-w.ch, false, nil
	}
	var s isg.SlotRec
	if err := g.objs.Slots.Lookup(uint32(slot), &s); err != nil {
		return Result{}, false, fmt.Errorf("%w: look up slot %d: %w", ErrLost, slot, err)
	}
	if s.Res.ReqId == w.id && s.State == isg.SlotPending {
		if sweepErr != nil { // nothing will complete it on a kernel without bpf_timer
			return Result{}, false, fmt.Errorf("%w: slot %d still pending: %w", ErrLost, slot, sweepErr)
		}
		return Result{}, true, nil
	}
	if s.Res.ReqId != w.id || s.State != isg.SlotDone {
		// The slot stays reserved: never reused while its state is unknown.
		return Result{}, false, fmt.Errorf("%w: slot %d holds request %#x in state %d, not %#x", ErrLost, slot, s.Res.ReqId, s.State, w.id)
	}
	g.mu.Lock()
	mine = g.pending[slot] == w
	if mine {
		g.pending[slot] = nil
	}
	g.mu.Unlock()
	if !mine { // a reader claimed it meanwhile
		g.inFlightWaits.Add(1)
		return <-w.ch, false, nil
	}
	r = g.decode(&s.Res, w, byRecover)
	g.free <- slot
	return r, false, nil
}
