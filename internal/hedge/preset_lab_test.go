package hedge

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// presetLab brings up the three-host lab of a preset's lab test (client, srv1, srv2) and
// returns the path of the server binary bin, skipping the test when it is not installed
// (install says how).
func presetLab(t *testing.T, name, bin, install string) (l *lab.Lab, path string) {
	t.Helper()
	requireRoot(t)
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Skipf("%s is not installed (scripts/deps.sh installs it: %s)", bin, install)
	}
	return hedgeLab(t, name), path
}

// presetConn connects a UDP socket from client to the service at to. send writes msg(id)
// with the next 16-bit id and returns the id; recv reads responses until n distinct ids
// arrived or d passed, and returns val of each response of at least minLen bytes by its
// first two bytes (the request id of both presets). A port unreachable (the server not
// bound yet, for an earlier message) is skipped.
func presetConn[T any](t *testing.T, client *lab.Host, to netip.AddrPort, minLen int, val func([]byte) T) (
	send func(msg func(id uint16) []byte) uint16, recv func(n int, d time.Duration) map[uint16]T) {
	t.Helper()
	var conn *net.UDPConn
	if err := client.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	id := uint16(0)
	send = func(msg func(uint16) []byte) uint16 {
		id++
		if _, err := conn.Write(msg(id)); err != nil {
			t.Fatal(err)
		}
		return id
	}
	recv = func(n int, d time.Duration) map[uint16]T {
		got := map[uint16]T{}
		buf := make([]byte, 2048)
		_ = conn.SetReadDeadline(time.Now().Add(d))
		for len(got) < n {
			k, err := conn.Read(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if k >= minLen {
				got[uint16(buf[0])<<8|uint16(buf[1])] = val(buf[:k])
			}
		}
		return got
	}
	return send, recv
}
