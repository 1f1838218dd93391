package chaos

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// responder sends each response of a replica when it is due, precisely.
//
// Go runtime timers (time.AfterFunc, time.Sleep) sleep in the netpoller with millisecond
// resolution and fire 0.1-1 ms late, which would add up to a millisecond of server-side
// jitter to every response and blur exactly the sub-millisecond differences between hedgers
// the benchmark is for. The responder instead runs on its own locked OS thread with a 1 ns
// timer slack and sleeps in ppoll(2) with a nanosecond timeout.
//
// Every response is due at arrival + Fast or arrival + Stall; since each class has one
// constant delay and requests are queued in arrival order, each class's queue is already
// sorted by due time, and the next response due is the earlier of the two heads. So a
// stalled response never holds back a fast one, at O(1) per response. The read loop wakes
// the responder through an eventfd when it queues into an empty class (the only case in
// which the new response can be due before what the responder is sleeping for).
type responder struct {
	send func(resp []byte, to netip.AddrPort)

	mu     sync.Mutex
	queues [numClasses]fifo
	closed bool
	efd    int
	done   chan struct{}
}

// Response classes, one FIFO each.
const (
	classFast = iota
	classStall
	numClasses
)

type pendingResp struct {
	due  time.Time
	resp []byte
	to   netip.AddrPort
}

// fifo is a slice-backed queue that reuses its storage.
type fifo struct {
	items []pendingResp
	head  int
}

func (q *fifo) len() int           { return len(q.items) - q.head }
func (q *fifo) peek() *pendingResp { return &q.items[q.head] }
func (q *fifo) push(p pendingResp) { q.items = append(q.items, p) }
func (q *fifo) pop() (p pendingResp) {
	p = q.items[q.head]
	q.items[q.head] = pendingResp{}
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 1024 && q.head*2 > len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return p
}

func newResponder(send func([]byte, netip.AddrPort)) (*responder, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("create eventfd: %w", err)
	}
	return &responder{send: send, efd: efd, done: make(chan struct{})}, nil
}

// schedule queues resp to be sent to `to` at due.
func (r *responder) schedule(class int, due time.Time, resp []byte, to netip.AddrPort) {
	r.mu.Lock()
	wake := r.queues[class].len() == 0
	r.queues[class].push(pendingResp{due: due, resp: resp, to: to})
	r.mu.Unlock()
	if wake {
		r.wake()
	}
}

func (r *responder) wake() {
	var one = [8]byte{1}
	// EAGAIN means the counter is already non-zero: a wake-up is pending anyway.
	_, _ = unix.Write(r.efd, one[:])
}

// stop ends run, abandoning queued responses, and waits for it.
func (r *responder) stop() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wake()
	<-r.done
	_ = unix.Close(r.efd)
}

// run sends responses as they fall due until stop. It locks its goroutine to a thread that
// is discarded when run returns (the goroutine exits locked), so the timer-slack setting
// never leaks into the runtime's thread pool.
func (r *responder) run() error {
	defer close(r.done)
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set timer slack: %w", err)
	}
	pfd := []unix.PollFd{{Fd: int32(r.efd), Events: unix.POLLIN}}
	var batch []pendingResp
	var buf [8]byte
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil
		}
		now := time.Now()
		var next time.Time
		for {
			q := r.earliest()
			if q == nil {
				break
			}
			if p := q.peek(); p.due.After(now) {
				next = p.due
				break
			}
			batch = append(batch, q.pop())
		}
		r.mu.Unlock()

		for i := range batch {
			r.send(batch[i].resp, batch[i].to)
			batch[i] = pendingResp{}
		}
		if len(batch) > 0 {
			batch = batch[:0]
			continue // sending took time: more may be due
		}
		var tsp *unix.Timespec
		if !next.IsZero() {
			ts := unix.NsecToTimespec(max(time.Until(next), 0).Nanoseconds())
			tsp = &ts
		}
		n, err := unix.Ppoll(pfd, tsp, nil)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for next response: %w", err)
		}
		if n > 0 {
			_, _ = unix.Read(r.efd, buf[:])
		}
	}
}

// earliest is the queue whose head is due first, nil when all are empty. Caller holds mu.
func (r *responder) earliest() *fifo {
	var best *fifo
	for i := range r.queues {
		q := &r.queues[i]
		if q.len() > 0 && (best == nil || q.peek().due.Before(best.peek().due)) {
			best = q
		}
	}
	return best
}
