package lab

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
}

// udpEcho starts a one-shot UDP echo server in h and returns its address.
func udpEcho(t *testing.T, h *Host, addr netip.Addr) netip.AddrPort {
	t.Helper()
	var conn *net.UDPConn
	err := h.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", h.HostName, err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = conn.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

func roundTrip(t *testing.T, h *Host, to netip.AddrPort) {
	t.Helper()
	var conn *net.UDPConn
	err := h.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		return err
	})
	if err != nil {
		t.Fatalf("dial from %s: %v", h.HostName, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("kedge")); err != nil {
		t.Fatalf("send %s -> %s: %v", h.HostName, to, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "kedge" {
		t.Fatalf("echo %s -> %s: got %q, %v", h.HostName, to, buf[:n], err)
	}
}

func TestLabFabrics(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name   string
		fabric Fabric
	}{{"bridge", Bridge}, {"router", Router}} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Up(Spec{Name: "t" + tc.name, Fabric: tc.fabric, Hosts: []string{"a", "b"}})
			if err != nil {
				t.Fatalf("lab up: %v", err)
			}
			names := []string{l.Fabric.Name, l.Host("a").Name, l.Host("b").Name}
			a, b := l.Host("a"), l.Host("b")
			for _, ip := range []netip.Addr{b.IPv4, b.IPv6} {
				roundTrip(t, a, udpEcho(t, b, ip))
			}
			if err := l.Close(); err != nil {
				t.Fatalf("lab close: %v", err)
			}
			for _, n := range names {
				if _, err := os.Stat(filepath.Join(NetnsDir, n)); !os.IsNotExist(err) {
					t.Errorf("namespace %s still present after Close (stat: %v)", n, err)
				}
			}
		})
	}
}

func TestOwnerPID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		pid  int
		want bool
	}{
		{"kedge-123-lab-a", 123, true},
		{"kedge-123", 123, true},
		{"kedge-x-lab", 0, false},
		{"other-123-lab", 0, false},
		{"kedge-0-lab", 0, false},
	} {
		pid, ok := OwnerPID(tc.in)
		if ok != tc.want || (ok && pid != tc.pid) {
			t.Errorf("OwnerPID(%q) = %d, %v; want %d, %v", tc.in, pid, ok, tc.pid, tc.want)
		}
	}
}

func TestCleanupStaleRemovesDeadOwners(t *testing.T) {
	requireRoot(t)
	// A pid far above pid_max cannot be alive.
	dead := "kedge-99999999-stale"
	ns, err := NewNetns(dead)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	ns.Handle.Close()
	live, err := NewNetns(OwnedName("live"))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer live.Close()
	removed, err := CleanupStale(false)
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	found := false
	for _, r := range removed {
		found = found || r == dead
		if r == live.Name {
			t.Errorf("cleanup removed the live namespace %s", r)
		}
	}
	if !found {
		t.Errorf("cleanup did not remove %s (removed %v)", dead, removed)
	}
}
