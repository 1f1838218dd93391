package sg

import (
	"errors"
	"net"
	"runtime"
	"time"
	"unsafe"

	isg "github.com/kedge-dev/kedge/internal/sg"
	"golang.org/x/sys/unix"
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

// poll reads the ring after a wake-up and, while requests are outstanding and the next
// result is expected within Config.PollSpin, polls the ring for it before it lets the ring
// wake it again. The ring is held meanwhile (isg.Ring.Hold): a result committed while the
// reader polls sends no wake-up, so it costs neither the producer CPU's irq_work (a
// self-interrupt, a hypervisor exit on a VM) nor a sleep and wake-up of the reader. The
// expected wait is a moving average of the waits seen (pollState): where results come
// further apart than PollSpin (a fan-out of 16 with one request outstanding), polling
// would only burn CPU, and the reader sleeps at once.
func (g *Group) poll() {
	spin := g.cfg.PollSpin
	if g.cfg.WakeSocket {
		spin = 0 // the completing reply wakes the socket's reader; this one waits for timeouts
	}
	ps := &g.polls
	g.pumpMu.Lock()
	defer g.pumpMu.Unlock()
	if !ps.parked.IsZero() {
		ps.observe(time.Since(ps.parked), spin)
		ps.parked = time.Time{}
	}
	for {
		g.ring.Hold()
		g.pumpLocked(byRing)
		from := time.Now()
		if spin > 0 && ps.gap <= spin && !g.closed.Load() {
			// The waiters run first: a request sent in reply to the result just read
			// counts as outstanding.
			for !g.ring.Pending() && !g.closed.Load() {
				g.pumpMu.Unlock()
				runtime.Gosched()
				if g.InFlight() >= napDepth && !g.ring.Pending() {
					nap()
				}
				g.pumpMu.Lock()
				if g.InFlight() == 0 || time.Since(from) > spin {
					break
				}
			}
			if g.ring.Pending() && !g.closed.Load() {
				ps.observe(time.Since(from), spin)
				continue
			}
		}
		if !g.ring.Release() || g.closed.Load() {
			ps.parked = from
			return
		}
	}
}

// napDepth is the number of requests in flight from which the polling reader naps between
// its looks at the ring instead of spinning through its wait (nap). At one request in
// flight the wait is one request's round trip, and a nap's timer would end it late; with
// many in flight results come close together and a nap that ends late finds several.
const napDepth = 4

// napFor is how long nap asks the kernel to sleep. The thread's timer slack (50 us by
// default for a normal thread) comes on top: the timer fires at most that much later.
const napFor = 20 * time.Microsecond

// nap sleeps napFor in nanosleep without telling the Go runtime: the thread keeps its P
// (no hand-off to another thread, and sysmon has no system call to retake), the ring stays
// held (the producer raises no wake-up), and the CPU halts while it sleeps instead of
// spinning. Go's own timers cannot wait this short (the runtime's poller waits in whole
// milliseconds). A signal (the runtime's preemption) ends it early, which is harmless.
func nap() {
	ts := unix.NsecToTimespec(int64(napFor))
	_, _, _ = unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// pollState is the ring reader's estimate of the wait for the next result.
type pollState struct {
	gap    time.Duration // moving average (1/8 per sample) of the waits, each at most 4 x PollSpin
	parked time.Time     // when the wait that ended in the reader's last sleep began
}

func (p *pollState) observe(d, spin time.Duration) {
	p.gap += (min(d, 4*spin) - p.gap) / 8
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
