package sg

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// workerBatch is how many datagrams one recvmmsg takes from a socket; a worker socket
// rarely holds more than the coordinator's requests outstanding.
const workerBatch = 16

// workerLoop serves a set of worker sockets from one OS thread: epoll (level-triggered)
// over the sockets, an eventfd that stops it and a timerfd for delayed replies.
type workerLoop struct {
	cfg   WorkerConfig
	st    *WorkerStats
	fds   []int
	rng   *rand.Rand
	epfd  int
	stopf int // eventfd
	timer int // timerfd (CLOCK_MONOTONIC) of the earliest delayed reply
	late  lateHeap

	// Receive side: one buffer per datagram of a batch, the sender's address in names.
	rhdrs [workerBatch]Mmsghdr
	riovs [workerBatch]unix.Iovec
	rbufs [workerBatch][]byte
	names [workerBatch]unix.RawSockaddrInet6
	// Send side: up to two replies per request (a duplicate) of nparts datagrams each, to
	// the request's sender: 2 * workerBatch * nparts entries.
	nparts int
	shdrs  []Mmsghdr
	siovs  []unix.Iovec
	sbufs  [][]byte
}

// lateReply is a delayed reply waiting in workerLoop.late.
type lateReply struct {
	due     int64 // CLOCK_MONOTONIC ns
	fd      int
	name    unix.RawSockaddrInet6
	namelen uint32
	reply   [][]byte // one datagram per part
	dup     bool
}

type lateHeap []*lateReply

func (h lateHeap) Len() int           { return len(h) }
func (h lateHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h lateHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lateHeap) Push(x any)        { *h = append(*h, x.(*lateReply)) }
func (h *lateHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

func newWorkerLoop(cfg WorkerConfig, st *WorkerStats, fds []int, seed uint64) (*workerLoop, error) {
	l := &workerLoop{cfg: cfg, st: st, fds: fds, rng: rand.New(rand.NewPCG(seed, seed^0x6b53)),
		epfd: -1, stopf: -1, timer: -1}
	var err error
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if l.stopf, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		l.close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if l.timer, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
		l.close()
		return nil, fmt.Errorf("timerfd_create: %w", err)
	}
	for _, fd := range append([]int{l.stopf, l.timer}, fds...) {
		if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			l.close()
			return nil, fmt.Errorf("epoll_ctl: %w", err)
		}
	}
	for i := range l.rbufs {
		l.rbufs[i] = make([]byte, 65536)
		l.riovs[i].Base = &l.rbufs[i][0]
		l.riovs[i].SetLen(len(l.rbufs[i]))
	}
	l.nparts = cfg.NParts()
	rlen := HdrLen + max(cfg.Elems, 1)*ElemSize(cfg.Type)
	n := 2 * workerBatch * l.nparts
	l.shdrs, l.siovs, l.sbufs = make([]Mmsghdr, n), make([]unix.Iovec, n), make([][]byte, n)
	for i := range l.sbufs {
		l.sbufs[i] = make([]byte, 0, rlen)
	}
	return l, nil
}

// close releases the loop's own descriptors (not the sockets: RunWorkers owns them).
func (l *workerLoop) close() {
	for _, fd := range []int{l.epfd, l.stopf, l.timer} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	l.epfd, l.stopf, l.timer = -1, -1, -1
}

// stop makes run return; safe before, during and after run.
func (l *workerLoop) stop() {
	one := [8]byte{1}
	_, _ = unix.Write(l.stopf, one[:])
}

// run serves until stop. It keeps its goroutine on one OS thread: the loop blocks in
// epoll_wait, not in Go's netpoller.
func (l *workerLoop) run() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	events := make([]unix.EpollEvent, 256)
	for {
		n, err := unix.EpollWait(l.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range events[:n] {
			switch fd := int(ev.Fd); fd {
			case l.stopf:
				return nil
			case l.timer:
				var b [8]byte
				_, _ = unix.Read(l.timer, b[:])
				l.sendDue()
			default:
				l.serve(fd)
			}
		}
	}
}

// serve takes what fd has queued (one recvmmsg) and answers it (one sendmmsg).
func (l *workerLoop) serve(fd int) {
	for i := range l.rhdrs {
		l.rhdrs[i].Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&l.names[i])), Namelen: unix.SizeofSockaddrInet6,
			Iov: &l.riovs[i], Iovlen: 1}
	}
	n, err := Recvmmsg(fd, l.rhdrs[:], unix.MSG_DONTWAIT)
	if err != nil || n == 0 {
		return // EAGAIN (another loop's wake-up cannot happen: one loop per socket) or an error queued on the socket
	}
	var requests, malformed, dropped, replies, dups, straggles uint64
	k := 0
	for i := range n {
		h, _, err := ParseHeader(l.rbufs[i][:l.rhdrs[i].Len])
		if err != nil || h.Op != OpRequest {
			malformed++
			continue
		}
		requests++
		if l.cfg.Loss > 0 && l.rng.Float64() < l.cfg.Loss {
			dropped++
			continue
		}
		dup := l.cfg.Dup > 0 && l.rng.Float64() < l.cfg.Dup
		d, straggled := delay(l.cfg, l.rng)
		if straggled {
			straggles++
		}
		if d > 0 {
			lr := &lateReply{due: monotonicNow() + int64(d), fd: fd, name: l.names[i], namelen: l.rhdrs[i].Hdr.Namelen,
				reply: BuildReply(h, l.cfg), dup: dup}
			heap.Push(&l.late, lr)
			if l.late[0] == lr {
				l.arm()
			}
			continue
		}
		first := k
		for p := range l.nparts {
			l.sbufs[k] = AppendPart(l.sbufs[k][:0], h, l.cfg, p, l.nparts)
			if !l.losePart() {
				l.queue(k, &l.names[i], l.rhdrs[i].Hdr.Namelen, l.sbufs[k])
				k++
			}
		}
		replies++
		if dup {
			for j, end := first, k; j < end; j++ {
				l.queue(k, &l.names[i], l.rhdrs[i].Hdr.Namelen, l.sbufs[j])
				k++
			}
			dups++
		}
	}
	l.send(fd, l.shdrs[:k])
	l.st.Requests.Add(requests)
	l.st.Malformed.Add(malformed)
	l.st.Dropped.Add(dropped)
	l.st.Replies.Add(replies)
	l.st.Dups.Add(dups)
	l.st.Straggled.Add(straggles)
}

// losePart draws whether one part of a multi-packet reply is lost (PartLoss).
func (l *workerLoop) losePart() bool {
	return l.nparts > 1 && l.cfg.PartLoss > 0 && l.rng.Float64() < l.cfg.PartLoss
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// queue points send header k at reply b to the address in name.
func (l *workerLoop) queue(k int, name *unix.RawSockaddrInet6, namelen uint32, b []byte) {
	l.siovs[k].Base = &b[0]
	l.siovs[k].SetLen(len(b))
	l.shdrs[k].Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(name)), Namelen: namelen, Iov: &l.siovs[k], Iovlen: 1}
}

// send sends hdrs on fd. A full send buffer waits (poll) until it drains, as a blocking
// socket would; a datagram the kernel refuses otherwise is skipped.
func (l *workerLoop) send(fd int, hdrs []Mmsghdr) {
	for off := 0; off < len(hdrs); {
		r, err := Sendmmsg(fd, hdrs[off:], 0)
		switch {
		case err == nil:
			off += r
		case errors.Is(err, unix.EAGAIN):
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
			_, _ = unix.Poll(pfd, 100)
		case errors.Is(err, unix.EINTR):
		default:
			off++ // this datagram cannot be sent (e.g. no route): the next ones may
		}
	}
}

// sendDue sends every delayed reply that is due and re-arms the timer for the next.
func (l *workerLoop) sendDue() {
	now := monotonicNow()
	for len(l.late) > 0 && l.late[0].due <= now {
		lr := heap.Pop(&l.late).(*lateReply)
		k := 0
		for range 1 + b2i(lr.dup) {
			for _, d := range lr.reply {
				if !l.losePart() {
					l.queue(k, &lr.name, lr.namelen, d)
					k++
				}
			}
		}
		l.send(lr.fd, l.shdrs[:k])
		l.st.Replies.Add(1)
		if lr.dup {
			l.st.Dups.Add(1)
		}
	}
	l.arm()
}

// arm sets the timerfd to the earliest delayed reply (or disarms it).
func (l *workerLoop) arm() {
	var its unix.ItimerSpec
	if len(l.late) > 0 {
		its.Value = unix.NsecToTimespec(l.late[0].due)
	}
	_ = unix.TimerfdSettime(l.timer, unix.TFD_TIMER_ABSTIME, &its, nil)
}

func monotonicNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
