package sg

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nsSeq numbers this process's test namespaces: names are netnsx.OwnedName's (kedge-<owner>-...),
// unique per run, and `kedge cleanup` removes them once their owner is dead (SIGKILL).
var nsSeq atomic.Uint64

// scatterNS is a namespace with a veth pair: the scatter's copies leave through sa0 and
// are captured on sa1 with a packet socket.
type scatterNS struct {
	ns   *netnsx.Netns
	out  int // sa0's ifindex
	sock int // AF_PACKET socket on sa1
}

func newScatterNS(t *testing.T) *scatterNS {
	t.Helper()
	ns, err := netnsx.New(netnsx.OwnedName(fmt.Sprintf("sgscat%d", nsSeq.Add(1))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	s := &scatterNS{ns: ns}
	err = ns.Do(func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sa0"}, PeerName: "sa1"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		for _, n := range []string{"sa0", "sa1"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			if n == "sa0" {
				s.out = l.Attrs().Index
				continue
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(bpfx.Htons(unix.ETH_P_ALL)))
			if err != nil {
				return err
			}
			s.sock = fd
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: bpfx.Htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
				return err
			}
			tv := unix.Timeval{Usec: 200_000}
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				return err
			}
		}
		// A veth transmits only once linkwatch has activated its qdisc (operstate UP);
		// until then copies go to the noop qdisc and are dropped.
		for deadline := time.Now().Add(10 * time.Second); ; {
			l, err := netlink.LinkByName("sa0")
			if err != nil {
				return err
			}
			if l.Attrs().OperState == netlink.OperUp {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sa0 not up: %v", l.Attrs().OperState)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(s.sock) })
	return s
}

// capture returns the sg datagrams sa1 received (IPv6 neighbour/router chatter skipped).
func (s *scatterNS) capture(t *testing.T, want int) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 65536)
	deadline := time.Now().Add(2 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(s.sock, buf, 0)
		if err != nil {
			continue // timeout: poll again until the deadline
		}
		if bytes.Contains(buf[:n], []byte{0x6b, 0x53, Version, OpRequest}) {
			out = append(out, append([]byte(nil), buf[:n]...))
		}
	}
	return out
}

func request(from, to netip.AddrPort, gid uint16, id uint64, payload []byte) []byte {
	h := Header{Version: Version, Op: OpRequest, Group: gid, ReqID: id, PayloadLen: uint32(len(payload))}
	d := append(h.Append(nil), payload...)
	b := pktbuild.New()
	if from.Addr().Is4() {
		b = b.IPv4(pktbuild.IPv4{Src: from.Addr(), Dst: to.Addr()})
	} else {
		b = b.IPv6(pktbuild.IPv6{Src: from.Addr(), Dst: to.Addr()})
	}
	return b.UDP(pktbuild.UDP{Src: from.Port(), Dst: to.Port()}).Payload(d).Build()
}

// scatterFixture loads the data plane with batch (0: the default) and points group 1's
// copies at a veth whose peer captures them; workers get MACs 02:00:00:00:00:1i.
func scatterFixture(t *testing.T, coord netip.AddrPort, workers []netip.AddrPort, batch uint32) (*fixture, *scatterNS, int) {
	t.Helper()
	return scatterFixtureWith(t, coord, workers, LoadOptions{Batch: batch})
}

func scatterFixtureWith(t *testing.T, coord netip.AddrPort, workers []netip.AddrPort, opts LoadOptions) (*fixture, *scatterNS, int) {
	t.Helper()
	bpftest.RequireRoot(t)
	opts.Tier = DetectTier()
	f := newFixtureWith(t, opts, 1, coord, workers, RedSum, TypeI64, 1, 0)
	untimed, err := f.o.InitTimers(Slots)
	if err != nil {
		t.Fatal(err)
	}
	s := newScatterNS(t)
	var g GroupCfg
	if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	g.Ifindex = uint32(s.out)
	// A deadline no slow guest (TCG) reaches while the cases run: the slot's timer
	// must not expire the request between two counter reads.
	g.TimeoutNs = uint64(time.Hour)
	if err := f.o.Groups.Put(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	for i := range workers {
		var w WorkerCfg
		key := uint32(1*WorkersMax + i)
		if err := f.o.Workers.Lookup(key, &w); err != nil {
			t.Fatal(err)
		}
		w.Mac = [6]byte{2, 0, 0, 0, 0, byte(0x10 + i)}
		if err := f.o.Workers.Put(key, &w); err != nil {
			t.Fatal(err)
		}
	}
	return f, s, untimed
}

// checkCopies checks the captured copies of request id: one per worker, in order, each
// rewritten for its worker with valid checksums.
func checkCopies(t *testing.T, got [][]byte, workers []netip.AddrPort, id uint64) {
	t.Helper()
	if len(got) != len(workers) {
		t.Fatalf("captured %d copies, want %d", len(got), len(workers))
	}
	for i, frame := range got {
		if err := pktbuild.VerifyChecksums(frame); err != nil {
			t.Errorf("copy %d: %v", i, err)
		}
		w := workers[i]
		var dst netip.Addr
		var dport uint16
		var hdr []byte
		if w.Addr().Is4() {
			dst = netip.AddrFrom4([4]byte(frame[30:34]))
			dport = binary.BigEndian.Uint16(frame[36:])
			hdr = frame[42:]
		} else {
			dst = netip.AddrFrom16([16]byte(frame[38:54]))
			dport = binary.BigEndian.Uint16(frame[56:])
			hdr = frame[62:]
		}
		h, p, err := ParseHeader(hdr)
		if err != nil || dst != w.Addr() || dport != w.Port() || int(h.Worker) != i || h.ReqID != id ||
			string(p) != "payload" || !bytes.Equal(frame[:6], []byte{2, 0, 0, 0, 0, byte(0x10 + i)}) {
			t.Errorf("copy %d: to %v:%d mac %x worker %d id %#x payload %q (%v); want worker %d at %v",
				i, dst, dport, frame[:6], h.Worker, h.ReqID, p, err, i, w)
		}
	}
}

var families = []struct {
	name    string
	coord   netip.AddrPort
	workers []netip.AddrPort
}{{"ipv4", coord4, w4}, {"ipv6", coord6, w6}}

func TestScatterCopies(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			f, s, untimed := scatterFixture(t, fam.coord, fam.workers, 0)
			id := uint64(5)<<10 | 70
			in := request(fam.coord, fam.workers[0], 1, id, []byte("payload"))
			var res bpftest.Result
			var delta bpftest.Counters
			err := s.ns.Do(func() (err error) {
				delta, err = bpftest.Delta(f.counters, func() (err error) {
					res, err = bpftest.Run(f.o.Scatter, in)
					return err
				})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Ret != bpftest.TCActShot {
				t.Errorf("verdict %d, want TC_ACT_SHOT (the original is dropped)", int32(res.Ret))
			}
			if untimed > 0 { // bpf_timer_init -ENOMEM (kernel-notes): the sweep covers the slot
				delete(delta, "1.TimerErrors")
			}
			if d := delta.Diff(bpftest.Counters{"1.Requests": 1, "1.Copies": int64(len(fam.workers))}); d != "" {
				t.Errorf("counters:\n%s", d)
			}
			checkCopies(t, s.capture(t, len(fam.workers)), fam.workers, id)
			var slot SlotRec
			if err := f.o.Slots.Lookup(uint32(id&SlotMask), &slot); err != nil {
				t.Fatal(err)
			}
			if slot.State != SlotPending || slot.Res.ReqId != id || int(slot.Res.Need) != len(fam.workers) {
				t.Errorf("slot state %d id %#x need %d", slot.State, slot.Res.ReqId, slot.Res.Need)
			}

			// The same request again: its slot is pending, never overwritten.
			r := bpftest.Runner{Prog: f.o.Scatter, Counters: f.counters}
			other := netip.AddrPortFrom(fam.coord.Addr(), fam.coord.Port()+1)
			cases := []bpftest.Case{
				{Name: "slot busy", In: in, WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"1.Requests": 1, "1.SlotBusy": 1}},
				{Name: "slot of another group", In: request(fam.coord, fam.workers[0], 1, uint64(5)<<10|3, nil),
					WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"1.Requests": 1, "1.SlotRange": 1}},
				{Name: "not the coordinator socket", In: request(other, fam.workers[0], 1, id+1024, nil),
					WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"1.NotOwner": 1}},
				{Name: "unknown group", In: request(fam.coord, fam.workers[0], 4, id+1024, nil),
					WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"16.UnknownGroup": 1}},
				{Name: "truncated header", In: pktbuild.New().IPv4(pktbuild.IPv4{}).UDP(pktbuild.UDP{Src: 1, Dst: 2}).Payload([]byte{0x6b, 0x53, 1, 1, 0}).Build(),
					WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{"16.Malformed": 1}},
				{Name: "not sg", In: pktbuild.New().IPv4(pktbuild.IPv4{}).UDP(pktbuild.UDP{Src: 1, Dst: 2}).Payload([]byte("GET /")).Build(),
					WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{}},
			}
			if err := s.ns.Do(func() error { r.Run(t, cases); return nil }); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// handOn runs a request through the scatter and every batch after it, the way the kernel
// does: each run of sg_scatter_cont takes the packet the previous run redirected, marked
// ContMark, at the group interface's ingress. Each run is a fixture case: the verdict
// (redirect while batches remain, then shot) and, with copies given, the counter changes of
// each run (runs[0] the scatter's, then one per handed-on batch).
func handOn(t *testing.T, f *fixture, s *scatterNS, in []byte, copies []int64) {
	t.Helper()
	r := bpftest.Runner{Counters: f.counters, Within: s.ns.Do}
	pkt := in
	for k, n := range copies {
		last := k == len(copies)-1
		c := bpftest.Case{
			Name:    fmt.Sprintf("run %d (%d copies)", k, n),
			Prog:    f.o.Cont,
			In:      pkt,
			Skb:     &bpftest.SkBuff{Mark: ContMark, Ifindex: uint32(s.out)},
			WantRet: bpftest.TCActRedirect,
			// A run hands the request on until the last batch, then drops the original.
			WantCounters: bpftest.Counters{"1.Copies": n, "1.Continued": 1},
			Check:        func(tb testing.TB, res bpftest.Result) { pkt = res.Out },
		}
		if k == 0 {
			c.Prog, c.Skb = f.o.Scatter, nil
			c.WantCounters["1.Requests"] = 1
		}
		if last {
			c.WantRet = bpftest.TCActShot
			delete(c.WantCounters, "1.Continued")
		}
		r.RunCase(t, c)
	}
}

// TestScatterBatches: with a batch of 1, each run of the scatter sends one copy and hands
// the request on (TC_ACT_REDIRECT to the interface's ingress, marked); sg_scatter_cont
// picks it up from the packet the previous run left and sends the next, until the last
// worker. A handed-on request whose slot no longer holds it stops; unmarked traffic at
// ingress passes.
func TestScatterBatches(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			f, s, _ := scatterFixture(t, fam.coord, fam.workers, 1)
			id := uint64(6)<<10 | 71
			in := request(fam.coord, fam.workers[0], 1, id, []byte("payload"))
			copies := make([]int64, len(fam.workers))
			for i := range copies {
				copies[i] = 1
			}
			handOn(t, f, s, in, copies)
			checkCopies(t, s.capture(t, len(fam.workers)), fam.workers, id)

			other := request(fam.coord, fam.workers[0], 1, id+1024, []byte("payload")) // same slot, not its request
			marked := &bpftest.SkBuff{Mark: ContMark, Ifindex: uint32(s.out)}
			r := bpftest.Runner{Prog: f.o.Cont, Counters: f.counters, Within: s.ns.Do}
			r.Run(t, []bpftest.Case{
				{Name: "handed on, slot holds another request", In: other, Skb: marked,
					WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"1.ContStopped": 1}},
				{Name: "unmarked request at ingress", In: in, Skb: &bpftest.SkBuff{Ifindex: uint32(s.out)},
					WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{}},
				{Name: "marked, not sg", In: pktbuild.New().IPv4(pktbuild.IPv4{}).UDP(pktbuild.UDP{Src: 1, Dst: 2}).Payload([]byte("GET /")).Build(),
					Skb: marked, WantRet: bpftest.TCActUnspec, WantCounters: bpftest.Counters{}},
			})
		})
	}
}

// TestScatterRamp: runs grow from the first batch, each as large as everything sent
// before it, up to the batch (first 1, batch 4: 1, 1, 2, 4, 4, ...), as BatchRuns counts;
// every worker gets its copy once.
func TestScatterRamp(t *testing.T) {
	fam := families[0]
	fam.workers = nil
	for i := range 12 {
		fam.workers = append(fam.workers, netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)}), uint16(9000+i)))
	}
	f, s, _ := scatterFixtureWith(t, fam.coord, fam.workers, LoadOptions{Batch: 4, FirstBatch: 1})
	id := uint64(6)<<10 | 72
	var want []int64
	for next := 0; next < len(fam.workers); {
		k := min(max(1, min(next, 4)), len(fam.workers)-next)
		want = append(want, int64(k))
		next += k
	}
	if fmt.Sprint(want) != "[1 1 2 4 4]" || len(want) != BatchRuns(len(fam.workers), 1, 4) {
		t.Fatalf("copies per run %v (%d runs), want [1 1 2 4 4] (%d runs)", want, len(want), BatchRuns(len(fam.workers), 1, 4))
	}
	handOn(t, f, s, request(fam.coord, fam.workers[0], 1, id, []byte("payload")), want)
	checkCopies(t, s.capture(t, len(fam.workers)), fam.workers, id)
}
