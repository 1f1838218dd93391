package sgbench

import (
	"fmt"
	"net/netip"
	"unsafe"

	isg "github.com/kedge-dev/kedge/internal/sg"
	"golang.org/x/sys/unix"
)

// fillSendHdrs points s.hdrs[i] at worker i's copy and address.
func (s *sockReq) fillSendHdrs() {
	n := len(s.dsts)
	if len(s.hdrs) < n {
		s.hdrs = make([]isg.Mmsghdr, max(n, len(s.rbufs)))
		s.iovs = make([]unix.Iovec, max(n, len(s.rbufs)))
		s.names = make([]unix.RawSockaddrInet6, n)
	}
	for i, w := range s.o.Workers {
		s.iovs[i].Base = &s.reqs[i][0]
		s.iovs[i].SetLen(len(s.reqs[i]))
		h := &s.hdrs[i].Hdr
		*h = unix.Msghdr{Iov: &s.iovs[i], Iovlen: 1}
		a := w
		if !s.v6 {
			a = netip.AddrPortFrom(w.Addr().Unmap(), w.Port())
		}
		h.Namelen = isg.PutSockaddr(&s.names[i], a)
		h.Name = (*byte)(unsafe.Pointer(&s.names[i]))
	}
}

// sendmmsg sends each worker its copy, up to 1024 per system call (UIO_MAXIOV).
func (s *sockReq) sendmmsg() error {
	s.fillSendHdrs()
	n := len(s.dsts)
	for off := 0; off < n; {
		r, err := isg.Sendmmsg(s.fd, s.hdrs[off:n], 0)
		if err != nil {
			if err == unix.EAGAIN || err == unix.EINTR {
				continue // socket buffer full: try again
			}
			return fmt.Errorf("sendmmsg: %w", err)
		}
		off += r
	}
	return nil
}

// recvmmsg receives up to len(s.rbufs) datagrams; lengths in s.hdrs[i].Len.
func (s *sockReq) recvmmsg(flags int) (int, error) {
	k := len(s.rbufs)
	if len(s.hdrs) < k {
		s.hdrs = make([]isg.Mmsghdr, k)
		s.iovs = make([]unix.Iovec, k)
	}
	for i := range k {
		s.iovs[i].Base = &s.rbufs[i][0]
		s.iovs[i].SetLen(len(s.rbufs[i]))
		s.hdrs[i].Hdr = unix.Msghdr{Iov: &s.iovs[i], Iovlen: 1}
	}
	return isg.Recvmmsg(s.fd, s.hdrs[:k], flags)
}
