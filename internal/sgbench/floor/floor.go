package floor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kedge-dev/kedge/internal/bpfx"
	isg "github.com/kedge-dev/kedge/internal/sg"
	"github.com/kedge-dev/kedge/pkg/sg"
)

// Limits of floor.bpf.c (FLOOR_SLOTS, FLOOR_WORKERS_MAX).
const (
	Slots      = 1024
	WorkersMax = 256
)

// Config of a floor: Fanout workers on consecutive ports from Worker0 (IPv4), reached
// through Interface (a loopback, in the caller's network namespace).
type Config struct {
	Interface string
	Worker0   netip.AddrPort
	Fanout    int
	InFlight  int           // requests outstanding at most (slots handed out)
	Timeout   time.Duration // a request not completed by then counts as timed out
	// PollSpin is the ring reader's polling bound, pkg/sg's Config.PollSpin (0:
	// sg.DefaultPollSpin, negative: off): the same reader policy as kedge's.
	PollSpin time.Duration
}

func (c *Config) validate() error {
	switch {
	case !c.Worker0.Addr().Unmap().Is4():
		return fmt.Errorf("floor: worker %v: IPv4 only", c.Worker0)
	case c.Fanout < 1 || c.Fanout > WorkersMax:
		return fmt.Errorf("floor: fan-out %d, want 1-%d", c.Fanout, WorkersMax)
	case int(c.Worker0.Port())+c.Fanout > 65536:
		return fmt.Errorf("floor: ports %d+%d past 65535", c.Worker0.Port(), c.Fanout)
	case c.InFlight < 1 || c.InFlight > Slots:
		return fmt.Errorf("floor: %d in flight, want 1-%d", c.InFlight, Slots)
	case c.Timeout <= 0:
		return errors.New("floor: timeout must be positive")
	}
	if c.PollSpin == 0 {
		c.PollSpin = sg.DefaultPollSpin
	}
	return nil
}

// Objects are the floor's loaded programs and maps.
type Objects struct{ floorObjects }

// Load loads floor.bpf.c with its configuration (cfg) set.
func Load(ifindex int, clientPort, basePort uint16, fanout int) (*Objects, error) {
	spec, err := loadFloor()
	if err != nil {
		return nil, fmt.Errorf("load floor spec: %w", err)
	}
	cfg := floorFloorCfg{Ifindex: uint32(ifindex), Nworkers: uint32(fanout), ClientPort: clientPort, BasePort: basePort}
	if err := spec.Variables[floorVarCfg].Set(cfg); err != nil {
		return nil, fmt.Errorf("set floor config: %w", err)
	}
	o := &Objects{}
	if err := spec.LoadAndAssign(&o.floorObjects, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load floor: %+v", ve)
		}
		return nil, fmt.Errorf("load floor: %w", err)
	}
	return o, nil
}

// DecodeDone reads a completion record of the ring (struct floor_done: the request id, in
// the kernel's byte order).
func DecodeDone(rec []byte) (id uint64, ok bool) {
	if len(rec) < 8 {
		return 0, false
	}
	return binary.NativeEndian.Uint64(rec), true
}

// Floor is an open floor: its programs attached, its client socket, its ring reader.
type Floor struct {
	cfg     Config
	objs    *Objects
	attach  []bpfx.Attachment
	conn    *net.UDPConn
	ring    *isg.Ring
	free    chan uint16
	seq     atomic.Uint64
	mu      sync.Mutex
	pending [Slots]*waiter
	pumpMu  sync.Mutex
	polls   isg.Poller // pkg/sg's ring reader policy, so that only the kernel programs differ
	closed  atomic.Bool
	wg      sync.WaitGroup
	strays  atomic.Uint64
	// Completed and TimedOut count the requests that ended each way.
	Completed, TimedOut atomic.Uint64
}

type waiter struct {
	id    uint64
	ch    chan struct{}
	guard *time.Timer
	buf   []byte
}

var waiters = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}

// Open loads and attaches the floor in the caller's network namespace and starts its
// ring reader.
func Open(cfg Config) (_ *Floor, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ifc, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	f := &Floor{cfg: cfg, free: make(chan uint16, cfg.InFlight)}
	defer func() {
		if err != nil {
			f.release()
		}
	}()
	if f.conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		return nil, fmt.Errorf("floor: client socket: %w", err)
	}
	port := f.conn.LocalAddr().(*net.UDPAddr).Port
	if f.objs, err = Load(ifc.Index, uint16(port), cfg.Worker0.Port(), cfg.Fanout); err != nil {
		return nil, err
	}
	if f.ring, err = isg.OpenRing(f.objs.FloorRing); err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	f.polls = isg.Poller{Ring: f.ring, Mu: &f.pumpMu, Pump: f.pump, InFlight: f.InFlight, Closed: &f.closed}
	tc, err := bpfx.AttachTC(f.objs.FloorScatter, bpfx.TCTarget{Netns: -1, IfIndex: ifc.Index, Dir: bpfx.Egress, Name: "sg-floor"})
	if err != nil {
		return nil, fmt.Errorf("floor: attach scatter: %w", err)
	}
	f.attach = append(f.attach, tc)
	xdp, err := bpfx.AttachXDP(f.objs.FloorGather, -1, ifc.Index, bpfx.XDPAuto)
	if err != nil {
		return nil, fmt.Errorf("floor: attach gather: %w", err)
	}
	f.attach = append(f.attach, xdp)
	for i := range cfg.InFlight {
		f.free <- uint16(i)
	}
	f.seq.Store(uint64(time.Now().UnixNano()) >> 12)
	listening := make(chan struct{})
	f.wg.Add(1)
	go f.wait(listening)
	<-listening
	return f, nil
}

// Do sends one request and waits for its completion: ok false when it timed out.
func (f *Floor) Do(ctx context.Context) (id uint64, ok bool, err error) {
	var slot uint16
	select {
	case slot = <-f.free:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	id = f.seq.Add(1)<<10 | uint64(slot)
	w := waiters.Get().(*waiter)
	w.id = id
	f.mu.Lock()
	f.pending[slot] = w
	f.mu.Unlock()
	h := isg.Header{Version: isg.Version, Op: isg.OpRequest, ReqID: id, PayloadLen: 5}
	w.buf = append(h.Append(w.buf[:0]), "bench"...)
	if _, err := f.conn.WriteToUDPAddrPort(w.buf, f.cfg.Worker0); err != nil {
		f.take(slot, id)
		f.free <- slot
		return id, false, fmt.Errorf("floor: send: %w", err)
	}
	if w.guard == nil {
		w.guard = time.NewTimer(f.cfg.Timeout)
	} else {
		w.guard.Reset(f.cfg.Timeout)
	}
	select {
	case <-w.ch:
	case <-w.guard.C:
		if f.take(slot, id) != nil {
			f.TimedOut.Add(1)
			f.free <- slot
			waiters.Put(w) // its guard fired, and no reader can reach it now
			return id, false, nil
		}
		<-w.ch // the reader claimed it just now and is handing it over
	}
	w.guard.Stop()
	waiters.Put(w)
	f.Completed.Add(1)
	return id, true, nil
}

// take removes slot's waiter if it still waits for id and returns it; nil when the
// reader (or the timeout) took it first.
func (f *Floor) take(slot uint16, id uint64) *waiter {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.pending[slot]; w != nil && w.id == id {
		f.pending[slot] = nil
		return w
	}
	return nil
}

// InFlight is how many requests hold a slot.
func (f *Floor) InFlight() int { return f.cfg.InFlight - len(f.free) }

// Strays counts completions that found no waiter (a request that timed out first).
func (f *Floor) Strays() uint64 { return f.strays.Load() }

// deliver hands the completion of id to its waiter and frees its slot.
func (f *Floor) deliver(id uint64) {
	slot := uint16(id & (Slots - 1))
	w := f.take(slot, id)
	if w == nil {
		f.strays.Add(1)
		return
	}
	w.ch <- struct{}{}
	f.free <- slot
}

// wait is pkg/sg's ring reader (Group.wait and Group.poll): it waits for the ring in the
// Go runtime's poller and, while requests are outstanding and the next completion is
// expected within PollSpin, polls the ring with it held (no wake-ups), napping between
// looks from isg.NapDepth requests in flight (isg.Poller, the same as kedge's), before it sleeps.
func (f *Floor) wait(listening chan struct{}) {
	defer f.wg.Done()
	first := true
	_ = f.ring.Wait(func() bool {
		if f.closed.Load() {
			return true
		}
		f.polls.Poll(f.cfg.PollSpin)
		if first {
			first = false
			close(listening)
		}
		return false
	})
	if first {
		close(listening)
	}
}

func (f *Floor) pump() {
	for f.ring.Next(func(rec []byte) {
		if id, ok := DecodeDone(rec); ok {
			f.deliver(id)
		} else {
			f.strays.Add(1)
		}
	}) {
	}
}

// Close stops the reader and detaches and releases everything.
func (f *Floor) Close() error {
	if f.closed.Swap(true) {
		return nil
	}
	_ = f.ring.Shutdown()
	f.wg.Wait()
	return f.release()
}

func (f *Floor) release() error {
	var errs []error
	for i := len(f.attach) - 1; i >= 0; i-- {
		errs = append(errs, f.attach[i].Close())
	}
	f.attach = nil
	if f.ring != nil {
		errs = append(errs, f.ring.Close())
	}
	if f.conn != nil {
		errs = append(errs, f.conn.Close())
	}
	if f.objs != nil {
		errs = append(errs, f.objs.Close())
	}
	return errors.Join(errs...)
}
