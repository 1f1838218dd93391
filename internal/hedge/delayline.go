package hedge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Delay-line interface names. dlClient lives in the client's namespace; the rest in the
// kedge-owned delay-line namespace, so its qdisc never touches the client's devices.
const (
	dlClient        = "kedge-dl0" // client side: clones leave here, come back here (rescuer)
	dlPeer          = "dlb"       // its peer in the delay-line namespace (dl_entry)
	dlDev           = "cv0"       // carries the delay qdisc
	dlDevEnd        = "cv1"       // its peer (dl_loop)
	dlMTU           = 9000
	ethPKedgeFiller = uint16(hedgeHedgeFillerFILLER_ETH_P) // bpf/include/hedge.h, through bpf2go
	fillerMagic     = uint64(hedgeHedgeFillerMagicFILLER_MAGIC)
)

// DelayLine is the namespace, devices and qdisc that hold clones for a hedge delay.
type DelayLine struct {
	Backend string
	Period  time.Duration // target transit time per pass
	NS      *lab.Netns

	clientNS     netns.NsHandle
	ClientIfx    int // dlClient in the client namespace
	PeerIfx      int // dlPeer
	DevIfx       int // dlDev
	DevEndIfx    int // dlDevEnd
	devEndMAC    net.HardwareAddr
	rateBytes    uint64
	fillerBytes  int
	fillers      int
	attachments  []bpfx.Attachment
	clientHandle *netlink.Handle
	ownsClient   bool // dlClient was made by this DelayLine (Close deletes only then)
}

// newDelayLine builds the namespace and devices and installs the backend's qdisc. With
// backend auto it tries edt, netem, conveyor in that order and keeps the first that the
// kernel accepts (edt also needs bpf_skb_set_tstamp, checked by the caller).
func newDelayLine(clientNS netns.NsHandle, backends []string, dc DelayLineConfig) (_ *DelayLine, err error) {
	d := &DelayLine{
		clientNS:    clientNS,
		Period:      time.Duration(dc.Period),
		rateBytes:   uint64(dc.RateMbit) * 1_000_000 / 8,
		fillerBytes: dc.FillerBytes,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.Close())
		}
	}()
	if d.NS, err = lab.NewNetns(lab.OwnedName("hedge-dl")); err != nil {
		return nil, err
	}
	if err := d.makeDevices(); err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(d.NS.Handle)
	if err != nil {
		return nil, fmt.Errorf("open netlink in delay-line netns: %w", err)
	}
	defer h.Close()
	var tried []error
	for _, b := range backends {
		q := d.qdisc(b)
		if err := h.QdiscAdd(q); err != nil {
			tried = append(tried, fmt.Errorf("%s: add %s qdisc: %w", b, q.Type(), bpfx.QdiscError(q.Type(), err)))
			continue
		}
		d.Backend = b
		return d, nil
	}
	if len(backends) == 1 && backends[0] != BackendConveyor {
		return nil, fmt.Errorf("delay-line backend %s does not work on this kernel: %w - use backend auto or conveyor ('kedge probe' lists the backends this kernel offers)",
			backends[0], errors.Join(tried...))
	}
	return nil, fmt.Errorf("no delay-line backend works on this kernel: %w", errors.Join(tried...))
}

func (d *DelayLine) qdisc(backend string) netlink.Qdisc {
	attrs := netlink.QdiscAttrs{LinkIndex: d.DevIfx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	switch backend {
	case BackendEDT:
		fq := netlink.NewFq(attrs)
		fq.Horizon = uint32((10 * time.Second).Microseconds())
		fq.HorizonDropPolicy = 1
		fq.PacketLimit = 100000
		fq.FlowPacketLimit = 100000
		return fq
	case BackendNetem:
		return netlink.NewNetem(attrs, netlink.NetemQdiscAttrs{
			Latency: uint32(d.Period.Microseconds()),
			Limit:   100000,
		})
	default: // conveyor
		burst := uint32(2 * (dlMTU + 14))
		// Queue room: the fillers plus 64 MiB of clones before tbf drops (counted as
		// delay-line drops in the qdisc stats).
		limit := uint32(float64(d.rateBytes)*d.Period.Seconds()) + 64<<20
		return &netlink.Tbf{QdiscAttrs: attrs, Rate: d.rateBytes, Buffer: netlink.Xmittime(d.rateBytes, burst), Limit: limit}
	}
}

func (d *DelayLine) makeDevices() error {
	var err error
	if d.clientHandle, err = bpfx.NetlinkHandle(d.clientNS); err != nil {
		return fmt.Errorf("client netns: %w", err)
	}
	dh, err := netlink.NewHandleAt(d.NS.Handle)
	if err != nil {
		return fmt.Errorf("open netlink in delay-line netns: %w", err)
	}
	defer dh.Close()
	// A kedge-dl0 left by a killed run would block us: remove it. One of a live hedger
	// (named in its alias) is refused instead, since deleting it would break that hedger.
	if l, err := d.clientHandle.LinkByName(dlClient); err == nil {
		if pid, ok := dlOwner(l.Attrs().Alias); ok && lab.ProcessAlive(pid) {
			return fmt.Errorf("%s in this namespace belongs to a running hedger (pid %d): stop it first, one hedger runs per namespace (see 'kedge hedge status')", dlClient, pid)
		}
		_ = d.clientHandle.LinkDel(l)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: dlClient, MTU: dlMTU},
		PeerName:      dlPeer,
		PeerNamespace: netlink.NsFd(int(d.NS.Handle)),
		PeerMTU:       dlMTU,
	}
	if err := d.clientHandle.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", dlClient, err)
	}
	d.ownsClient = true
	cl, err := d.clientHandle.LinkByName(dlClient)
	if err != nil {
		return fmt.Errorf("find %s: %w", dlClient, err)
	}
	if err := d.clientHandle.LinkSetAlias(cl, fmt.Sprintf("%s%d", dlOwnerPrefix, os.Getpid())); err != nil {
		return fmt.Errorf("name the owner of %s: %w", dlClient, err)
	}
	// No addresses at all: no IPv6 link-local, DAD or router solicitations into the line.
	_ = d.clientHandle.LinkSetIP6AddrGenMode(cl, 1 /* IN6_ADDR_GEN_MODE_NONE */)
	if err := d.clientHandle.LinkSetUp(cl); err != nil {
		return fmt.Errorf("set %s up: %w", dlClient, err)
	}
	d.ClientIfx = cl.Attrs().Index
	if err := dh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dlDev, MTU: dlMTU}, PeerName: dlDevEnd, PeerMTU: dlMTU}); err != nil {
		return fmt.Errorf("add veth %s: %w", dlDev, err)
	}
	for _, name := range []string{"lo", dlPeer, dlDev, dlDevEnd} {
		l, err := dh.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		_ = dh.LinkSetIP6AddrGenMode(l, 1)
		if err := dh.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
		switch name {
		case dlPeer:
			d.PeerIfx = l.Attrs().Index
		case dlDev:
			d.DevIfx = l.Attrs().Index
		case dlDevEnd:
			d.DevEndIfx, d.devEndMAC = l.Attrs().Index, l.Attrs().HardwareAddr
		}
	}
	return nil
}

// attach installs dl_entry and dl_loop inside the delay-line namespace.
func (d *DelayLine) attach(entry, loop *ebpf.Program) error {
	for _, a := range []struct {
		p   *ebpf.Program
		ifx int
		n   string
	}{{entry, d.PeerIfx, "dl_entry"}, {loop, d.DevEndIfx, "dl_loop"}} {
		at, err := bpfx.AttachTC(a.p, bpfx.TCTarget{Netns: d.NS.Handle, IfIndex: a.ifx, Dir: bpfx.Ingress, Name: a.n})
		if err != nil {
			return fmt.Errorf("attach %s: %w", a.n, err)
		}
		d.attachments = append(d.attachments, at)
	}
	return nil
}

// addFillers injects n filler frames into the conveyor's queue from a packet socket.
func (d *DelayLine) addFillers(n int) error {
	if n <= 0 {
		return nil
	}
	return d.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		defer unix.Close(fd)
		// Fillers circulate forever and stay charged to this socket's send buffer.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 256<<20)
		frame := make([]byte, d.fillerBytes)
		copy(frame[0:6], d.devEndMAC)
		copy(frame[6:12], []byte{0x02, 'k', 'e', 'd', 'g', 'e'})
		binary.BigEndian.PutUint16(frame[12:14], ethPKedgeFiller)
		binary.NativeEndian.PutUint64(frame[14:22], fillerMagic)
		sa := &unix.SockaddrLinklayer{Ifindex: d.DevIfx, Protocol: htons(ethPKedgeFiller), Halen: 6}
		copy(sa.Addr[:], d.devEndMAC)
		for i := 0; i < n; i++ {
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("send filler %d/%d: %w", i+1, n, err)
			}
		}
		d.fillers += n
		return nil
	})
}

// dlOwnerPrefix starts the alias of dlClient: kedge:<pid> of the hedger that made it.
const dlOwnerPrefix = "kedge:"

// dlOwner parses the owner pid from dlClient's alias.
func dlOwner(alias string) (int, bool) {
	rest, ok := strings.CutPrefix(alias, dlOwnerPrefix)
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(rest)
	return pid, err == nil && pid > 0
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// fillersFor returns how many fillers make a queue of one period at the conveyor's rate.
func (d *DelayLine) fillersFor(period time.Duration) int {
	return int(math.Round(period.Seconds() * float64(d.rateBytes) / float64(d.fillerBytes)))
}

// Close removes the namespace (and with it both veth pairs, the qdisc and the programs'
// attachments inside it).
func (d *DelayLine) Close() error {
	var errs []error
	for i := len(d.attachments) - 1; i >= 0; i-- {
		errs = append(errs, d.attachments[i].Close())
	}
	d.attachments = nil
	if d.clientHandle != nil {
		if l, err := d.clientHandle.LinkByName(dlClient); err == nil && d.ownsClient {
			if err := d.clientHandle.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete %s: %w", dlClient, err))
			}
		}
		d.clientHandle.Close()
		d.clientHandle = nil
	}
	if d.NS != nil {
		errs = append(errs, d.NS.Close())
		d.NS = nil
	}
	return errors.Join(errs...)
}
