package lab

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The delay line of a router fabric: a tun device ("fdelay") in the fabric namespace. The
// fault program redirects a delayed packet to it (its egress, that is: to this process's
// reader), the reader holds it for the link's delay plus jitter and writes it back; it
// re-enters the fabric on fdelay and the router forwards it to its destination as usual.
// A link without jitter keeps its packets in order, as a wire does: one queue per link,
// released by one goroutine in arrival order (a timer per packet fired them out of order
// by milliseconds when the CPUs were busy); with jitter each packet has its own timer and
// may overtake others.
// No sch_netem is needed (this kernel has none); the cost is one copy to user space and
// back per delayed packet, and Go timer precision (tens of microseconds when idle, more
// under load: the delays are for fault injection, not for measuring).
const (
	delayIface = "fdelay"
	maxDelay   = 10 * time.Second
	// maxHeld bounds the packets held at once; more are dropped and counted (overflow).
	maxHeld = 1 << 14
)

type tunDelay struct {
	file    *os.File
	ifindex int
	linkOf  func(src, dst netip.Addr) (Link, bool)
	delayOf func(Link) (time.Duration, time.Duration)
	fifo    map[Link]chan heldPacket // the in-order queues of jitter-free links (reader only)

	held, released, overflow, writeErr atomic.Uint64
	done                               chan struct{}
	closeOnce                          sync.Once
	ns                                 netns.NsHandle
}

func newTunDelay(l *Lab, fh *netlink.Handle, linkOf func(src, dst netip.Addr) (Link, bool),
	delayOf func(Link) (time.Duration, time.Duration)) (_ *tunDelay, err error) {
	d := &tunDelay{linkOf: linkOf, delayOf: delayOf, done: make(chan struct{})}
	var fd int
	err = l.Fabric.Do(func() error {
		fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(delayIface)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("create tun %s: %w", delayIface, err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("make delay line: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("make delay line: %w", err)
	}
	d.file = os.NewFile(uintptr(fd), delayIface)
	defer func() {
		if err != nil {
			d.file.Close()
		}
	}()
	for _, k := range []string{"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/" + delayIface + "/rp_filter"} {
		if err := l.Fabric.SetSysctl(k, "0"); err != nil {
			return nil, fmt.Errorf("make delay line: %w", err)
		}
	}
	link, err := fh.LinkByName(delayIface)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", delayIface, err)
	}
	if err := fh.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", delayIface, err)
	}
	d.ifindex = link.Attrs().Index
	go d.run()
	d.ns = l.Fabric.Handle
	return d, nil
}

// heldPacket is a packet in a link's queue and when it is due.
type heldPacket struct {
	pkt []byte
	due time.Time
}

// release writes a held packet back into the fabric.
func (d *tunDelay) release(pkt []byte) {
	d.held.Add(^uint64(0))
	if _, err := d.file.Write(pkt); err != nil {
		d.writeErr.Add(1)
		return
	}
	d.released.Add(1)
}

// queue returns ln's in-order queue, starting its goroutine on first use; it ends with the
// delay line.
func (d *tunDelay) queue(ln Link) chan heldPacket {
	q, ok := d.fifo[ln]
	if !ok {
		q = make(chan heldPacket, maxHeld)
		d.fifo[ln] = q
		go func() {
			for {
				select {
				case <-d.done:
					return
				case p := <-q:
					time.Sleep(time.Until(p.due)) // the link's delay
					d.release(p.pkt)
				}
			}
		}()
	}
	return q
}

func (d *tunDelay) run() {
	buf := make([]byte, 65536)
	d.fifo = map[Link]chan heldPacket{}
	for {
		n, err := d.file.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			select {
			case <-d.done:
				return
			default:
			}
			continue
		}
		pkt := append([]byte(nil), buf[:n]...)
		var delay, jitter time.Duration
		var ln Link
		var known bool
		if src, dst, ok := ipAddrs(pkt); ok {
			if ln, known = d.linkOf(src, dst); known {
				delay, jitter = d.delayOf(ln)
			}
		}
		if d.held.Add(1) > maxHeld {
			d.held.Add(^uint64(0))
			d.overflow.Add(1)
			continue
		}
		if jitter == 0 && known {
			d.queue(ln) <- heldPacket{pkt: pkt, due: time.Now().Add(delay)}
			continue
		}
		if jitter > 0 {
			delay += rand.N(jitter)
		}
		time.AfterFunc(delay, func() { d.release(pkt) })
	}
}

// ipAddrs returns the source and destination of an IPv4 or IPv6 packet.
func ipAddrs(p []byte) (src, dst netip.Addr, ok bool) {
	if len(p) < 20 {
		return src, dst, false
	}
	switch p[0] >> 4 {
	case 4:
		return netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20])), true
	case 6:
		if len(p) < 40 {
			return src, dst, false
		}
		return netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40])), true
	}
	return src, dst, false
}

func (d *tunDelay) counts() (released, overflow, writeErr uint64) {
	return d.released.Load(), d.overflow.Load(), d.writeErr.Load()
}

// Close stops the reader and closes the tun (the device goes with it); held packets are lost.
func (d *tunDelay) Close() error {
	var err error
	d.closeOnce.Do(func() {
		close(d.done)
		// Delete the device before closing its fd: left to the fd's release, the device
		// outlived this call and the next lab's first IPv6 packets were lost (seen in
		// TestLabFabrics right after a fault-fabric test).
		if h, herr := netlink.NewHandleAt(d.ns); herr == nil {
			if l, lerr := h.LinkByName(delayIface); lerr == nil {
				if derr := h.LinkDel(l); derr != nil {
					err = fmt.Errorf("delete %s: %w", delayIface, derr)
				}
			}
			h.Close()
		}
		err = errors.Join(err, d.file.Close())
	})
	return err
}
