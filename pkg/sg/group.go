package sg

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/runstate"
	isg "github.com/kedge-dev/kedge/internal/sg"
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
	// listening is closed by the reader of the ring after its first pass over it, before
	// it parks: Open returns only then, so each result is read by the reader meant for it
	// (on a busy machine a late first pass took a result that the socket's reader was for).
	listening chan struct{}
	// delivered counts results by the reader that delivered them (wake*): tests check
	// that each wake-up path does its job.
	delivered [wakeKinds]atomic.Uint64
	// holdReads parks the ring's reader after what it read (tests: a reader that fell
	// behind, so the ring fills and results stay in their slots).
	holdReads atomic.Bool
	polls     isg.Poller      // the ring reader's policy (poll), under pumpMu
	owner     *runstate.Owner // with a StatusDir: this process's run-state owner
	pacer     *pacer.Pacer    // Config.Resend: the re-sends' ticks
}

type waiter struct {
	id    uint64
	sent  time.Time
	ch    chan Result
	guard *time.Timer // the Scatter's guard (scatter.go)
	buf   []byte      // the request datagram
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
	var routes resolved
	err = netnsx.In(ns, func() (err error) {
		routes, err = resolve(&cfg)
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
	var replicaEntries uint32
	if cfg.hasReplicas() {
		replicaEntries = uint32(len(cfg.Workers))
	}
	lopts := isg.LoadOptions{Tier: isg.DetectTier(), ExpireSlack: 20_000, Batch: uint32(cfg.ScatterBatch),
		FirstBatch: uint32(cfg.ScatterFirstBatch), PartEntries: partEntries, ReplicaEntries: replicaEntries}
	if cfg.Resend > 0 {
		if lopts.Tier != isg.TierLoop {
			return nil, bpfx.NotSupported("re-sends of scatter-gather requests (bpf_loop)", "5.17",
				"run without Resend (--resend) on this kernel", ebpf.ErrNotSupported)
		}
		// The pacer (one per interface and process): its namespace is owned by this
		// process (netnsx.OwnedName), its veth pair named after the interface index.
		g.pacer, err = pacer.New(pacer.Options{Netns: ns, Name: fmt.Sprintf("sg-pc%d", routes.ifindex),
			IfName: fmt.Sprintf("kedge-sg%d", routes.ifindex), Backend: cfg.PacerBackend})
		if err != nil {
			return nil, fmt.Errorf("sg re-sends: start the pacer: %w", err)
		}
		cli := g.pacer.Client()
		lopts.Resend, lopts.Pacer = true, &cli
	}
	g.objs, err = isg.Load(lopts)
	if err != nil {
		return nil, fmt.Errorf("load sg data plane: %w", err)
	}
	if cfg.Reduction == User {
		u := isg.UserReduction{Object: cfg.UserReduction.Object, Program: cfg.UserReduction.Program}
		if err := g.objs.LoadUserReduction(uint32(cfg.Group), u); err != nil {
			return nil, err
		}
	}
	untimed, err := g.objs.InitTimers(cfg.InFlight)
	if err != nil {
		return nil, err
	}
	if err := g.fillMaps(routes); err != nil {
		return nil, err
	}
	if g.ring, err = isg.OpenRing(g.objs.Results); err != nil {
		return nil, fmt.Errorf("open result ring buffer: %w", err)
	}
	g.polls = isg.Poller{Ring: g.ring, Mu: &g.pumpMu, Pump: func() { g.pumpLocked(byRing) }, InFlight: g.InFlight, Closed: &g.closed}
	tc, err := bpfx.AttachTC(g.objs.Scatter, bpfx.TCTarget{Netns: ns, IfIndex: routes.ifindex, Dir: bpfx.Egress, Name: "sg-scatter"})
	if err != nil {
		return nil, fmt.Errorf("attach sg scatter to %s egress: %w", cfg.Interface, err)
	}
	g.attach = append(g.attach, tc)
	// Fan-outs larger than a batch continue from the interface's ingress.
	cont, err := bpfx.AttachTC(g.objs.Cont, bpfx.TCTarget{Netns: ns, IfIndex: routes.ifindex, Dir: bpfx.Ingress, Name: "sg-scatter-cont"})
	if err != nil {
		return nil, fmt.Errorf("attach sg scatter continuation to %s ingress: %w", cfg.Interface, err)
	}
	g.attach = append(g.attach, cont)
	xdp, err := bpfx.AttachXDP(g.objs.Gather, ns, routes.ifindex, bpfx.XDPAuto)
	if err != nil {
		return nil, fmt.Errorf("attach sg gather (xdp) to %s: %w - another XDP program may own the interface", cfg.Interface, err)
	}
	g.attach = append(g.attach, xdp)
	if g.pacer != nil {
		if err := g.pacer.Start(g.objs.Resend); err != nil {
			return nil, fmt.Errorf("sg re-sends: %w", err)
		}
	}
	for i := range cfg.InFlight {
		g.free <- uint16(i)
	}
	g.seq.Store(rand.Uint64() >> 12)
	g.wg.Add(2)
	g.listening = make(chan struct{})
	if cfg.BusyPoll {
		go g.spin()
	} else {
		go g.wait()
	}
	go g.drain()
	<-g.listening
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

// ResendState is a group's re-send state now (Config.Resend): the delay a round is due
// after (the kernel's estimate of the Config.ResendQuantile quantile of reply times,
// clamped to [ResendMin, Resend], or Resend itself; Estimate is the estimate unclamped,
// 0 before the first reply or without a quantile) and the copies the budget holds.
type ResendState struct {
	Delay    time.Duration `json:"delay_ns"`
	Estimate time.Duration `json:"estimate_ns"`
	Budget   float64       `json:"budget_copies"`
}

// ResendState reads the group's delay estimate and budget (zero without Config.Resend).
func (g *Group) ResendState() (ResendState, error) {
	if g.cfg.Resend <= 0 {
		return ResendState{}, nil
	}
	var b isg.BudgetRec
	if err := g.objs.Budgets.Lookup(uint32(g.cfg.Group), &b); err != nil {
		return ResendState{}, fmt.Errorf("read re-send budget: %w", err)
	}
	st := ResendState{Delay: g.cfg.Resend, Budget: float64(b.TokensMilli) / isg.CopyMilli}
	if g.cfg.ResendQuantile > 0 && b.DelayNs > 0 {
		st.Estimate = time.Duration(b.DelayNs)
		st.Delay = min(max(st.Estimate, g.cfg.ResendMin), g.cfg.Resend)
	}
	return st, nil
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
	if g.pacer != nil {
		errs = append(errs, g.pacer.Close())
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
