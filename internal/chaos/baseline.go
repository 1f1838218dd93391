package chaos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

// baselineLoop is the control client (thesis §4.3.1, Algorithm 5): one plain Go UDP socket,
// send, then a blocking receive with a deadline. It deliberately knows nothing about hedging,
// because run under the kernel hedger it *is* the kernel-hedged client. The one thing it
// does beyond the thesis is to skip responses carrying another id (a late answer to an
// earlier request, e.g. the loser of a kernel hedge race): a real client would match
// responses to requests too, and counting them shows the duplicates reaching the application.
type baselineLoop struct {
	conn      *net.UDPConn
	target    netip.AddrPort
	connected bool
	timeout   time.Duration
	buf       []byte
	lateLog
}

func newBaselineLoop(target netip.AddrPort, connected bool, timeout time.Duration) (*baselineLoop, error) {
	l := &baselineLoop{target: target, connected: connected, timeout: timeout, buf: make([]byte, maxDatagram)}
	var err error
	if connected {
		l.conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(target))
	} else {
		l.conn, err = net.ListenUDP(udpNetwork(target), nil)
	}
	if err != nil {
		return nil, fmt.Errorf("open client socket to %s: %w", target, err)
	}
	return l, nil
}

func (l *baselineLoop) do(pkt []byte, id uint32) (time.Duration, bool, error) {
	start := time.Now()
	var err error
	if l.connected {
		_, err = l.conn.Write(pkt)
	} else {
		_, err = l.conn.WriteToUDPAddrPort(pkt, l.target)
	}
	if err != nil {
		return 0, false, fmt.Errorf("send request: %w", err)
	}
	if err := l.conn.SetReadDeadline(start.Add(l.timeout)); err != nil {
		return 0, false, fmt.Errorf("set read deadline: %w", err)
	}
	for {
		// Read serves both socket kinds: an unconnected socket takes answers from anyone.
		n, err := l.conn.Read(l.buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return time.Since(start), false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("receive response: %w", err)
		}
		if n >= IDLen && binary.BigEndian.Uint32(l.buf) == id {
			return time.Since(start), true, nil
		}
		l.stray(l.buf[:n])
	}
}

func (l *baselineLoop) start() error { return nil }
func (l *baselineLoop) hedges() int  { return 0 }
func (l *baselineLoop) reset()       { l.lateLog = lateLog{} }
func (l *baselineLoop) close() error { return l.conn.Close() }

func udpNetwork(a netip.AddrPort) string {
	if a.Addr().Is4() {
		return "udp4"
	}
	return "udp6"
}

// resolveUDP resolves host:port to an address, IPv4 in its 4-byte form.
func resolveUDP(hostport string) (netip.AddrPort, error) {
	ua, err := net.ResolveUDPAddr("udp", hostport)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve %q: %w", hostport, err)
	}
	ap := ua.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}
