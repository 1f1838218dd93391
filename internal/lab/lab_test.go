package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/netnsx"
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
				if _, err := os.Stat(filepath.Join(netnsx.Dir, n)); !os.IsNotExist(err) {
					t.Errorf("namespace %s still present after Close (stat: %v)", n, err)
				}
			}
		})
	}
}

func TestPersistentLabOpenExecDown(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name   string
		fabric Fabric
		mtu    int
	}{{"bridge", Bridge, 0}, {"router", Router, 9000}} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("t%d%s", os.Getpid(), tc.name)
			spec := Spec{Name: name, Fabric: tc.fabric, Hosts: []string{"client", "srv1", "srv2"}, MTU: tc.mtu, Persistent: true}
			up, err := Up(spec)
			if err != nil {
				t.Fatalf("lab up: %v", err)
			}
			t.Cleanup(func() { _, _ = Down(name) })
			up.Release() // as `kedge lab up` does: the lab outlives the handles

			if _, err := Up(spec); !errors.Is(err, ErrExist) {
				t.Errorf("second Up of %s: got %v, want ErrExist", name, err)
			}
			if _, err := netnsx.CleanupStale(); err != nil {
				t.Fatalf("cleanup stale: %v", err)
			}
			names, err := ListPersistent()
			if err != nil || !slices.Contains(names, name) {
				t.Fatalf("ListPersistent() = %v, %v; want it to contain %s", names, err, name)
			}

			l, err := Open(name)
			if err != nil {
				t.Fatalf("open lab: %v", err)
			}
			if !reflect.DeepEqual(l.Spec, spec) {
				t.Errorf("opened spec = %+v, want %+v", l.Spec, spec)
			}
			for i, want := range up.Hosts {
				got := l.Hosts[i]
				if got.HostName != want.HostName || got.Index != want.Index || got.IfIndex != want.IfIndex ||
					got.MAC.String() != want.MAC.String() || got.IPv4 != want.IPv4 || got.IPv6 != want.IPv6 ||
					got.Gateway4 != want.Gateway4 || got.Gateway6 != want.Gateway6 || got.Name != want.Name {
					t.Errorf("opened host %d = %+v, want %+v", i, got, want)
				}
			}
			out, err := l.Host("srv1").Run("/bin/sh", "-c", "cat /proc/net/dev")
			if err != nil || !strings.Contains(out, "eth0:") {
				t.Errorf("exec in srv1: %v; /proc/net/dev = %q, want eth0", err, out)
			}
			roundTrip(t, l.Host("client"), udpEcho(t, l.Host("srv2"), l.Host("srv2").IPv4))
			l.Release()

			removed, err := Down(name)
			if err != nil || len(removed) != 4 {
				t.Fatalf("Down(%s) = %v, %v; want 4 namespaces", name, removed, err)
			}
			for _, n := range removed {
				if _, err := os.Stat(filepath.Join(netnsx.Dir, n)); !os.IsNotExist(err) {
					t.Errorf("namespace %s still present after Down (stat: %v)", n, err)
				}
			}
			if _, err := Open(name); !errors.Is(err, ErrNotFound) {
				t.Errorf("Open after Down: got %v, want ErrNotFound", err)
			}
			if _, err := Down(name); !errors.Is(err, ErrNotFound) {
				t.Errorf("second Down: got %v, want ErrNotFound", err)
			}
		})
	}
}

func TestSpecValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		want string // "" valid
	}{
		{"ok", Spec{Name: "demo", Hosts: []string{"client", "srv-1", "srv.2"}}, ""},
		{"ok persistent", Spec{Name: "demo_2", Hosts: []string{"a"}, Persistent: true}, ""},
		{"owned name may have dashes", Spec{Name: "my-lab", Hosts: []string{"a"}}, ""},
		{"persistent dash", Spec{Name: "my-lab", Hosts: []string{"a"}, Persistent: true}, "not valid"},
		{"no hosts", Spec{Name: "x"}, "at least one host"},
		{"no name", Spec{Hosts: []string{"a"}}, "needs a name"},
		{"fabric host", Spec{Name: "x", Hosts: []string{"fabric"}}, "reserved"},
		{"slash", Spec{Name: "x", Hosts: []string{"a/b"}}, "not valid"},
		{"dot", Spec{Name: "x", Hosts: []string{".."}}, "not valid"},
		{"dup", Spec{Name: "x", Hosts: []string{"a", "b", "a"}}, "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}
