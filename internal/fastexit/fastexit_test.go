package fastexit

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// ownerEnv makes this test binary an owner process (TestKilledOwner): "keep" hands its TCX
// link and packet socket to the helper, "plain" does not.
const ownerEnv = "KEDGE_FASTEXIT_TEST_OWNER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(ownerEnv); mode != "" {
		if err := owner(mode == "keep"); err != nil {
			fmt.Fprintln(os.Stderr, "owner:", err)
			os.Exit(1)
		}
		// Wait to be killed. Not select {}: with no timer or other goroutine pending, the
		// runtime calls that a deadlock and exits (seen in CI); a sleep holds a timer.
		for {
			time.Sleep(time.Hour)
		}
	}
	os.Exit(bpftest.CheckFDLeaks(m))
}

// tcxNext is a TC program that passes everything on (TCX_NEXT).
func tcxNext(tb testing.TB) *ebpf.Program {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "fastexit_next", Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	if err != nil {
		if tb == nil {
			panic(err)
		}
		tb.Skipf("needs a TC program (root, BPF): %v", err)
	}
	return p
}

// attachLo attaches prog at the TCX ingress of lo in ns.
func attachLo(ns *netnsx.Netns, prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	err := ns.Do(func() error {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		l, err = link.AttachTCX(link.TCXOptions{Interface: lo.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
		return err
	})
	return l, err
}

// attached counts the programs at lo's TCX ingress in ns.
func attached(tb testing.TB, ns *netnsx.Netns) int {
	tb.Helper()
	var n int
	err := ns.Do(func() error {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		r, err := link.QueryPrograms(link.QueryOptions{Target: lo.Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		n = len(r.Programs)
		return nil
	})
	if err != nil {
		tb.Fatalf("query tcx programs: %v", err)
	}
	return n
}

func needTCX(t *testing.T) {
	bpftest.RequireRoot(t)
	if ok, why := bpftest.KernelAtLeast(t, 6, 6); !ok {
		t.Skipf("needs TCX links (Linux 6.6): %s", why)
	}
}

// TestReleaseThenClose: while the helper holds a link, the owner's Close leaves it attached;
// released, the owner's Close detaches it at once - the graceful stop is unchanged.
func TestReleaseThenClose(t *testing.T) {
	needTCX(t)
	ns, err := netnsx.New(netnsx.OwnedName("fastexit-rel"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	prog := tcxNext(t)
	defer prog.Close()

	// Released before the close: detached by the owner's Close.
	l, err := attachLo(ns, prog)
	if err != nil {
		t.Fatal(err)
	}
	h, err := Keep("test link", []int{l.(interface{ FD() int }).FD()})
	if err != nil {
		t.Fatal(err)
	}
	if HelperPID() == 0 {
		t.Fatal("no helper after Keep")
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if n := attached(t, ns); n != 0 {
		t.Errorf("released and closed: %d programs still attached", n)
	}
	if err := h.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}

	// Closed while kept: the helper's duplicate keeps it attached until released.
	l, err = attachLo(ns, prog)
	if err != nil {
		t.Fatal(err)
	}
	h, err = Keep("test link", []int{l.(interface{ FD() int }).FD()})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if n := attached(t, ns); n != 1 {
		t.Errorf("kept and closed by its owner: %d programs attached, want 1 (the helper's duplicate)", n)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if n := attached(t, ns); n != 0 {
		t.Errorf("kept, closed, released: %d programs still attached", n)
	}
	// No holds left: the helper exits.
	if pid := HelperPID(); pid != 0 {
		t.Errorf("helper %d still recorded with no holds", pid)
	}
}

// TestKilledOwner kills owner processes (this binary re-run) that hold a TCX link, a packet
// socket, a namespace and a listening TCP socket, with and without the helper, alternating.
// With it, the helper removes the owner's namespace after its death (without: it stays, as
// any killed process's would). The times from SIGKILL until a connected client sees its
// connection end and until a new connection is refused are logged for both, not judged: a
// test asserts no speed (the raft lab test bounds a killed leader's).
func TestKilledOwner(t *testing.T) {
	needTCX(t)
	var with, without []time.Duration
	for round := range 4 {
		keep := round%2 == 0
		closed, refused, nsName := killOwner(t, keep)
		if keep {
			with = append(with, max(closed, refused))
			deadline := time.Now().Add(10 * time.Second)
			for {
				if _, err := os.Stat("/run/netns/" + nsName); errors.Is(err, os.ErrNotExist) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the killed owner's namespace %s still there after 10s: the helper did not remove it", nsName)
				}
				time.Sleep(10 * time.Millisecond) // polling the helper's cleanup
			}
		} else {
			without = append(without, max(closed, refused))
			if _, err := os.Stat("/run/netns/" + nsName); err != nil {
				t.Errorf("without the helper the killed owner's namespace should stay (nothing removes it): %v", err)
			}
			if err := netnsx.Delete(nsName); err != nil {
				t.Error(err)
			}
		}
	}
	slices.Sort(with)
	slices.Sort(without)
	t.Logf("SIGKILL until the last socket closed: with the helper %v, without %v", with, without)
}

// killOwner starts an owner, connects to its listener, kills it and returns how long after
// SIGKILL the connection ended and a new one was refused, and the owner's namespace.
func killOwner(t *testing.T, keep bool) (closed, refused time.Duration, nsName string) {
	t.Helper()
	mode := "plain"
	if keep {
		mode = "keep"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), ownerEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("owner did not start: %v", err)
	}
	var addr string
	if _, err := fmt.Sscan(line, &nsName, &addr); err != nil {
		t.Fatalf("owner said %q: %v", line, err)
	}
	ns, err := netnsx.OpenNamed(nsName)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var conn net.Conn
	if err := netnsx.In(ns, func() (err error) { conn, err = net.Dial("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ended := make(chan time.Time, 1)
	go func() {
		conn.Read(make([]byte, 1))
		ended <- time.Now()
	}()
	t0 := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for refused == 0 && time.Since(t0) < 10*time.Second {
		netnsx.In(ns, func() error {
			c, err := net.DialTimeout("tcp", addr, 5*time.Millisecond)
			if err == nil {
				c.Close()
			} else if errors.Is(err, syscall.ECONNREFUSED) {
				refused = time.Since(t0)
			}
			return nil
		})
		time.Sleep(100 * time.Microsecond) // polling for the refusal
	}
	select {
	case at := <-ended:
		closed = at.Sub(t0)
	case <-time.After(10 * time.Second):
		t.Fatal("the connection to the killed owner never ended")
	}
	if refused == 0 {
		t.Fatal("the killed owner's listener never refused")
	}
	return closed, refused, nsName
}

// owner is the killed process: a namespace with a TCX link on its lo, a packet socket in it,
// a listener on its loopback; with keep, the link and the socket go to the helper with the
// namespace. It prints "NAMESPACE ADDRESS" when ready.
func owner(keep bool) error {
	ns, err := netnsx.New(netnsx.OwnedName("fastexit-kill"))
	if err != nil {
		return err
	}
	if err := ns.LoopbackUp(); err != nil {
		return err
	}
	l, err := attachLo(ns, tcxNext(nil))
	if err != nil {
		return err
	}
	var pfd int
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		if pfd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		return err
	}
	go func() {
		var conns []net.Conn // held open until the kill
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	if keep {
		if _, err := Keep("test owner", []int{l.(interface{ FD() int }).FD(), pfd}, ns.Name); err != nil {
			return err
		}
	}
	fmt.Println(ns.Name, ln.Addr())
	return nil
}
