package sgbench

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr is struct mmsghdr (x/sys/unix has no sendmmsg/recvmmsg wrappers).
type mmsghdr struct {
	Hdr unix.Msghdr
	Len uint32
	_   [4]byte
}

// fillSendHdrs points s.hdrs[i] at worker i's copy and address.
func (s *sockReq) fillSendHdrs() {
	n := len(s.dsts)
	if len(s.hdrs) < n {
		s.hdrs = make([]mmsghdr, max(n, len(s.rbufs)))
		s.iovs = make([]unix.Iovec, max(n, len(s.rbufs)))
		s.names = make([]unix.RawSockaddrInet6, n)
	}
	for i, d := range s.dsts {
		s.iovs[i].Base = &s.reqs[i][0]
		s.iovs[i].SetLen(len(s.reqs[i]))
		h := &s.hdrs[i].Hdr
		*h = unix.Msghdr{Iov: &s.iovs[i], Iovlen: 1}
		switch a := d.(type) {
		case *unix.SockaddrInet4:
			sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&s.names[i]))
			sa.Family = unix.AF_INET
			sa.Port = uint16(a.Port)>>8 | uint16(a.Port)<<8
			sa.Addr = a.Addr
			h.Name = (*byte)(unsafe.Pointer(sa))
			h.Namelen = unix.SizeofSockaddrInet4
		case *unix.SockaddrInet6:
			sa := &s.names[i]
			sa.Family = unix.AF_INET6
			sa.Port = uint16(a.Port)>>8 | uint16(a.Port)<<8
			sa.Addr = a.Addr
			h.Name = (*byte)(unsafe.Pointer(sa))
			h.Namelen = unix.SizeofSockaddrInet6
		}
	}
}

// sendmmsg sends each worker its copy, up to 1024 per system call (UIO_MAXIOV).
func (s *sockReq) sendmmsg() error {
	s.fillSendHdrs()
	n := len(s.dsts)
	for off := 0; off < n; {
		end := min(n, off+1024)
		r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.hdrs[off])), uintptr(end-off), 0, 0, 0)
		if errno != 0 {
			if errno == unix.EAGAIN || errno == unix.EINTR {
				continue // socket buffer full: try again
			}
			return fmt.Errorf("sendmmsg: %w", errno)
		}
		off += int(r)
	}
	return nil
}

// recvmmsg receives up to len(s.rbufs) datagrams; lengths in s.hdrs[i].Len.
func (s *sockReq) recvmmsg(flags int) (int, error) {
	k := len(s.rbufs)
	if len(s.hdrs) < k {
		s.hdrs = make([]mmsghdr, k)
		s.iovs = make([]unix.Iovec, k)
	}
	for i := range k {
		s.iovs[i].Base = &s.rbufs[i][0]
		s.iovs[i].SetLen(len(s.rbufs[i]))
		s.hdrs[i].Hdr = unix.Msghdr{Iov: &s.iovs[i], Iovlen: 1}
	}
	r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(k), uintptr(flags), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}
