package sg

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Poller is the ring's polling reader (docs/sg.md, "Delivery"): after a wake-up it reads
// the ring and, while requests are in flight and the next result is expected within the
// spin, polls the ring for it before it lets the ring wake it again. The ring is held
// meanwhile (Ring.Hold): a result committed while the reader polls sends no wake-up, so
// it costs neither the producer CPU's irq_work (a self-interrupt, a hypervisor exit on a
// VM) nor a sleep and wake-up of the reader. The expected wait is a moving average of the
// waits seen: where results come further apart than the spin (a fan-out of 16 with one
// request outstanding), polling would only burn CPU, and the reader sleeps at once. From
// NapDepth requests in flight it naps between its looks instead of spinning (Nap).
//
// pkg/sg's Group reads its ring with it, and so does the loopback benchmark's floor, so
// that the two differ only in their kernel programs. The fields are set once, before the
// first Poll; Poll is called from the ring's Wait callback, one caller at a time.
type Poller struct {
	Ring     *Ring
	Mu       *sync.Mutex  // one reader of the ring at a time; held while Pump runs
	Pump     func()       // reads every result the ring holds (Mu held)
	InFlight func() int   // requests sent and not completed
	Closed   *atomic.Bool // the reader is shutting down

	gap    time.Duration // moving average (1/8 per sample) of the waits, each at most 4 x spin
	parked time.Time     // when the wait that ended in the reader's last sleep began
}

// Poll reads the ring and polls it while spin (> 0) allows, as the type says; it returns
// when the reader should sleep until the ring wakes it. spin <= 0: read and return.
func (p *Poller) Poll(spin time.Duration) {
	p.Mu.Lock()
	defer p.Mu.Unlock()
	if !p.parked.IsZero() {
		p.observe(time.Since(p.parked), spin)
		p.parked = time.Time{}
	}
	for {
		p.Ring.Hold()
		p.Pump()
		from := time.Now()
		if spin > 0 && p.gap <= spin && !p.Closed.Load() {
			// The waiters run first: a request sent in reply to the result just read
			// counts as in flight.
			for !p.Ring.Pending() && !p.Closed.Load() {
				p.Mu.Unlock()
				runtime.Gosched()
				if p.InFlight() >= NapDepth && !p.Ring.Pending() {
					Nap()
				}
				p.Mu.Lock()
				if p.InFlight() == 0 || time.Since(from) > spin {
					break
				}
			}
			if p.Ring.Pending() && !p.Closed.Load() {
				p.observe(time.Since(from), spin)
				continue
			}
		}
		if !p.Ring.Release() || p.Closed.Load() {
			p.parked = from
			return
		}
	}
}

func (p *Poller) observe(d, spin time.Duration) {
	p.gap += (min(d, 4*spin) - p.gap) / 8
}

// NapDepth is the number of requests in flight from which the polling reader naps between
// its looks at the ring instead of spinning through its wait (Nap). At one request in
// flight the wait is one request's round trip, and a nap's timer would end it late; with
// many in flight results come close together and a nap that ends late finds several.
const NapDepth = 4

// NapFor is how long Nap asks the kernel to sleep. The thread's timer slack (50 us by
// default for a normal thread) comes on top: the timer fires at most that much later.
const NapFor = 20 * time.Microsecond

// Nap sleeps NapFor in nanosleep without telling the Go runtime: the thread keeps its P
// (no hand-off to another thread, and sysmon has no system call to retake), the ring stays
// held (the producer raises no wake-up), and the CPU halts while it sleeps instead of
// spinning. Go's own timers cannot wait this short (the runtime's poller waits in whole
// milliseconds). A signal (the runtime's preemption) ends it early, which is harmless.
func Nap() {
	ts := unix.NsecToTimespec(int64(NapFor))
	_, _, _ = unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}
