package sg

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/nexthop"
	"github.com/kedge-dev/kedge/internal/runstate"
	isg "github.com/kedge-dev/kedge/internal/sg"
	"github.com/vishvananda/netlink"
)

// Group is an open scatter-gather group. Its methods are safe for concurrent use.
type Group struct {
	cfg     Config
	objs    *isg.Objects
	attach  []bpfx.Attachment
	conn    *net.UDPConn
	target  netip.AddrPort // where the request is addressed (worker 0); the scatter fans out
	ring    *isg.Ring
	pumpMu  sync.Mutex // one reader of the ring at a time
	free    chan uint16
	seq     atomic.Uint64
	mu      sync.Mutex
	pending [isg.Slots]*waiter
	done    chan struct{}
	wg      sync.WaitGroup
	closed  atomic.Bool
	strays  atomic.Uint64
	// inFlightWaits counts guard timers that found their result claimed by a reader that
	// had not handed it over yet (recover waited for it instead of calling it lost).
	inFlightWaits atomic.Uint64
	// afterClaim, when set (tests), runs in deliver between claiming a waiter and
	// handing it its result: a reader starved at the worst moment.
	afterClaim func()
	// delivered counts results by the reader that delivered them (wake*): tests check
	// that each wake-up path does its job.
	delivered [wakeKinds]atomic.Uint64
	// holdReads parks the ring's reader after what it read (tests: a reader that fell
	// behind, so the ring fills and results stay in their slots).
	holdReads atomic.Bool
	owner     *runstate.Owner // with a StatusDir: this process's run-state owner
}

type waiter struct {
	id   uint64
	sent time.Time
	ch   chan Result
}

// Validate checks c and fills its defaults (Open calls it).
func (c *Config) Validate() error {
	switch {
	case c.Interface == "":
		return errors.New("sg config: no interface (set Config.Interface)")
	case len(c.Workers) == 0 || len(c.Workers) > MaxWorkers:
		return fmt.Errorf("sg config: %d workers, want 1..%d", len(c.Workers), MaxWorkers)
	case c.Reduction < Sum || c.Reduction > Gather:
		return fmt.Errorf("sg config: unknown reduction %d", c.Reduction)
	case c.Type != Int32 && c.Type != Int64:
		return fmt.Errorf("sg config: unknown element type %d", c.Type)
	case c.Need < 0 || c.Need > len(c.Workers):
		return fmt.Errorf("sg config: need %d of %d workers", c.Need, len(c.Workers))
	case c.InFlight < 0 || c.InFlight > MaxInFlight:
		return fmt.Errorf("sg config: in-flight limit %d, want 1..%d", c.InFlight, MaxInFlight)
	case c.ScatterBatch < 0 || c.ScatterBatch > MaxScatterBatch:
		return fmt.Errorf("sg config: scatter batch %d, want 1..%d", c.ScatterBatch, MaxScatterBatch)
	case c.ScatterFirstBatch < 0 || c.ScatterFirstBatch > cmp.Or(c.ScatterBatch, isg.DefaultBatch):
		return fmt.Errorf("sg config: first scatter batch %d, want 1..%d (the scatter batch)", c.ScatterFirstBatch, cmp.Or(c.ScatterBatch, isg.DefaultBatch))
	}
	if c.Reduction != Count && (c.Elems < 1 || c.Elems > MaxElems) {
		return fmt.Errorf("sg config: %d elements, want 1..%d", c.Elems, MaxElems)
	}
	if c.MultiPacket && c.Reduction == Gather {
		return errors.New("sg config: gather takes single-packet replies only (unset MultiPacket)")
	}
	v4 := c.Workers[0].Addr().Unmap().Is4()
	for i, w := range c.Workers {
		if !w.IsValid() || w.Port() == 0 {
			return fmt.Errorf("sg config: worker %d (%v) has no address or port", i, w)
		}
		if w.Addr().Unmap().Is4() != v4 {
			return fmt.Errorf("sg config: worker %d (%v) is not of worker 0's family: a group is all IPv4 or all IPv6", i, w)
		}
	}
	if c.Reduction == Gather {
		per := c.Elems * c.Type.Size()
		fit := min(AggBytes/per, MaxGatherK)
		if c.GatherK == 0 {
			c.GatherK = fit
		}
		if c.GatherK < 1 || c.GatherK > fit {
			return fmt.Errorf("sg config: gather %d payloads of %d bytes; at most %d fit", c.GatherK, per, fit)
		}
	}
	if c.Timeout == 0 {
		c.Timeout = 100 * time.Millisecond
	}
	if c.InFlight == 0 {
		c.InFlight = 256
	}
	return nil
}

// Open loads the data plane, attaches it to cfg.Interface and opens the coordinator
// socket. Close releases everything; a killed process leaves nothing but, with Pin, a pin
// directory that the next Open or `kedge cleanup` removes.
func Open(cfg Config) (_ *Group, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ns, err := netnsx.Open(cfg.Netns)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", cfg.Netns, err)
	}
	if ns >= 0 {
		defer ns.Close()
	}
	if cfg.StatusDir != "" {
		isg.RemoveDeadStatuses(cfg.StatusDir) // a killed coordinator's file
	}
	g := &Group{cfg: cfg, done: make(chan struct{}), free: make(chan uint16, cfg.InFlight)}
	defer func() {
		if err != nil {
			g.release()
		}
	}()
	g.target = cfg.Workers[0]
	var ifindex int
	var loopback bool
	var workers []isg.WorkerCfg
	err = netnsx.In(ns, func() (err error) {
		ifindex, loopback, workers, err = resolve(&cfg)
		if err != nil {
			return err
		}
		network := "udp4"
		if !cfg.Workers[0].Addr().Unmap().Is4() {
			network = "udp6"
		}
		g.conn, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(cfg.Local))
		if err != nil {
			return fmt.Errorf("open coordinator socket on %v: %w", cfg.Local, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	local := g.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	if local.Addr().IsUnspecified() || !local.IsValid() {
		local = netip.AddrPortFrom(cfg.Local.Addr(), local.Port())
	}
	g.cfg.Local = local

	var partEntries uint32
	if cfg.MultiPacket {
		partEntries = uint32(cfg.InFlight * len(cfg.Workers))
	}
	g.objs, err = isg.Load(isg.LoadOptions{Tier: isg.DetectTier(), ExpireSlack: 20_000, Batch: uint32(cfg.ScatterBatch),
		FirstBatch: uint32(cfg.ScatterFirstBatch), PartEntries: partEntries})
	if err != nil {
		return nil, fmt.Errorf("load sg data plane: %w", err)
	}
	untimed, err := g.objs.InitTimers()
	if err != nil {
		return nil, err
	}
	if err := g.fillMaps(ifindex, loopback, workers); err != nil {
		return nil, err
	}
	if g.ring, err = isg.OpenRing(g.objs.Results); err != nil {
		return nil, fmt.Errorf("open result ring buffer: %w", err)
	}
	tc, err := bpfx.AttachTC(g.objs.Scatter, bpfx.TCTarget{Netns: ns, IfIndex: ifindex, Dir: bpfx.Egress, Name: "sg-scatter"})
	if err != nil {
		return nil, fmt.Errorf("attach sg scatter to %s egress: %w", cfg.Interface, err)
	}
	g.attach = append(g.attach, tc)
	// Fan-outs larger than a batch continue from the interface's ingress.
	cont, err := bpfx.AttachTC(g.objs.Cont, bpfx.TCTarget{Netns: ns, IfIndex: ifindex, Dir: bpfx.Ingress, Name: "sg-scatter-cont"})
	if err != nil {
		return nil, fmt.Errorf("attach sg scatter continuation to %s ingress: %w", cfg.Interface, err)
	}
	g.attach = append(g.attach, cont)
	xdp, err := bpfx.AttachXDP(g.objs.Gather, ns, ifindex, bpfx.XDPAuto)
	if err != nil {
		return nil, fmt.Errorf("attach sg gather (xdp) to %s: %w - another XDP program may own the interface", cfg.Interface, err)
	}
	g.attach = append(g.attach, xdp)
	for i := range cfg.InFlight {
		g.free <- uint16(i)
	}
	g.seq.Store(rand.Uint64() >> 12)
	g.wg.Add(2)
	if cfg.BusyPoll {
		go g.spin()
	} else {
		go g.wait()
	}
	go g.drain()
	// Kernels without bpf_timer, and slots whose timer could not be allocated, are
	// expired by sg_sweep, run from here.
	if cfg.StatusDir != "" {
		if g.owner, err = runstate.Self(); err != nil {
			return nil, fmt.Errorf("sg status file: %w", err)
		}
		g.wg.Add(1)
		go g.publish(time.Now())
	}
	if g.objs.Tier == isg.TierBounded || untimed > 0 {
		g.wg.Add(1)
		go g.sweeper()
	}
	return g, nil
}

// resolve finds the interface and each worker's next-hop MAC, and the default local
// address. Runs inside the group's namespace.
func resolve(cfg *Config) (int, bool, []isg.WorkerCfg, error) {
	link, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return 0, false, nil, fmt.Errorf("find interface %s: %w (list them with 'ip link')", cfg.Interface, err)
	}
	attrs := link.Attrs()
	loopback := attrs.Flags&net.FlagLoopback != 0
	out := make([]isg.WorkerCfg, len(cfg.Workers))
	for i, w := range cfg.Workers {
		addr := w.Addr().Unmap()
		hop, err := resolveWorker(addr, w, loopback)
		if err != nil {
			return 0, false, nil, fmt.Errorf("resolve worker %d (%v): %w", i, w, err)
		}
		if hop.Ifindex != attrs.Index {
			return 0, false, nil, fmt.Errorf("worker %d (%v) is routed through ifindex %d, not %s (%d): every worker must be reached through the group's interface", i, w, hop.Ifindex, cfg.Interface, attrs.Index)
		}
		if i == 0 && !cfg.Local.Addr().IsValid() {
			if !hop.Src.IsValid() {
				return 0, false, nil, fmt.Errorf("no source address towards worker 0 (%v): set Config.Local", w)
			}
			cfg.Local = netip.AddrPortFrom(hop.Src, cfg.Local.Port())
		}
		wc := isg.WorkerCfg{Port: bpfx.Htons(w.Port())}
		wc.Addr.In6U.U6Addr8 = netip.AddrFrom16(addr.As16()).As16()
		if addr.Is4() {
			wc.Addr.In6U.U6Addr8 = netip.AddrFrom16(v4mapped(addr)).As16()
		}
		copy(wc.Mac[:], hop.DstMAC) // none on a loopback interface
		out[i] = wc
	}
	return attrs.Index, loopback, out, nil
}

func v4mapped(a netip.Addr) [16]byte {
	var b [16]byte
	b[10], b[11] = 0xff, 0xff
	v := a.As4()
	copy(b[12:], v[:])
	return b
}

// resolveWorker finds the route to worker w (at addr) and, unless the group runs on a
// loopback interface, its next hop's MAC, asking the kernel to resolve it (a datagram to
// the worker) when it is not known yet.
func resolveWorker(addr netip.Addr, w netip.AddrPort, loopback bool) (nexthop.Hop, error) {
	deadline := time.Now().Add(3 * time.Second)
	for probed := false; ; {
		hop, err := nexthop.Resolve(nil, addr)
		if err == nil || loopback && hop.Ifindex != 0 {
			return hop, nil
		}
		if !errors.Is(err, nexthop.ErrNoNeighbour) {
			return hop, err
		}
		if time.Now().After(deadline) {
			return hop, fmt.Errorf("next hop %v has no MAC address (unreachable?): %w", hop.Via, err)
		}
		if !probed {
			nexthop.Probe(w) // the worker ignores an empty datagram
			probed = true
		}
		time.Sleep(10 * time.Millisecond) // polling the neighbour table with a deadline
	}
}

func (g *Group) fillMaps(ifindex int, loopback bool, workers []isg.WorkerCfg) error {
	gc := isg.GroupCfg{
		Enabled:   1,
		Family:    4,
		Reduce:    uint8(g.cfg.Reduction),
		Dtype:     uint8(g.cfg.Type),
		Nworkers:  uint16(len(workers)),
		Elems:     uint16(g.cfg.Elems),
		SlotBase:  0,
		Nslots:    uint16(g.cfg.InFlight),
		Ifindex:   uint32(ifindex),
		GatherK:   uint32(g.cfg.GatherK),
		TimeoutNs: uint64(g.cfg.Timeout),
		CoordPort: bpfx.Htons(g.cfg.Local.Port()),
	}
	if loopback {
		gc.Flags |= isg.GroupFlagLoopback
	}
	if g.cfg.WakeSocket && !g.cfg.BusyPoll {
		gc.Flags |= isg.GroupFlagWakeSocket
	}
	if g.cfg.MultiPacket {
		gc.Flags |= isg.GroupFlagParts // PartBase 0: the group's slots start at 0
	}
	la := g.cfg.Local.Addr().Unmap()
	if la.Is4() {
		gc.CoordAddr.In6U.U6Addr8 = v4mapped(la)
	} else {
		gc.Family = 6
		gc.CoordAddr.In6U.U6Addr8 = la.As16()
	}
	if g.cfg.Group >= isg.GroupsMax {
		return fmt.Errorf("sg config: group id %d, want < %d", g.cfg.Group, isg.GroupsMax)
	}
	gc.WorkerBase = uint16(uint32(g.cfg.Group) * isg.WorkersMax % 65536)
	base := uint32(g.cfg.Group) * isg.WorkersMax
	for i, w := range workers {
		if err := g.objs.Workers.Put(base+uint32(i), &w); err != nil {
			return fmt.Errorf("write worker %d: %w", i, err)
		}
	}
	if base > 65535 {
		return fmt.Errorf("sg config: group id %d too large", g.cfg.Group)
	}
	gc.WorkerBase = uint16(base)
	if err := g.objs.Groups.Put(uint32(g.cfg.Group), &gc); err != nil {
		return fmt.Errorf("write group: %w", err)
	}
	return nil
}

// publish writes the status file for `kedge sg stats` every second until Close.
func (g *Group) publish(started time.Time) {
	defer g.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		st, err := g.Stats()
		if err == nil {
			b, _ := json.Marshal(st)
			_ = runstate.WriteStatus(g.cfg.StatusDir, isg.Capability, g.owner.ID, &isg.Status{
				Owner: g.owner.ID, PID: os.Getpid(), Started: started,
				Interface: g.cfg.Interface, Netns: g.cfg.Netns, Local: g.cfg.Local.String(),
				Workers: len(g.cfg.Workers), Reduction: g.cfg.Reduction.String(), Tier: g.Tier(),
				InFlight: g.cfg.InFlight, Stats: b})
		}
		select {
		case <-g.done:
			return
		case <-t.C:
		}
	}
}

// Interface is the interface the group is attached to; Local the coordinator socket;
// Tier the kernel features the data plane uses.
func (g *Group) Local() netip.AddrPort { return g.cfg.Local }

// Tier reports how the data plane loops and expires ("bpf_loop+bpf_timer" or
// "bounded-loop+sweep").
func (g *Group) Tier() string { return g.objs.Tier.String() }

// Scatter sends payload to every worker and returns the result.
func (g *Group) Scatter(ctx context.Context, payload []byte) (Result, error) {
	return g.ScatterWith(ctx, payload, RequestOptions{})
}

// ScatterWith is Scatter with per-request options.
func (g *Group) ScatterWith(ctx context.Context, payload []byte, o RequestOptions) (Result, error) {
	if g.closed.Load() {
		return Result{}, ErrClosed
	}
	if o.Need < 0 || o.Need > len(g.cfg.Workers) {
		return Result{}, fmt.Errorf("sg request: need %d of %d workers", o.Need, len(g.cfg.Workers))
	}
	var slot uint16
	if g.cfg.OnFull == Fail {
		select {
		case slot = <-g.free:
		default:
			return Result{}, ErrInFlight
		}
	} else {
		select {
		case slot = <-g.free:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-g.done:
			return Result{}, ErrClosed
		}
	}
	timeout := g.cfg.Timeout
	if o.Timeout > 0 {
		timeout = o.Timeout
	}
	id := g.seq.Add(1)<<10 | uint64(slot)
	w := &waiter{id: id, sent: time.Now(), ch: make(chan Result, 1)}
	g.mu.Lock()
	g.pending[slot] = w
	g.mu.Unlock()

	h := isg.Header{Version: isg.Version, Op: isg.OpRequest, Group: g.cfg.Group, ReqID: id,
		Need: uint16(o.Need), TimeoutUS: uint32(o.Timeout / time.Microsecond), PayloadLen: uint32(len(payload))}
	buf := append(h.Append(make([]byte, 0, isg.HdrLen+len(payload))), payload...)
	if _, err := g.conn.WriteToUDPAddrPort(buf, g.target); err != nil {
		g.forget(slot, id)
		return Result{}, fmt.Errorf("send sg request: %w", err)
	}
	// The kernel completes every request by its deadline; this timer only guards against a
	// result that never comes (ring buffer full, timer not armed).
	guard := time.NewTimer(timeout + 50*time.Millisecond + timeout/2)
	defer guard.Stop()
	for {
		select {
		case r := <-w.ch:
			return r, nil
		case <-ctx.Done():
			return Result{}, ctx.Err() // the slot is freed when its result arrives
		case <-g.done:
			return Result{}, ErrClosed
		case <-guard.C:
			r, owed, err := g.recover(slot, w)
			if err != nil {
				return Result{}, err
			}
			if owed {
				// The kernel still holds the request pending: its result is owed, not
				// lost (a starved process can see its guard fire first). Look again.
				guard.Reset(timeout/2 + 50*time.Millisecond)
				continue
			}
			return r, nil
		}
	}
}

// forget drops a waiter whose request never left; its slot is free again.
func (g *Group) forget(slot uint16, id uint64) {
	g.mu.Lock()
	if w := g.pending[slot]; w != nil && w.id == id {
		g.pending[slot] = nil
	}
	g.mu.Unlock()
	g.free <- slot
}

// recover reads a result from its slot when the ring buffer did not deliver it. owed:
// the slot still holds the request pending, so the kernel will complete it (its timer or
// the next sweep) and the caller waits again. An error wraps ErrLost with what the slot
// held: the request never registered there, or its result went nowhere.
func (g *Group) recover(slot uint16, w *waiter) (r Result, owed bool, err error) {
	_, sweepErr := g.objs.RunSweep() // expires it now if its timer did not
	// A result whose wake-up never came (its passed reply dropped before the socket, by a
	// firewall or a bad UDP checksum) is in the ring: read it. If the reader holds the
	// ring, it is reading it now.
	if g.pumpMu.TryLock() {
		g.pumpLocked(byRecover)
		g.pumpMu.Unlock()
	}
	select {
	case r := <-w.ch:
		return r, false, nil
	case <-time.After(10 * time.Millisecond):
	}
	g.mu.Lock()
	mine := g.pending[slot] == w
	g.mu.Unlock()
	if !mine {
		// A reader claimed the result (deliver clears the waiter under g.mu, then decodes
		// and sends): it is in flight to us however starved that reader is.
		g.inFlightWaits.Add(1)
		return <-w.ch, false, nil
	}
	var s isg.SlotRec
	if err := g.objs.Slots.Lookup(uint32(slot), &s); err != nil {
		return Result{}, false, fmt.Errorf("%w: look up slot %d: %w", ErrLost, slot, err)
	}
	if s.Res.ReqId == w.id && s.State == isg.SlotPending {
		if sweepErr != nil { // nothing will complete it on a kernel without bpf_timer
			return Result{}, false, fmt.Errorf("%w: slot %d still pending: %w", ErrLost, slot, sweepErr)
		}
		return Result{}, true, nil
	}
	if s.Res.ReqId != w.id || s.State != isg.SlotDone {
		// The slot stays reserved: never reused while its state is unknown.
		return Result{}, false, fmt.Errorf("%w: slot %d holds request %#x in state %d, not %#x", ErrLost, slot, s.Res.ReqId, s.State, w.id)
	}
	g.mu.Lock()
	mine = g.pending[slot] == w
	if mine {
		g.pending[slot] = nil
	}
	g.mu.Unlock()
	if !mine { // a reader claimed it meanwhile
		g.inFlightWaits.Add(1)
		return <-w.ch, false, nil
	}
	r = g.decode(&s.Res, w, byRecover)
	g.free <- slot
	return r, false, nil
}

func (g *Group) decode(rec *isg.ResultRec, w *waiter, by int) Result {
	r := Result{
		Reader:    readerNames[by],
		ID:        rec.ReqId,
		Status:    Status(rec.Status),
		Count:     int(rec.Count),
		Need:      int(rec.Need),
		Overflow:  rec.Flags&isg.FlagOverflow != 0,
		Kernel:    time.Duration(rec.DoneNs - rec.StartNs),
		RoundTrip: time.Since(w.sent),
	}
	r.Answered = make([]int, 0, r.Count)
	for i, word := range rec.Bitmap {
		for b := 0; b < 64 && word != 0; b++ {
			if word&(1<<b) != 0 {
				r.Answered = append(r.Answered, i*64+b)
				word &^= 1 << b
			}
		}
	}
	if rec.Partial > 0 {
		r.Partial = g.partials(rec)
	}
	switch g.cfg.Reduction {
	case Sum, Min, Max:
		if g.cfg.Reduction == Sum || r.Count > 0 || len(r.Partial) > 0 {
			r.Values = append([]int64(nil), rec.Agg[:g.cfg.Elems]...)
		}
		if g.cfg.Reduction != Sum && r.Count == 0 && len(r.Partial) > 0 {
			uncovered(r.Values, r.Partial)
		}
	case Gather:
		per := g.cfg.Elems * g.cfg.Type.Size()
		raw := make([]byte, isg.AggBytes)
		for i, v := range rec.Agg {
			binary.NativeEndian.PutUint64(raw[i*8:], uint64(v))
		}
		for k := 0; k < int(rec.Gathered) && k < g.cfg.GatherK && (k+1)*per <= len(raw); k++ {
			r.Gathered = append(r.Gathered, GatherItem{Worker: int(rec.Order[k]), Payload: append([]byte(nil), raw[k*per:(k+1)*per]...)})
		}
	}
	return r
}

// partials reads the parts map entries of rec's request for the workers not in its
// bitmap (rec.Partial of them hold some parts). The slot is not yet freed, so no later
// request has taken the entries over.
func (g *Group) partials(rec *isg.ResultRec) []PartialReply {
	var out []PartialReply
	n := len(g.cfg.Workers)
	for w := 0; w < n && len(out) < int(rec.Partial); w++ {
		if rec.Bitmap[w/64]&(1<<(w%64)) != 0 {
			continue
		}
		var e isg.PartsRec
		if err := g.objs.Parts.Lookup(uint32(int(rec.Slot)*n+w), &e); err != nil || e.ReqId != rec.ReqId || e.Bits == 0 {
			continue
		}
		p := PartialReply{Worker: w, NParts: int(e.Nparts)}
		for b := range isg.PartsMax {
			if e.Bits&(1<<b) != 0 {
				p.Parts = append(p.Parts, b)
			}
		}
		out = append(out, p)
	}
	return out
}

// uncovered zeroes the elements of a Min/Max aggregate that no part in ps covered (the
// kernel started them at the identity: SG_F_PARTS), when no worker answered in full.
func uncovered(v []int64, ps []PartialReply) {
	covered := make([]bool, len(v))
	for _, p := range ps {
		for _, part := range p.Parts {
			off, n, _ := isg.PartSlice(len(v), p.NParts, part)
			for i := off; i < off+n; i++ {
				covered[i] = true
			}
		}
	}
	for i := range v {
		if !covered[i] {
			v[i] = 0
		}
	}
}

// wait reads the ring whenever it wakes its reader: every result, or with WakeSocket
// (SG_GF_WAKE_SOCKET) the timeouts. It waits in the Go runtime's poller, the epoll set that also
// holds the coordinator socket (drain), so neither holds a thread while it waits.
func (g *Group) wait() {
	defer g.wg.Done()
	_ = g.ring.Wait(func() bool {
		if g.closed.Load() {
			return true
		}
		g.pump(byRing)
		return false
	})
}

// spin is the BusyPoll reader: it spins on the ring's positions, no system call while
// waiting.
func (g *Group) spin() {
	defer g.wg.Done()
	for !g.closed.Load() {
		if g.ring.Available() == 0 {
			runtime.Gosched()
			continue
		}
		g.pump(bySpin)
	}
}

// drain reads what reaches the coordinator socket: with WakeSocket the reply that
// completed a request (its result is in the ring by then: the data plane commits it
// before it passes the packet), and whatever XDP passed (malformed, unregistered, other
// traffic). Every datagram is discarded; each one is a reason to look at the ring.
func (g *Group) drain() {
	defer g.wg.Done()
	buf := make([]byte, 65536)
	for {
		_, err := g.conn.Read(buf)
		if g.closed.Load() {
			return
		}
		if err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
		g.pump(bySocket)
	}
}

// Readers of the ring (Group.delivered's index).
const (
	bySocket  = iota // the coordinator socket woke drain
	byRing           // the ring woke wait
	bySpin           // BusyPoll
	byRecover        // a Scatter's guard timer
	wakeKinds
)

// readerNames are Result.Reader's values, by Group.delivered's index.
var readerNames = [wakeKinds]string{"socket", "ring", "busy-poll", "guard"}

// pump delivers every result committed to the ring.
func (g *Group) pump(by int) {
	g.pumpMu.Lock()
	g.pumpLocked(by)
	g.pumpMu.Unlock()
}

func (g *Group) pumpLocked(by int) {
	var res isg.ResultRec
	dst := unsafe.Slice((*byte)(unsafe.Pointer(&res)), unsafe.Sizeof(res))
	for {
		for {
			// The record is the kernel's struct sg_result in native byte order: copied
			// as it is (binary.Decode's reflection took ~4.5 us per 2.3 KiB result).
			n, ok := g.ring.Read(dst)
			if !ok {
				break
			}
			if n < len(dst) {
				g.strays.Add(1)
				continue
			}
			g.deliver(&res, by)
		}
		if !g.holdReads.Load() || g.closed.Load() {
			return
		}
		for g.holdReads.Load() && !g.closed.Load() {
			time.Sleep(time.Millisecond)
		}
	}
}

// deliver hands a result to its waiter and frees its slot.
func (g *Group) deliver(res *isg.ResultRec, by int) {
	slot := res.Slot
	if int(slot) >= len(g.pending) {
		g.strays.Add(1)
		return
	}
	g.mu.Lock()
	w := g.pending[slot]
	mine := w != nil && w.id == res.ReqId
	if mine {
		g.pending[slot] = nil
	}
	g.mu.Unlock()
	if !mine {
		// A result for an older id (recovered from its slot already) is a stray.
		g.strays.Add(1)
		return
	}
	if g.afterClaim != nil {
		g.afterClaim()
	}
	g.delivered[by].Add(1) // before the waiter can see its result
	w.ch <- g.decode(res, w, by)
	g.free <- slot
}

// sweeper expires requests on kernels without bpf_timer.
func (g *Group) sweeper() {
	defer g.wg.Done()
	period := max(min(g.cfg.Timeout/4, 5*time.Millisecond), 500*time.Microsecond)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
			_, _ = g.objs.RunSweep()
		}
	}
}

// InFlight is how many requests hold a slot now: sent and not yet read, or whose result
// the kernel still owes (at most Config.InFlight).
func (g *Group) InFlight() int { return g.cfg.InFlight - len(g.free) }

// Stats returns the group's counters (plus the packets that matched no group).
func (g *Group) Stats() (Stats, error) {
	s, err := g.objs.SumStats(uint32(g.cfg.Group))
	if err != nil {
		return Stats{}, err
	}
	n, err := g.objs.SumStats(isg.GroupsMax)
	if err != nil {
		return Stats{}, err
	}
	bpfx.AddCounters(&s, &n)
	return publicStats(&s), nil
}

// Close detaches the programs and releases the group. Outstanding Scatter calls return
// ErrClosed.
func (g *Group) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	close(g.done)
	// Wake the readers (they return once closed is set) before the ring is unmapped.
	_ = g.ring.Shutdown()
	_ = g.conn.SetReadDeadline(time.Now())
	g.wg.Wait()
	err := g.release()
	if g.owner != nil {
		err = errors.Join(err, runstate.RemoveStatus(g.cfg.StatusDir, isg.Capability, g.owner.ID))
	}
	return err
}

func (g *Group) release() error {
	var errs []error
	for i := len(g.attach) - 1; i >= 0; i-- {
		errs = append(errs, g.attach[i].Close())
	}
	g.attach = nil
	if g.ring != nil {
		errs = append(errs, g.ring.Close())
	}
	if g.conn != nil {
		errs = append(errs, g.conn.Close())
	}
	if g.objs != nil {
		errs = append(errs, g.objs.Close())
	}
	return errors.Join(errs...)
}

// publicStats copies the data plane's counters (same names, same order) into Stats.
func publicStats(s *isg.Stats) Stats {
	var out Stats
	src := reflect.ValueOf(s).Elem()
	dst := reflect.ValueOf(&out).Elem()
	for i := range dst.NumField() {
		if f := src.FieldByName(dst.Type().Field(i).Name); f.IsValid() {
			dst.Field(i).SetUint(f.Uint())
		}
	}
	return out
}
