package pping

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
)

// The TCP peers of the lab tests are processes of their own - this test binary run again
// with peerEnv set - so that a test can put them into a cgroup of its own (the kernel RTT
// source sees the sockets of a cgroup's processes, and this test process is in none it
// created). A server serves each connection the exchange its first line asks for:
//
//	get N R    the server sends N bytes at R bytes/s, then closes (a download)
//	put N R    the client sends N bytes at R bytes/s, the server answers "ok" (an upload)
//	rr N S     N requests of S bytes, each answered at once with S bytes
//
// Bulk transfers are paced by the application (a chunk per tick), as a video or a backup
// client is: an unpaced one fills every queue on the path, whose time is then part of each
// RTT and no longer the path's.
const peerEnv = "KEDGE_PPING_PEER"

// runPeer runs the peer mode's command line and returns the exit code.
func runPeer(args []string) int {
	if err := peerMain(args); err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	return 0
}

func peerMain(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: serve ADDR | ADDR get N | ADDR put N | ADDR rr N S")
	}
	if args[0] == "serve" {
		ln, err := net.Listen("tcp", args[1])
		if err != nil {
			return err
		}
		fmt.Println("listening") // the test waits for this line
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			go serveExchange(c)
		}
	}
	start := time.Now()
	c, err := net.Dial("tcp", args[0])
	if err != nil {
		return err
	}
	defer c.Close()
	nums := make([]int, 0, 2)
	for _, a := range args[2:] {
		n, err := strconv.Atoi(a)
		if err != nil {
			return err
		}
		nums = append(nums, n)
	}
	if _, err := fmt.Fprintln(c, strings.Join(args[1:], " ")); err != nil {
		return err
	}
	switch args[1] {
	case "get":
		if _, err := io.CopyN(io.Discard, c, int64(nums[0])); err != nil {
			return err
		}
	case "put":
		if err := paced(c, int64(nums[0]), int64(nums[1])); err != nil {
			return err
		}
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return err
		}
	case "rr":
		buf := make([]byte, nums[1])
		for range nums[0] {
			if _, err := c.Write(buf); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown exchange %q", args[1])
	}
	fmt.Printf("done in %v\n", time.Since(start))
	return nil
}

func serveExchange(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	f := strings.Fields(line)
	num := func(i int) int64 {
		if i >= len(f) {
			return 0
		}
		n, _ := strconv.ParseInt(f[i], 10, 64)
		return n
	}
	switch f[0] {
	case "get":
		_ = paced(c, num(1), num(2))
	case "put":
		if _, err := io.CopyN(io.Discard, r, num(1)); err == nil {
			_, _ = fmt.Fprintln(c, "ok")
		}
	case "rr":
		buf := make([]byte, num(2))
		for range num(1) {
			if _, err := io.ReadFull(r, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}
}

// pacingTick is how often a paced transfer writes its next chunk.
const pacingTick = 4 * time.Millisecond

// paced writes n zero bytes at rate bytes/s: a chunk every pacingTick.
func paced(w io.Writer, n, rate int64) error {
	chunk := make([]byte, max(rate*int64(pacingTick)/int64(time.Second), 1))
	next := time.Now()
	for n > 0 {
		k := min(n, int64(len(chunk)))
		if _, err := w.Write(chunk[:k]); err != nil {
			return err
		}
		n -= k
		next = next.Add(pacingTick)
		time.Sleep(time.Until(next)) // the application's pacing
	}
	return nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// peerCommand returns this test binary as a peer with args, in host h and cgroup cg.
func peerCommand(t *testing.T, h *lab.Host, cg *bpftest.Cgroup, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := h.Command(self, args...)
	cmd.Env = append(os.Environ(), peerEnv+"=1")
	cg.Place(cmd)
	return cmd
}

// startPeerServer starts a peer server on addr in h (and cg) and waits until it listens.
func startPeerServer(t *testing.T, h *lab.Host, cg *bpftest.Cgroup, addr string) {
	t.Helper()
	cmd := peerCommand(t, h, cg, "serve", addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := h.Start(cmd); err != nil {
		t.Fatalf("start peer server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "listening" {
		t.Fatalf("peer server on %s: %q, %v", addr, line, err)
	}
}

// runPeerClient runs one exchange from h (in cg) to addr and waits for it.
func runPeerClient(t *testing.T, h *lab.Host, cg *bpftest.Cgroup, addr string, exchange ...string) string {
	t.Helper()
	cmd := peerCommand(t, h, cg, append([]string{addr}, exchange...)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := h.Start(cmd); err != nil {
		t.Fatalf("start peer client: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("peer client %v: %v: %s", exchange, err, out.String())
	}
	return strings.TrimSpace(out.String())
}
