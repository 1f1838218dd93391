package sg

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mmsghdr is struct mmsghdr (x/sys/unix has no sendmmsg/recvmmsg wrappers). The reference
// worker and the benchmark's baselines (internal/sgbench) batch their datagrams with it.
type Mmsghdr struct {
	Hdr unix.Msghdr
	Len uint32
	_   [4]byte
}

// MaxMmsg is the most messages one sendmmsg/recvmmsg takes (UIO_MAXIOV).
const MaxMmsg = 1024

// Sendmmsg sends hdrs[i] on fd, at most MaxMmsg per call, and returns how many were sent
// (fewer than len(hdrs) with an error: the first unsent one failed).
func Sendmmsg(fd int, hdrs []Mmsghdr, flags int) (int, error) {
	return mmsg(unix.SYS_SENDMMSG, fd, hdrs, flags)
}

// Recvmmsg receives up to len(hdrs) datagrams (at most MaxMmsg); their lengths are in
// hdrs[i].Len.
func Recvmmsg(fd int, hdrs []Mmsghdr, flags int) (int, error) {
	return mmsg(unix.SYS_RECVMMSG, fd, hdrs, flags)
}

func mmsg(trap uintptr, fd int, hdrs []Mmsghdr, flags int) (int, error) {
	if len(hdrs) == 0 {
		return 0, nil
	}
	r, _, errno := unix.Syscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&hdrs[0])),
		uintptr(min(len(hdrs), MaxMmsg)), uintptr(flags), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// PutSockaddr writes a as a struct sockaddr_in or sockaddr_in6 into sa (big enough for
// both) and returns its length.
func PutSockaddr(sa *unix.RawSockaddrInet6, a netip.AddrPort) uint32 {
	port := a.Port()>>8 | a.Port()<<8
	if a.Addr().Is4() {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*s4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Port: port, Addr: a.Addr().As4()}
		return unix.SizeofSockaddrInet4
	}
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Port: port, Addr: a.Addr().As16()}
	return unix.SizeofSockaddrInet6
}
