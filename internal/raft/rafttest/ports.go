// Package rafttest holds helpers for the raft packages' tests.
package rafttest

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreeAddr returns a loopback address whose port is free for both TCP and UDP right now.
// The port is drawn below the kernel's ephemeral range (ip_local_port_range): a port taken
// from ":0" is one the kernel may hand to any other socket's outgoing connection before the
// node binds it again (seen as "address already in use" while other test binaries ran).
func FreeAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				low = n
			}
		}
	}
	for range 200 {
		a := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(10000+rand.IntN(low-10000)))
		l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(a))
		if err != nil {
			continue
		}
		u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		l.Close()
		if err == nil {
			u.Close()
			return a
		}
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return netip.AddrPort{}
}
