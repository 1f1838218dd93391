package floor

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/netnsx"
	isg "github.com/kedge-dev/kedge/internal/sg"
)

func TestMain(m *testing.M) {
	code := m.Run()
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}

// TestDecodeDone: a completion record is the request id in the kernel's byte order;
// shorter records are not completions.
func TestDecodeDone(t *testing.T) {
	rec := binary.NativeEndian.AppendUint64(nil, 0x0123456789abcdef)
	if id, ok := DecodeDone(rec); !ok || id != 0x0123456789abcdef {
		t.Errorf("DecodeDone(%x) = %#x, %v; want 0x0123456789abcdef, true", rec, id, ok)
	}
	if id, ok := DecodeDone(append(rec, 0, 0, 0, 0, 0, 0, 0, 0)); !ok || id != 0x0123456789abcdef {
		t.Errorf("a padded record: %#x, %v", id, ok)
	}
	if _, ok := DecodeDone(rec[:7]); ok {
		t.Error("a 7-byte record decoded")
	}
}

// TestConfigValidate: the limits of floor.bpf.c.
func TestConfigValidate(t *testing.T) {
	good := Config{Interface: "lo", Worker0: netip.MustParseAddrPort("127.0.0.1:20000"), Fanout: 4, InFlight: 32, Timeout: time.Second}
	if c := good; c.validate() != nil || c.PollSpin <= 0 {
		t.Errorf("good config: %v, poll spin %v", c.validate(), c.PollSpin)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.Worker0 = netip.MustParseAddrPort("[::1]:20000") },
		func(c *Config) { c.Fanout = WorkersMax + 1 },
		func(c *Config) { c.Fanout = 0 },
		func(c *Config) { c.Worker0 = netip.MustParseAddrPort("127.0.0.1:65534") },
		func(c *Config) { c.InFlight = Slots + 1 },
		func(c *Config) { c.Timeout = 0 },
	} {
		c := good
		bad(&c)
		if c.validate() == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// reply is a worker's reply datagram to the client's port as lo's XDP sees it: Ethernet,
// IPv4 without options, UDP, the sg header with id.
func reply(dport uint16, id uint64) []byte {
	p := make([]byte, 14, 128)
	binary.BigEndian.PutUint16(p[12:], unix.ETH_P_IP)
	h := isg.Header{Version: isg.Version, Op: isg.OpReply, ReqID: id, PayloadLen: 8}
	payload := append(h.Append(nil), make([]byte, 8)...)
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	copy(ip[12:], []byte{127, 0, 0, 1})
	copy(ip[16:], []byte{127, 0, 0, 1})
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 20001)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	return append(append(append(p, ip...), udp...), payload...)
}

// atomicFetchKernel skips on kernels older than 5.12: the gather's atomic fetch-and-add
// (BPF_ATOMIC with BPF_FETCH) came then.
func atomicFetchKernel(t *testing.T) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", u.Release, err)
	}
	if major < 5 || major == 5 && minor < 12 {
		t.Skipf("kernel %d.%d: the floor's gather needs atomic fetch-and-add (5.12)", major, minor)
	}
}

// TestLoadGather loads the floor and runs its gather (BPF_PROG_TEST_RUN): replies to the
// client's port are dropped and counted, the fan-out's reply (3 of 3) writes its request
// id to the ring and no other does; a datagram to another port passes.
func TestLoadGather(t *testing.T) {
	bpftest.RequireRoot(t)
	atomicFetchKernel(t)
	const client, base, fanout = 40000, 20000, 3
	o, err := Load(1, client, base, fanout)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ring, err := isg.OpenRing(o.FloorRing)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	var got []uint64
	read := func() {
		for ring.Next(func(rec []byte) {
			id, ok := DecodeDone(rec)
			if !ok {
				t.Errorf("record %x: not a completion", rec)
			}
			got = append(got, id)
		}) {
		}
	}
	run := func(pkt []byte, want uint32) {
		t.Helper()
		r, err := bpftest.Run(o.FloorGather, pkt)
		if err != nil {
			t.Fatal(err)
		}
		if r.Ret != want {
			t.Errorf("verdict %d, want %d", r.Ret, want)
		}
	}
	const id = 0xabcdef<<10 | 5
	for i := range fanout {
		run(reply(client, id), bpftest.XDPDrop)
		read()
		if i < fanout-1 && len(got) != 0 {
			t.Fatalf("after %d of %d replies: completions %#x", i+1, fanout, got)
		}
	}
	if len(got) != 1 || got[0] != id {
		t.Fatalf("after %d replies: completions %#x, want [%#x]", fanout, got, uint64(id))
	}
	run(reply(client+1, id), bpftest.XDPPass)
	var count uint64
	if err := o.FloorCounts.Lookup(uint32(id&(Slots-1)), &count); err != nil || count != fanout {
		t.Errorf("slot count %d (%v), want %d", count, err, fanout)
	}
	run(reply(client, id), bpftest.XDPDrop) // a fourth reply: counted, not completed again
	read()
	if len(got) != 1 {
		t.Errorf("a reply past the fan-out completed again: %#x", got)
	}
}

// TestFloorCompletes runs the floor on a private namespace's loopback against a real
// `kedge sg worker` process and counts the completions of the requests it sent.
func TestFloorCompletes(t *testing.T) {
	bpftest.RequireRoot(t)
	atomicFetchKernel(t)
	bin := bpftest.KedgeBinary(t)
	ns, err := netnsx.New(netnsx.OwnedName("sgfloor"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.LoopbackUp(); err != nil {
		t.Fatal(err)
	}
	const fanout, port = 8, 21000
	w := exec.Command(bin, "sg", "worker", "--netns", ns.Path(), "--listen", fmt.Sprintf("127.0.0.1:%d+%d", port, fanout),
		"--type", "int32", "--elems", "256", "--threads", "1")
	w.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	werr, _ := w.StderrPipe()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Process.Signal(syscall.SIGTERM); _ = w.Wait() }()
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(werr)
		sc.Scan()
		ready <- sc.Text()
		for sc.Scan() {
		}
	}()
	select {
	case line := <-ready:
		if !strings.Contains(line, "ready") {
			t.Fatalf("worker: %q", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker not ready after 30 s")
	}
	const goroutines, each = 8, 200
	var sent, done, lost int
	err = netnsx.In(ns.Handle, func() error {
		f, err := Open(Config{Interface: "lo", Worker0: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port),
			Fanout: fanout, InFlight: goroutines, Timeout: 3 * time.Second})
		if err != nil {
			return err
		}
		defer f.Close()
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					_, ok, err := f.Do(context.Background())
					mu.Lock()
					sent++
					if err != nil {
						errs = append(errs, err)
					} else if ok {
						done++
					} else {
						lost++
					}
					mu.Unlock()
					if err != nil || !ok {
						return // a broken floor fails at the first timeout, not after all of them
					}
				}
			}()
		}
		wg.Wait()
		if f.Strays() != 0 {
			t.Errorf("%d completions found no waiter", f.Strays())
		}
		if c, to := f.Completed.Load(), f.TimedOut.Load(); int(c) != done || int(to) != lost {
			t.Errorf("floor counted %d completed, %d timed out; the requesters %d, %d", c, to, done, lost)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests sent, %d completed, %d timed out", sent, done, lost)
	if sent != goroutines*each || done != sent {
		t.Errorf("%d requests sent, %d completed (%d timed out): want all %d completed", sent, done, lost, goroutines*each)
	}
}
