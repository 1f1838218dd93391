package sg

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestRingHoldNoWakeup: the kernel wakes the ring's reader only for a record committed at
// the published consumer position. While the ring is held (the reader polls), the records
// after the one it read wake nobody; Release publishes the position, reports a record
// reserved beyond it, and the next record wakes the reader again. Without Hold every
// record committed after the reader caught up wakes it (the control). Wake-ups are seen
// as events of an edge-triggered epoll on the ring's fd: one only on a wake-up.
func TestRingHoldNoWakeup(t *testing.T) {
	f := newFixture(t, 1, coord4, w4, RedSum, TypeI64, 3, 0)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, f.o.Results.FD(), &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET}); err != nil {
		t.Fatal(err)
	}
	woken := func() bool {
		t.Helper()
		ev := make([]unix.EpollEvent, 1)
		for {
			n, err := unix.EpollWait(ep, ev, 100) // the wake-up is an irq_work: not synchronous
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			return n > 0
		}
	}
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	next := uint64(80)
	complete := func() {
		t.Helper()
		id := uint64(1)<<10 | next
		next++
		f.arm(t, 1, id, 1)
		r.Run(t, []bpftest.Case{{Name: "completing reply", In: reply(w4[0], coord4, 1, 0, id, vec64(1, 2, 3), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}}})
	}
	read := func() {
		t.Helper()
		if !f.rd.Next(func([]byte) {}) {
			t.Fatal("no record to read")
		}
	}

	complete()
	if !woken() {
		t.Fatal("first record into an empty ring: no wake-up")
	}
	f.rd.Hold()
	read()
	complete()
	if woken() {
		t.Fatal("held: the record after the one read woke the reader")
	}
	if !f.rd.Pending() {
		t.Fatal("held: the unread record is not pending")
	}
	if !f.rd.Release() {
		t.Fatal("Release: a record reserved beyond the read position not reported")
	}
	read()
	if f.rd.Release() || f.rd.Pending() {
		t.Fatal("Release: a record reported where none is")
	}
	complete()
	if !woken() {
		t.Fatal("released: the next record did not wake the reader")
	}
	// The control: not held, the reader's position is published as it reads.
	read()
	complete()
	if !woken() {
		t.Fatal("not held: the record after the one read did not wake the reader")
	}
	read()
}
