package chaos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// hedgeLoop is the best user-space hedger we know how to write, so that the comparison with
// the kernel hedger is against a strong opponent rather than a strawman:
//   - the hedge timer is a ppoll(2) timeout in nanoseconds on the sockets themselves, not a
//     Go runtime timer (whose netpoller sleeps in whole milliseconds and so fires up to ~1 ms
//     late), and the thread's timer slack is set to 1 ns (PR_SET_TIMERSLACK) instead of the
//     default 50 µs;
//   - the goroutine is locked to its OS thread for the whole run, so the slack setting sticks
//     and no goroutine migration sits on the critical path; the thread is discarded at the end
//     (the goroutine exits locked), so the setting never leaks into the Go runtime;
//   - responses are matched by id: the first one for the current id wins, any other (the
//     loser of an earlier race) is counted and dropped.
//
// One hedge per request, sent to the alternate replica when there is one, else to the same
// address. With Connected, each destination gets its own connect(2)ed socket and ppoll
// watches both.
type hedgeLoop struct {
	fds       []int // fds[0] sends the request; fds[len-1] sends the hedge
	dst       []unix.Sockaddr
	connected bool
	timeout   time.Duration
	delay     time.Duration
	pollfds   []unix.PollFd
	buf       []byte
	nHedges   int
	lateLog
}

func newHedgeLoop(target, alt netip.AddrPort, connected bool, timeout, delay time.Duration) (*hedgeLoop, error) {
	l := &hedgeLoop{connected: connected, timeout: timeout, delay: delay, buf: make([]byte, maxDatagram)}
	dests := []netip.AddrPort{target}
	if alt.IsValid() && alt != target {
		dests = append(dests, alt)
	}
	nsock := 1
	if connected {
		nsock = len(dests)
	}
	for i := range nsock {
		fd, err := unix.Socket(sockFamily(target), unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("open client socket: %w", err)
		}
		l.fds = append(l.fds, fd)
		if connected {
			if err := unix.Connect(fd, sockaddr(dests[i])); err != nil {
				l.close()
				return nil, fmt.Errorf("connect client socket to %s: %w", dests[i], err)
			}
		}
	}
	for _, d := range dests {
		l.dst = append(l.dst, sockaddr(d))
	}
	for _, fd := range l.fds {
		l.pollfds = append(l.pollfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	return l, nil
}

// start locks the calling goroutine to its thread for good (see the type's comment) and
// sets the thread's timer slack.
func (l *hedgeLoop) start() error {
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set timer slack: %w", err)
	}
	return nil
}

// send sends pkt as the request (hedge false) or as the hedge.
func (l *hedgeLoop) send(pkt []byte, hedge bool) error {
	di := 0
	if hedge {
		di = len(l.dst) - 1
	}
	if l.connected {
		return unix.Send(l.fds[di], pkt, 0)
	}
	return unix.Sendto(l.fds[0], pkt, 0, l.dst[di])
}

func (l *hedgeLoop) do(pkt []byte, id uint32) (time.Duration, bool, error) {
	start := time.Now()
	if err := l.send(pkt, false); err != nil {
		return 0, false, fmt.Errorf("send request: %w", err)
	}
	hedgeAt, giveUpAt := start.Add(l.delay), start.Add(l.timeout)
	hedged := false
	for {
		// Drain what has arrived before deciding anything: a response may already be there.
		for i := range l.pollfds {
			if ok, err := l.drain(l.fds[i], id); err != nil {
				return 0, false, err
			} else if ok {
				return time.Since(start), true, nil
			}
		}
		now := time.Now()
		if !hedged && !now.Before(hedgeAt) {
			if err := l.send(pkt, true); err != nil {
				return 0, false, fmt.Errorf("send hedge: %w", err)
			}
			l.nHedges++
			hedged = true
		}
		wake := hedgeAt
		if hedged {
			wake = giveUpAt
		}
		wait := wake.Sub(now)
		if hedged && wait <= 0 {
			return now.Sub(start), false, nil
		}
		ts := unix.NsecToTimespec(max(wait, 0).Nanoseconds())
		if _, err := unix.Ppoll(l.pollfds, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, false, fmt.Errorf("poll client sockets: %w", err)
		}
	}
}

// drain reads every queued datagram of fd and reports whether one carried id.
func (l *hedgeLoop) drain(fd int, id uint32) (bool, error) {
	for {
		n, err := unix.Read(fd, l.buf)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			return false, nil
		case errors.Is(err, unix.ECONNREFUSED):
			// An ICMP port unreachable on a connected socket: the replica is not there. Keep
			// waiting; the hedge or the timeout decides.
			continue
		case err != nil:
			return false, fmt.Errorf("receive response: %w", err)
		}
		if n >= IDLen && binary.BigEndian.Uint32(l.buf) == id {
			return true, nil
		}
		l.stray(l.buf[:n])
	}
}

func (l *hedgeLoop) hedges() int { return l.nHedges }
func (l *hedgeLoop) reset()      { l.nHedges, l.lateLog = 0, lateLog{} }

func (l *hedgeLoop) close() error {
	var errs []error
	for _, fd := range l.fds {
		if err := unix.Close(fd); err != nil {
			errs = append(errs, fmt.Errorf("close client socket: %w", err))
		}
	}
	l.fds = nil
	return errors.Join(errs...)
}

func sockFamily(a netip.AddrPort) int {
	if a.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func sockaddr(a netip.AddrPort) unix.Sockaddr {
	if a.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
}
