package sg

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Ring consumes the results ring buffer (BPF_MAP_TYPE_RINGBUF) directly from its mapped
// pages, and waits for it in the Go runtime's poller (the epoll set that also holds the
// process's sockets).
//
// cilium/ebpf's ringbuf.Reader is not used for two reasons: it waits in its own epoll
// instance from a blocking system call, so the coordinator socket and the ring cannot be
// waited for together; and its ReadInto blocks in epoll_wait before it looks at the ring
// whenever its last read emptied it, so a record committed with BPF_RB_NO_WAKEUP
// (SG_GF_WAKE_SOCKET's completions) is not seen until some later wake-up.
//
// Layout (kernel/bpf/ringbuf.c): page 0 is the consumer position (read-write), page 1 the
// producer position, then the data pages mapped twice so a record never wraps. Each
// record is an 8-byte header (length with BUSY and DISCARD bits, page offset) and its
// data, padded to 8 bytes.
type Ring struct {
	cons, prod []byte
	consPos    *uintptr
	prodPos    *uintptr
	data       []byte
	mask       uintptr
	file       *os.File // a non-blocking duplicate of the map's fd, in the runtime poller
	raw        syscall.RawConn
	// read is the reader's position: the consumer position once published. held (Hold)
	// keeps the published position behind it, so the kernel, which wakes the reader only
	// for a record at the published position, sends no wake-up while the reader polls.
	read atomic.Uintptr
	held bool
}

const (
	ringHdrLen  = 8
	ringBusyBit = 1 << 31
	ringDiscard = 1 << 30
	ringLenMask = ringDiscard - 1
)

// OpenRing maps m (a BPF_MAP_TYPE_RINGBUF) for reading.
func OpenRing(m *ebpf.Map) (_ *Ring, err error) {
	if m.Type() != ebpf.RingBuf {
		return nil, fmt.Errorf("open ring: map type %s, want RingBuf", m.Type())
	}
	size := int(m.MaxEntries())
	page := os.Getpagesize()
	r := &Ring{mask: uintptr(size - 1)}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if r.cons, err = unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("mmap ring consumer page: %w", err)
	}
	if r.prod, err = unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("mmap ring data pages: %w", err)
	}
	r.consPos = (*uintptr)(unsafe.Pointer(&r.cons[0]))
	r.prodPos = (*uintptr)(unsafe.Pointer(&r.prod[0]))
	r.read.Store(atomic.LoadUintptr(r.consPos))
	r.data = r.prod[page:]
	fd, err := unix.FcntlInt(uintptr(m.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup ring fd: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ring fd non-blocking: %w", err)
	}
	r.file = os.NewFile(uintptr(fd), "sg-results")
	if r.raw, err = r.file.SyscallConn(); err != nil {
		return nil, fmt.Errorf("ring fd: %w", err)
	}
	return r, nil
}

// Available is the number of bytes the producer has reserved beyond the consumer.
func (r *Ring) Available() int {
	return int(atomic.LoadUintptr(r.prodPos) - atomic.LoadUintptr(r.consPos))
}

// Pending reports whether the producer has reserved beyond what the reader has read (the
// record may still be being written). Safe to call beside the reader.
func (r *Ring) Pending() bool {
	return atomic.LoadUintptr(r.prodPos) != r.read.Load()
}

// Hold makes Read and Next stop publishing the consumer position: the kernel wakes the
// reader (irq_work, a self-interrupt on the producer's CPU, then an IPI to the reader's)
// only for a record committed at the published position, so while the reader polls the
// records after it wake nobody. The position is still published, one record behind the
// reader, when a quarter of the ring lies between them, so the producer never runs out of
// room. One reader at a time, as Next.
func (r *Ring) Hold() { r.held = true }

// Release publishes the reader's position and ends Hold. It returns true when the
// producer had reserved beyond it already: that record's commit saw the old position and
// will not wake anyone, so the caller must read on before it waits. The store is a full
// barrier (XCHG) before the producer position's load, and the kernel reserves (advances
// the producer position) before it commits and compares with the consumer position, so
// either this load sees the reservation or the commit sees the new position and wakes.
func (r *Ring) Release() bool {
	r.held = false
	pos := r.read.Load()
	atomic.StoreUintptr(r.consPos, pos)
	return atomic.LoadUintptr(r.prodPos) != pos
}

// consumed advances the reader past a record that started at start and ends at end.
func (r *Ring) consumed(start, end uintptr) {
	r.read.Store(end)
	if !r.held {
		atomic.StoreUintptr(r.consPos, end)
	} else if end-atomic.LoadUintptr(r.consPos) > (r.mask+1)/4 {
		atomic.StoreUintptr(r.consPos, start) // never a position a later record starts at
	}
}

// Read copies the next committed record into dst (as much as fits) and returns the
// record's length; ok is false when no committed record is waiting (empty, or the next
// one is still being written). Discarded records are skipped. One reader at a time.
func (r *Ring) Read(dst []byte) (n int, ok bool) {
	cons := r.read.Load()
	for {
		prod := atomic.LoadUintptr(r.prodPos)
		if prod-cons < ringHdrLen {
			return 0, false
		}
		// An atomic load of the length orders it after the kernel's commit (xchg).
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[cons&r.mask])))
		if hdr&ringBusyBit != 0 {
			return 0, false
		}
		n = int(hdr & ringLenMask)
		start := (cons + ringHdrLen) & r.mask
		rec := cons
		cons += ringHdrLen + uintptr((n+7)&^7)
		if hdr&ringDiscard == 0 {
			copy(dst, r.data[start:start+uintptr(n)])
		}
		r.consumed(rec, cons)
		if hdr&ringDiscard == 0 {
			return n, true
		}
	}
}

// Next hands the next committed record to f where it lies in the ring (no copy; the
// slice is valid only until f returns, when the record is consumed) and returns true;
// false when no committed record is waiting. Discarded records are skipped. A record's
// data starts 8-byte aligned. One reader at a time.
func (r *Ring) Next(f func(rec []byte)) bool {
	cons := r.read.Load()
	for {
		prod := atomic.LoadUintptr(r.prodPos)
		if prod-cons < ringHdrLen {
			return false
		}
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[cons&r.mask])))
		if hdr&ringBusyBit != 0 {
			return false
		}
		n := uintptr(hdr & ringLenMask)
		start := (cons + ringHdrLen) & r.mask
		rec := cons
		cons += ringHdrLen + (n+7)&^7
		if hdr&ringDiscard == 0 {
			f(r.data[start : start+n : start+n])
		}
		// The kernel reuses the record's space only once the consumer position passes it.
		r.consumed(rec, cons)
		if hdr&ringDiscard == 0 {
			return true
		}
	}
}

// ErrRingClosed is returned by Wait after Shutdown.
var ErrRingClosed = errors.New("sg ring closed")

// Wait calls f, and after each wake-up of the ring (the kernel's irq_work after a commit
// that asked for one) calls it again, until f returns true or Shutdown is called. The
// poller is edge-triggered: f must read everything that is there before it returns.
func (r *Ring) Wait(f func() bool) error {
	err := r.raw.Read(func(uintptr) bool { return f() })
	if err != nil {
		return fmt.Errorf("wait for sg ring: %w", ErrRingClosed)
	}
	return nil
}

// Shutdown wakes a Wait and makes it return; the mapping stays until Close.
func (r *Ring) Shutdown() error {
	if r.file == nil {
		return nil
	}
	return r.file.Close()
}

// Close unmaps the ring (after every Read and Wait has returned) and closes its fd.
func (r *Ring) Close() error {
	var errs []error
	if r.file != nil {
		if err := r.file.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, b := range [][]byte{r.prod, r.cons} {
		if b != nil {
			errs = append(errs, unix.Munmap(b))
		}
	}
	r.prod, r.cons, r.data = nil, nil, nil
	return errors.Join(errs...)
}
