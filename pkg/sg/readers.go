package sg

import (
	"errors"
	"net"
	"runtime"
	"time"
	"unsafe"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

// The readers: four ways a completed slot reaches its request (wakeKinds): the coordinator
// socket's wake-up datagram (drain), the ring buffer (wait), busy polling (spin) and the
// timeout guard (sweeper). Each pumps the ring and delivers what it finds.

// wait reads the ring whenever it wakes its reader: every result, or with WakeSocket
// (SG_GF_WAKE_SOCKET) the timeouts. It waits in the Go runtime's poller, the epoll set that also
// holds the coordinator socket (drain), so neither holds a thread while it waits.
func (g *Group) wait() {
	defer g.wg.Done()
	first := true
	_ = g.ring.Wait(func() bool {
		if g.closed.Load() {
			return true
		}
		g.poll()
		if first {
			first = false
			close(g.listening)
		}
		return false
	})
	if first {
		close(g.listening) // Wait failed before its first call: New must not hang
	}
}

// poll reads the ring after a wake-up and polls it while Config.PollSpin allows
// (isg.Poller: the ring held, napping between looks from isg.NapDepth requests in flight).
func (g *Group) poll() {
	spin := g.cfg.PollSpin
	if g.cfg.WakeSocket {
		spin = 0 // the completing reply wakes the socket's reader; this one waits for timeouts
	}
	g.polls.Poll(spin)
}

// spin is the BusyPoll reader: it spins on the ring's positions, no system call while
// waiting.
func (g *Group) spin() {
	defer g.wg.Done()
	close(g.listening)
	for !g.closed.Load() {
		if g.ring.Available() == 0 {
			runtime.Gosched()
			continue
		}
		g.pump(bySpin)
	}
}

// drain reads what reaches the coordinator socket: with WakeSocket the reply that
// completed a request (its result is in the ring by then: the data plane commits it
// before it passes the packet), and whatever XDP passed (malformed, unregistered, other
// traffic). Every datagram is discarded; each one is a reason to look at the ring.
func (g *Group) drain() {
	defer g.wg.Done()
	buf := make([]byte, 65536)
	for {
		_, err := g.conn.Read(buf)
		if g.closed.Load() {
			return
		}
		if err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
		g.pump(bySocket)
	}
}

// Readers of the ring (Group.delivered's index).
const (
	bySocket  = iota // the coordinator socket woke drain
	byRing           // the ring woke wait
	bySpin           // BusyPoll
	byRecover        // a Scatter's guard timer
	wakeKinds
)

// readerNames are Result.Reader's values, by Group.delivered's index.
var readerNames = [wakeKinds]string{"socket", "ring", "busy-poll", "guard"}

// pump delivers every result committed to the ring.
func (g *Group) pump(by int) {
	g.pumpMu.Lock()
	g.pumpLocked(by)
	g.pumpMu.Unlock()
}

func (g *Group) pumpLocked(by int) {
	// The record is the kernel's struct sg_result in native byte order, read where it
	// lies in the ring's mapping (8-byte aligned) and decoded before it is consumed: no
	// copy of its 2.3 KiB (binary.Decode's reflection took ~4.5 us per result, a copy
	// ~0.2 us).
	take := func(rec []byte) {
		if len(rec) < int(unsafe.Sizeof(isg.ResultRec{})) {
			g.strays.Add(1)
			return
		}
		g.deliver((*isg.ResultRec)(unsafe.Pointer(unsafe.SliceData(rec))), by)
	}
	for {
		for g.ring.Next(take) {
		}
		if !g.holdReads.Load() || g.closed.Load() {
			return
		}
		for g.holdReads.Load() && !g.closed.Load() {
			time.Sleep(time.Millisecond)
		}
	}
}

// deliver hands a result to its waiter and frees its slot.
func (g *Group) deliver(res *isg.ResultRec, by int) {
	slot := res.Slot
	if int(slot) >= len(g.pending) {
		g.strays.Add(1)
		return
	}
	g.mu.Lock()
	w := g.pending[slot]
	mine := w != nil && w.id == res.ReqId
	if mine {
		g.pending[slot] = nil
	}
	g.mu.Unlock()
	if !mine {
		// A result for an older id (recovered from its slot already) is a stray.
		g.strays.Add(1)
		return
	}
	if g.afterClaim != nil {
		g.afterClaim()
	}
	g.delivered[by].Add(1) // before the waiter can see its result
	w.ch <- g.decode(res, w, by)
	g.free <- slot
}

// sweeper expires requests on kernels without bpf_timer.
func (g *Group) sweeper() {
	defer g.wg.Done()
	period := max(min(g.cfg.Timeout/4, 5*time.Millisecond), 500*time.Microsecond)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
			_, _ = g.objs.RunSweep()
		}
	}
}
