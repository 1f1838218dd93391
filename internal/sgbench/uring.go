package sgbench

// The io_uring baseline, from raw system calls (golang.org/x/sys/unix has the numbers; no
// io_uring library: the ones on the module proxy either use cgo or lag the kernel's
// multishot and buffer-ring interfaces). Per requester: one unconnected UDP socket (as
// every baseline), one ring on the requester's own thread; the copies go out as IORING_OP_SENDMSG entries whose
// successful completions are skipped (IOSQE_CQE_SKIP_SUCCESS), the replies come in through
// ONE multishot IORING_OP_RECV (IORING_RECV_MULTISHOT) that picks buffers from a
// registered buffer ring (IORING_REGISTER_PBUF_RING); a request costs one io_uring_enter
// that submits every copy and waits for completions, plus one per further wait. Kernel
// 6.1+ (multishot receive, DEFER_TASKRUN); the benchmark runs on the machine it reports.

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/pkg/kedge"
)

// From include/uapi/linux/io_uring.h.
const (
	iouOffSQRing = 0
	iouOffCQRing = 0x8000000
	iouOffSQEs   = 0x10000000

	iouOpSendmsg = 9
	iouOpRecv    = 27

	iosqeBufferSelect  = 1 << 5
	iosqeCQESkipSucces = 1 << 6
	iouRecvMultishot   = 1 << 1 // in sqe.ioprio

	iouCQEFBuffer     = 1 << 0
	iouCQEFMore       = 1 << 1
	iouCQEBufferShift = 16

	iouEnterGetevents = 1 << 0
	iouEnterExtArg    = 1 << 3

	iouSetupSubmitAll    = 1 << 7
	iouSetupSingleIssuer = 1 << 12
	iouSetupDeferTaskrun = 1 << 13

	iouFeatSingleMmap = 1 << 0
	iouFeatExtArg     = 1 << 8

	iouRegisterPbufRing = 22

	// Receive buffers: replies are 32 + 8 x elems bytes.
	iouBufs    = 4096
	iouBufSize = 512
	iouBGID    = 0

	udRecv = 1 // user_data of the multishot receive; sends use 2 (only failures complete)
	udSend = 2
)

type iouSQOff struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}
type iouCQOff struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type iouParams struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  iouSQOff
	CQOff                                                                  iouCQOff
}

type iouSQE struct {
	Opcode      uint8
	Flags       uint8
	Ioprio      uint16
	Fd          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpFlags     uint32
	UserData    uint64
	BufGroup    uint16
	Personality uint16
	SpliceFdIn  int32
	Addr3       uint64
	_           uint64
}

type iouCQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

type iouBufReg struct {
	RingAddr    uint64
	RingEntries uint32
	BGID        uint16
	Flags       uint16
	_           [3]uint64
}

type iouBuf struct {
	Addr uint64
	Len  uint32
	BID  uint16
	Resv uint16 // of entry 0: the ring's tail
}

type iouGeteventsArg struct {
	Sigmask   uint64
	SigmaskSz uint32
	_         uint32
	Ts        uint64
}

// uring is one io_uring instance with a registered buffer ring.
type uring struct {
	fd                   int
	sqMem, cqMem, sqeMem []byte
	bufRing, bufMem      []byte
	sqHead, sqTail       *uint32
	sqMask               uint32
	sqes                 []iouSQE
	cqHead, cqTail       *uint32
	cqMask               uint32
	cqes                 []iouCQE
	bufs                 []iouBuf
	localTail            uint16
	pending              uint32 // SQEs written, not submitted
}

func newUring(entries uint32) (*uring, error) {
	// One ring per thread, its completions' task work run only when that thread waits
	// (liburing's advice for a ring with one user): the caller locked its OS thread.
	p := iouParams{Flags: iouSetupSubmitAll | iouSetupSingleIssuer | iouSetupDeferTaskrun}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno == unix.EINVAL {
		// Flags the kernel does not know: DEFER_TASKRUN is the newest (6.1).
		return nil, &kedge.FeatureError{Feature: "io_uring with SUBMIT_ALL, SINGLE_ISSUER and DEFER_TASKRUN", MinKernel: "6.1",
			Hint: "run the other methods (--methods)", Err: fmt.Errorf("io_uring_setup: %w", errno)}
	}
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w (io_uring disabled? sysctl kernel.io_uring_disabled)", errno)
	}
	u := &uring{fd: int(fd)}
	fail := func(err error) (*uring, error) { u.close(); return nil, err }
	if p.Features&iouFeatSingleMmap == 0 || p.Features&iouFeatExtArg == 0 {
		return fail(errors.New("io_uring: kernel lacks IORING_FEAT_SINGLE_MMAP or EXT_ARG (needs 5.11+)"))
	}
	ringSz := max(p.SQOff.Array+p.SQEntries*4, p.CQOff.CQEs+p.CQEntries*uint32(unsafe.Sizeof(iouCQE{})))
	var err error
	if u.sqMem, err = unix.Mmap(u.fd, iouOffSQRing, int(ringSz), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap io_uring rings: %w", err))
	}
	u.cqMem = u.sqMem
	if u.sqeMem, err = unix.Mmap(u.fd, iouOffSQEs, int(p.SQEntries)*64, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap io_uring sqes: %w", err))
	}
	at := func(b []byte, off uint32) unsafe.Pointer { return unsafe.Pointer(&b[off]) }
	u.sqHead, u.sqTail = (*uint32)(at(u.sqMem, p.SQOff.Head)), (*uint32)(at(u.sqMem, p.SQOff.Tail))
	u.sqMask = *(*uint32)(at(u.sqMem, p.SQOff.RingMask))
	arr := unsafe.Slice((*uint32)(at(u.sqMem, p.SQOff.Array)), p.SQEntries)
	for i := range arr {
		arr[i] = uint32(i) // identity: SQE i is submitted from ring position i
	}
	u.sqes = unsafe.Slice((*iouSQE)(unsafe.Pointer(&u.sqeMem[0])), p.SQEntries)
	u.cqHead, u.cqTail = (*uint32)(at(u.cqMem, p.CQOff.Head)), (*uint32)(at(u.cqMem, p.CQOff.Tail))
	u.cqMask = *(*uint32)(at(u.cqMem, p.CQOff.RingMask))
	u.cqes = unsafe.Slice((*iouCQE)(at(u.cqMem, p.CQOff.CQEs)), p.CQEntries)

	// The buffer ring (page-aligned, so mmap'ed) and the buffers it hands out.
	if u.bufRing, err = unix.Mmap(-1, 0, iouBufs*16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap buffer ring: %w", err))
	}
	if u.bufMem, err = unix.Mmap(-1, 0, iouBufs*iouBufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap buffers: %w", err))
	}
	u.bufs = unsafe.Slice((*iouBuf)(unsafe.Pointer(&u.bufRing[0])), iouBufs)
	reg := iouBufReg{RingAddr: uint64(uintptr(unsafe.Pointer(&u.bufRing[0]))), RingEntries: iouBufs, BGID: iouBGID}
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(u.fd), iouRegisterPbufRing, uintptr(unsafe.Pointer(&reg)), 1, 0, 0); errno != 0 {
		return fail(fmt.Errorf("register io_uring buffer ring: %w (needs 5.19+)", errno))
	}
	for i := range iouBufs {
		u.recycle(uint16(i))
	}
	u.publishBufs()
	return u, nil
}

func (u *uring) close() {
	for _, m := range [][]byte{u.sqMem, u.sqeMem, u.bufRing, u.bufMem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	unix.Close(u.fd)
}

// recycle gives buffer bid back to the kernel (visible after publishBufs).
func (u *uring) recycle(bid uint16) {
	b := &u.bufs[u.localTail&(iouBufs-1)]
	b.Addr = uint64(uintptr(unsafe.Pointer(&u.bufMem[int(bid)*iouBufSize])))
	b.Len = iouBufSize
	b.BID = bid
	u.localTail++
}

func (u *uring) publishBufs() {
	// A release store of the 16-bit tail (the last field of entry 0): sync/atomic has no
	// 16-bit store, so store the 32-bit word it shares with entry 0's bid, which only this
	// side writes (little-endian: bid low, tail high).
	w := (*uint32)(unsafe.Pointer(&u.bufs[0].BID))
	atomic.StoreUint32(w, uint32(u.bufs[0].BID)|uint32(u.localTail)<<16)
}

// sqe returns the next free submission entry, zeroed, or nil when the ring is full.
func (u *uring) sqe() *iouSQE {
	tail := atomic.LoadUint32(u.sqTail) + u.pending
	if tail-atomic.LoadUint32(u.sqHead) > u.sqMask {
		return nil
	}
	e := &u.sqes[tail&u.sqMask]
	*e = iouSQE{}
	u.pending++
	return e
}

// enter publishes the pending entries and submits them; with wait, it also waits up to
// timeout for at least one completion (false: timed out).
func (u *uring) enter(wait bool, timeout time.Duration) (bool, error) {
	n := u.pending
	atomic.StoreUint32(u.sqTail, atomic.LoadUint32(u.sqTail)+n)
	u.pending = 0
	flags, minC := uintptr(0), uintptr(0)
	var arg iouGeteventsArg
	var ts unix.Timespec
	if wait {
		ts = unix.NsecToTimespec(max(timeout, 0).Nanoseconds())
		arg.Ts = uint64(uintptr(unsafe.Pointer(&ts)))
		flags, minC = iouEnterGetevents|iouEnterExtArg, 1
	}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(u.fd), uintptr(n), minC, flags,
			uintptr(unsafe.Pointer(&arg)), unsafe.Sizeof(arg))
		switch errno {
		case 0:
			return true, nil
		case unix.ETIME:
			return false, nil
		case unix.EINTR:
			n = 0 // submitted already
			continue
		default:
			return false, fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// uringReq is the io_uring baseline's requester. Its ring is made by the goroutine that
// uses it, on its first request, and that goroutine stays on its OS thread from then on
// (IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN: the thread that submits is the one whose
// waits complete the receives).
type uringReq struct {
	*sockReq
	u     *uring
	armed bool // the multishot receive is active
}

func newUringReq(o ClientOptions) (*uringReq, error) {
	s, err := newSockReq(o)
	if err != nil {
		return nil, err
	}
	// The kernel must support it: fail here, not on the first request.
	u, err := newUring(64)
	if err != nil {
		s.close()
		return nil, err
	}
	u.close()
	return &uringReq{sockReq: s}, nil
}

func (r *uringReq) close() {
	if r.u != nil {
		r.u.close()
	}
	r.sockReq.close()
}

func (r *uringReq) do(id uint64) (int64, uint64, bool, error) {
	if r.u == nil {
		runtime.LockOSThread() // for good: the ring belongs to this thread
		entries := uint32(64)
		for entries < uint32(len(r.o.Workers))+2 {
			entries <<= 1
		}
		u, err := newUring(entries)
		if err != nil {
			return 0, id, false, err
		}
		r.u = u
	}
	sum, ok, err := r.exchange(id)
	return sum, id, ok, err
}

func (r *uringReq) exchange(id uint64) (int64, bool, error) {
	clear(r.seen)
	r.request(id)
	r.fillSendHdrs()
	n := len(r.o.Workers)
	if !r.armed {
		r.armRecv()
	}
	for i := range n {
		e := r.u.sqe()
		if e == nil { // ring full (it holds every copy; only after errors): submit first
			if _, err := r.u.enter(false, 0); err != nil {
				return 0, false, err
			}
			e = r.u.sqe()
		}
		e.Opcode, e.Flags, e.Fd = iouOpSendmsg, iosqeCQESkipSucces, int32(r.fd)
		e.Addr = uint64(uintptr(unsafe.Pointer(&r.hdrs[i].Hdr)))
		e.Len = 1
		e.UserData = udSend
	}
	var sum int64
	got := 0
	deadline := time.Now().Add(r.o.Timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return sum, false, nil
		}
		if _, err := r.u.enter(true, left); err != nil {
			return 0, false, err
		}
		if err := r.reap(id, &sum, &got); err != nil {
			return 0, false, err
		}
		if got >= n {
			return sum, true, nil
		}
		if !r.armed {
			r.armRecv()
		}
	}
}

// armRecv queues the multishot receive.
func (r *uringReq) armRecv() {
	e := r.u.sqe()
	e.Opcode, e.Flags, e.Fd = iouOpRecv, iosqeBufferSelect, int32(r.fd)
	e.Ioprio = iouRecvMultishot
	e.BufGroup = iouBGID
	e.UserData = udRecv
	r.armed = true
}

// reap handles every completion: replies (their buffers go back to the ring), the end of
// the multishot receive (re-armed by the caller), failed sends.
func (r *uringReq) reap(id uint64, sum *int64, got *int) error {
	u := r.u
	head, tail := atomic.LoadUint32(u.cqHead), atomic.LoadUint32(u.cqTail)
	for ; head != tail; head++ {
		c := u.cqes[head&u.cqMask]
		switch c.UserData {
		case udSend: // only failures complete (IOSQE_CQE_SKIP_SUCCESS)
			atomic.StoreUint32(u.cqHead, head+1)
			return fmt.Errorf("io_uring sendmsg: %w", unix.Errno(-c.Res))
		case udRecv:
			if c.Flags&iouCQEFMore == 0 {
				r.armed = false // ended (out of buffers: -ENOBUFS, or an error): re-armed
			}
			if c.Res < 0 {
				if errno := unix.Errno(-c.Res); errno != unix.ENOBUFS {
					atomic.StoreUint32(u.cqHead, head+1)
					return fmt.Errorf("io_uring recv: %w", errno)
				}
				continue
			}
			if c.Flags&iouCQEFBuffer != 0 {
				bid := uint16(c.Flags >> iouCQEBufferShift)
				off := int(bid) * iouBufSize
				r.take(u.bufMem[off:off+int(c.Res)], id, sum, got)
				u.recycle(bid)
			}
		}
	}
	atomic.StoreUint32(u.cqHead, head)
	u.publishBufs()
	return nil
}
