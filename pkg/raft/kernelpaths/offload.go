package kernelpaths

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/config"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raft/transport"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// Mode says whether a kernel path runs.
type Mode int

const (
	// Off: user space does the work (the transport still carries the small messages as UDP).
	Off Mode = iota
	// Auto: on where the kernel and the raft address allow it, else off with a log line.
	Auto
	// On: on, or Open fails (a *kedge.FeatureError where the kernel lacks something).
	On
)

func (m Mode) String() string {
	switch m {
	case Off:
		return "off"
	case Auto:
		return "auto"
	case On:
		return "on"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Peer is a member of the cluster: its raft id and raft address (UDP and TCP, one port).
type Peer struct {
	ID   uint64
	Addr netip.AddrPort
}

// Config describes one node of the cluster and the kernel paths it runs.
type Config struct {
	// ClusterID tells clusters apart on the wire (every packet carries it).
	ClusterID uint64
	// ID is this node's raft id (raft.Config.ID).
	ID uint64
	// Peers are every voter of the cluster, this node included, with their raft addresses.
	Peers []Peer
	// Bind is the host:port the transport listens on (UDP and TCP); empty: this node's own
	// address in Peers. The follower program attaches to the interface holding its IP, so
	// an unspecified or loopback address leaves the follower path off (Auto) or fails (On).
	Bind string
	// Key is the cluster key (nil: none): every UDP packet carries a SipHash MAC and the
	// bulk connections a keyed handshake; the follower program checks the MAC in XDP.
	Key *[16]byte
	// Tick is the interval at which the application calls Tick; ElectionTicks and
	// HeartbeatTicks are raft.Config's ElectionTick and HeartbeatTick.
	Tick                          time.Duration
	ElectionTicks, HeartbeatTicks int
	// Follower runs the follower program (XDP on the raft interface): heartbeats answered
	// in the kernel, the leader's failure detected by a bpf_timer, pre-votes judged and
	// packets authenticated before user space, and, as leader, the quorum wait.
	Follower Mode
	// AliveBound: how long one refresh of the Ready loop keeps the follower program
	// answering for the node (0: adaptive, from the election timeout, at least 100 ms, up to
	// MaxAdaptiveBound as the process's threads wait for a CPU: cpuwait.go).
	AliveBound time.Duration
	// NoQuorumWait passes every follower's append response up instead of absorbing the ones
	// that move neither its match nor the commit (comparisons only).
	NoQuorumWait bool
	// NoCloseFailover: a follower whose connections with its leader all closed waits for the
	// election timeout as before, instead of campaigning at once (comparisons only;
	// docs/raft.md, "A leader whose connections closed").
	NoCloseFailover bool
	// LeaderHeartbeats, as leader, has the kernel send the heartbeats while a lease holds;
	// HeartbeatLease is how long one renewal keeps it sending (0: adaptive, as AliveBound).
	LeaderHeartbeats Mode
	HeartbeatLease   time.Duration
	// Log (nil: slog.Default()), Registry (nil: metrics not exported) and OnEvent (nil: no
	// election record; called from the Ready loop and the transport's goroutines, must not
	// block).
	Log      *slog.Logger
	Registry prometheus.Registerer
	OnEvent  func(Event)
}

// Event kinds: what a node saw of an election, in order.
const (
	EventDetector     = "detector"      // the kernel's failure detector fired (Detail: campaign, or why not)
	EventPreCandidate = "pre-candidate" // etcd-raft started a pre-vote (HeardNs: the leader last heard)
	EventCandidate    = "candidate"     // a pre-vote quorum: a real election, term and own vote durable
	EventLeader       = "leader"        // this node won (Term)
	EventFollower     = "follower"      // this node follows (Leader, 0 while unknown)
	EventVote         = "vote"          // this node granted its (durable) vote to Peer
	EventCommitted    = "committed"     // as leader: the first entry of its term committed (Detail: index)
	EventLease        = "lease"         // a vote request from Peer found the leader's lease over in real time
	// EventSlowSave: saving a Ready (BeforeSave to AfterSave: write and fsync) held the
	// Ready loop longer than the alive bound (AtNs: when the save started, SaveNs: how long
	// it took, Detail: its entries); with the follower path the program stopped answering
	// for the node at most the alive bound after AtNs.
	EventSlowSave = "slow-save"
	// EventBound: the adaptive alive bound and lease moved by a tenth or more (BoundNs: the
	// new bound).
	EventBound = "bound"
)

// Details of an EventDetector: the kernel's detector found the leader silent and the node
// campaigns (DetailCampaign), or every bulk connection with the leader ended by its close
// or reset and the node campaigns after its slot (the Detail begins with DetailGone and
// names the wait). Anything else is why the detector's wake-up was not acted on.
const (
	DetailCampaign = "campaign"
	DetailGone     = "gone: every connection closed"
)

// Event is one entry of a node's election record. Times are CLOCK_MONOTONIC ns (Monotonic):
// every process on the machine shares the clock.
type Event struct {
	AtNs    int64  `json:"at_ns"`
	Kind    string `json:"kind"`
	Term    uint64 `json:"term"`
	Leader  uint64 `json:"leader,omitempty"`
	Peer    uint64 `json:"peer,omitempty"`
	HeardNs int64  `json:"heard_ns,omitempty"` // last message from the leader (0: never)
	// SaveNs (candidate): how long saving the Ready that carried the new term and the own
	// vote took.
	SaveNs int64 `json:"save_ns,omitempty"`
	// BoundNs (slow-save, bound): the alive bound in force when the save began, the new
	// adaptive bound.
	BoundNs int64  `json:"bound_ns,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// Probe reports what the follower path needs from the kernel and this kernel lacks, as a
// *kedge.FeatureError (package pkg/kedge; nil: everything is there).
func Probe() error { return offload.Probe() }

// ErrNoDevice: the raft address is not on an interface the follower program can answer
// from (loopback or an unspecified address); Auto then leaves the follower path off.
var ErrNoDevice error = offload.ErrNoDevice

// CheckAddr says whether the follower program can serve a node whose raft address is addr:
// not on loopback and not unspecified (it answers on the interface that holds the address).
func CheckAddr(addr netip.Addr) error { return offload.CheckAddr(addr) }

// Monotonic is CLOCK_MONOTONIC, the clock of Event times and of the kernel's records.
func Monotonic() time.Duration { return offload.Monotonic() }

// Wakeup is a wake-up of the kernel's failure detector: give it to Offload.Wake.
type Wakeup struct {
	ev      offload.Event
	recheck bool // a second look the node scheduled itself (onLeaderSilent)
	// A peer whose connections all closed (gone.go): its id, when, and whether this is the
	// campaign the node scheduled after it (retry: how many times it asked again).
	gone     uint64
	at       time.Duration
	campaign bool
	retry    int
}

// Offload is one node's transport and kernel paths. Open it, Start it once etcd-raft's
// Node exists, and drive it from the Ready loop as the package documentation says. Its
// Ready-loop methods (Tick, Wake, BeforeSave, AfterSave, Send, Advanced) must be called
// from that one goroutine.
type Offload struct {
	cfg   Config
	self  uint64
	log   *slog.Logger
	reg   prometheus.Registerer
	peers map[uint64]netip.AddrPort // every member, self included

	tr *transport.Transport
	rn raft.Node
	st raft.Storage

	fol      *follower
	hb       heartbeatSender
	hbLeader interface{ Close() error }
	hbLease  interface {
		SetLease(time.Duration)
		Lease() time.Duration
	}
	hbKernel prometheus.Counter

	// The adaptive bound (cpuwait.go; nil adaptive: both bounds set, or no kernel path):
	// the estimator, the threads' CPU wait, when it was last read, the bound in force
	// (written by the Ready loop, read by Bounds from any goroutine).
	adaptive *adaptiveBound
	waits    *cpuWait
	waitAt   time.Duration
	bound    atomic.Int64

	wake   chan Wakeup
	closed chan struct{}
	wg     sync.WaitGroup

	// The Ready loop's view: the leader as of the last Ready (read by the transport's
	// receivers too), the last saved HardState's term and vote, the state after the last
	// Ready, the leader before the Ready in progress and when its save began.
	lead        atomic.Uint64
	termDurable uint64
	voteDurable uint64
	lastState   raft.StateType
	prevLead    uint64
	saveStart   time.Time
	// The election record (record.go).
	leaderTermStart, committedTerm uint64
	cs                             atomic.Pointer[pb.ConfState]
}

// Open binds the transport (UDP and TCP on Bind) and loads the kernel paths the config asks
// for. Nothing is delivered to raft before Start.
func Open(cfg Config) (*Offload, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Tick <= 0 || cfg.ElectionTicks <= 0 || cfg.HeartbeatTicks <= 0 {
		return nil, errors.New("kernelpaths: Tick, ElectionTicks and HeartbeatTicks must be positive (raft.Config's values)")
	}
	o := &Offload{cfg: cfg, self: cfg.ID, log: cfg.Log, reg: cfg.Registry, peers: map[uint64]netip.AddrPort{},
		closed: make(chan struct{})}
	if o.reg == nil {
		o.reg = prometheus.NewRegistry() // registered nowhere: kept for the collectors' sake
	}
	var tps []transport.Peer
	for _, p := range cfg.Peers {
		o.peers[p.ID] = p.Addr
		if p.ID != cfg.ID {
			tps = append(tps, transport.Peer{ID: p.ID, Addr: p.Addr})
		}
	}
	selfAddr, ok := o.peers[cfg.ID]
	if !ok {
		return nil, fmt.Errorf("kernelpaths: node %d is not among the peers: list every member, this node included", cfg.ID)
	}
	if o.cfg.Bind == "" {
		o.cfg.Bind = selfAddr.String()
	}
	o.hbKernel = newHeartbeatCounter(o.reg, cfg.LeaderHeartbeats != Off)
	floor := offload.DefaultBound(o.electionTimeout())
	o.bound.Store(int64(floor))
	if (cfg.Follower != Off && cfg.AliveBound == 0) || (cfg.LeaderHeartbeats != Off && cfg.HeartbeatLease == 0) {
		o.adaptive, o.waits = newAdaptiveBound(floor), newCPUWait()
	}
	var err error
	o.tr, err = transport.New(transport.Options{ClusterID: cfg.ClusterID, Self: cfg.ID, Bind: o.cfg.Bind,
		Peers: tps, Key: (*wire.Key)(cfg.Key), Log: o.log, Registry: o.reg, PeerClosed: o.peerClosed})
	if err != nil {
		return nil, err
	}
	if err := o.startOffload(cfg.Follower); err != nil {
		o.tr.Close()
		return nil, err
	}
	if err := o.startHeartbeats(); err != nil {
		o.closeOffload()
		o.tr.Close()
		return nil, err
	}
	o.registerBounds()
	if et := o.electionTimeout(); followerOnlyShort(o.fol != nil, o.hb != nil, et) {
		o.log.Warn("raft: the kernel's failure detector runs without kernel heartbeats at a short election timeout: "+
			"it judges this cluster's leader by its user-space heartbeats in real time, so a leader whose process waits "+
			"longer than the timeout for a CPU is replaced (docs/raft.md, Kernel paths: leader heartbeats); "+
			"keep the kernel heartbeats on, or use an election timeout of at least 100ms", "election_timeout", et)
	}
	return o, nil
}

func (o *Offload) electionTimeout() time.Duration {
	return time.Duration(o.cfg.ElectionTicks) * o.cfg.Tick
}

// Start hands the offload the node's etcd-raft Node and its Storage (read for the durable
// HardState, the configuration and the log's end; the application writes it) and starts
// delivering received messages to rn.Step. Call it once, after raft.StartNode or
// RestartNode, before the Ready loop.
func (o *Offload) Start(rn raft.Node, st raft.Storage) error {
	o.rn, o.st = rn, st
	hs, cs, err := st.InitialState()
	if err != nil {
		return fmt.Errorf("kernelpaths: read the initial state: %w", err)
	}
	o.termDurable, o.voteDurable = hs.GetTerm(), hs.GetVote()
	o.SetConfState(cs)
	o.offloadMirror(o.termDurable, o.lead.Load(), true)
	o.offloadAlive()
	if o.fol != nil {
		o.wake = make(chan Wakeup)
		o.wg.Add(1)
		go o.forwardEvents()
	}
	o.tr.Start(transportIn{o})
	return nil
}

// forwardEvents hands the detector's events to the Ready loop (Wakeups).
func (o *Offload) forwardEvents() {
	defer o.wg.Done()
	for {
		select {
		case ev, ok := <-o.fol.k.Events():
			if !ok {
				return
			}
			select {
			case o.wake <- Wakeup{ev: ev}:
			case <-o.closed:
				return
			}
		case <-o.closed:
			return
		}
	}
}

// Wakeups is the channel of the kernel's failure detector (nil, never ready, without the
// follower path): select on it in the Ready loop and pass what comes to Wake.
func (o *Offload) Wakeups() <-chan Wakeup { return o.wake }

// Wake handles a failure-detector wake-up: if the leader is still silent for this node, it
// campaigns (a pre-vote first) instead of waiting for etcd-raft's own timer.
func (o *Offload) Wake(ctx context.Context, w Wakeup) {
	if w.gone != 0 {
		o.onLeaderGone(ctx, w)
		return
	}
	if w.recheck {
		// The second look happens now: its record says when the node decided, not when the
		// kernel's timer first fired.
		w.ev.Fired = offload.Monotonic()
	}
	o.onLeaderSilent(ctx, w.ev)
}

// Tick replaces the application's rn.Tick(): it feeds etcd-raft what the kernel answered,
// recorded and absorbed since the last tick, ticks it, and renews the kernel's deadlines.
func (o *Offload) Tick(ctx context.Context) {
	o.offloadMirror(o.termDurable, o.lead.Load(), true)
	o.offloadTick(ctx)
	o.offloadAcks(ctx)
	o.offloadQuorum(ctx)
	o.rn.Tick()
	o.adapt()
	o.offloadAlive()
	o.renewHeartbeats()
}

// BeforeSave takes a Ready before anything of it is persisted. It returns the messages that
// may be sent at once, while the Ready is being saved (a leader's appends and heartbeats,
// when it led before this Ready and the Ready changes no term or vote; any node's forwarded
// proposals and read requests), and removes them from rd.Messages; send them with Send.
func (o *Offload) BeforeSave(rd *raft.Ready) (early []*pb.Message) {
	o.prevLead = o.lead.Load()
	if rd.SoftState != nil {
		o.lead.Store(rd.SoftState.Lead)
	}
	// A new term is announced to the kernel first: its pre-votes up to that term go to user
	// space while the fsync runs.
	if rd.HardState != nil && rd.HardState.GetTerm() > o.termDurable {
		o.offloadPending(rd.HardState.GetTerm())
	}
	early, rd.Messages = splitEarlySends(rd.Messages, o.leadsDurably(rd))
	o.saveStart = time.Now()
	return early
}

// AfterSave takes the Ready once its snapshot, HardState and entries are durable (fsynced)
// and before any of rd.Messages is sent: it mirrors the durable state into the kernel and
// filters rd.Messages (the answers the kernel already sent, early pre-votes held back).
// Then send rd.Messages with Send.
func (o *Offload) AfterSave(rd *raft.Ready) {
	saved := time.Since(o.saveStart)
	if saved > o.aliveBound() {
		o.slowSave(saved, len(rd.Entries), o.aliveBound())
	}
	o.fol.saved(rd)
	if rd.HardState != nil {
		if o.fol != nil {
			o.fol.commit = rd.HardState.GetCommit()
		}
		o.termDurable, o.voteDurable = rd.HardState.GetTerm(), rd.HardState.GetVote()
	}
	// The kernel answers heartbeats of the durable term only, now that it is durable.
	o.offloadMirror(o.termDurable, o.lead.Load(), false)
	if o.fol != nil {
		rd.Messages = dropSynthResps(rd.Messages)
	}
	if rd.SoftState != nil {
		o.renewHeartbeats() // a lost leadership drops the kernel's lease before anything else goes out
	}
	o.recordReady(rd, o.prevLead, saved)
	rd.Messages = o.holdEarlyPreVotes(rd.Messages, o.prevLead)
	o.refusedBehind(rd.Messages)
}

// Send hands messages to the transport (small ones as UDP packets, the rest over TCP);
// it never blocks on the network. The heartbeats the kernel sends are left out.
func (o *Offload) Send(msgs []*pb.Message) {
	if len(msgs) == 0 {
		return
	}
	o.tr.Send(o.kernelHeartbeats(msgs))
}

// Advanced is called after rn.Advance(): the Ready loop is alive.
func (o *Offload) Advanced() {
	o.adapt()
	o.offloadAlive()
}

// SetConfState tells the offload the configuration etcd-raft applied (the result of
// rn.ApplyConfChange, or a snapshot's): the quorum wait counts its voters.
func (o *Offload) SetConfState(cs *pb.ConfState) { o.cs.Store(cs) }

// HeardAgo is how long ago this node last heard peer: as leader (asLeader), peer's last
// heartbeat response; as follower, peer's last heartbeat - the later of what the transport
// delivered and what the kernel answered or recorded without waking the node. ok is false
// when it never heard peer.
func (o *Offload) HeardAgo(peer uint64, asLeader bool) (ago time.Duration, ok bool) {
	h := o.HeardBy(peer, asLeader)
	if h.Transport != nil {
		ago, ok = *h.Transport, true
	}
	if h.Kernel != nil && (!ok || *h.Kernel < ago) {
		ago, ok = *h.Kernel, true
	}
	return ago, ok
}

// Heard is how long ago this node last heard a peer by each of its records (nil: that record
// never heard it). Transport: any message its transport delivered from the peer (user space
// saw it). Kernel: the follower program's record - as follower, the leader's heartbeats it
// answered or recorded without waking the node; as leader, the peer's heartbeat responses it
// recorded. HeardAgo is the later of the two.
type Heard struct {
	Transport, Kernel *time.Duration
}

// HeardBy returns each record of peer (asLeader: as HeardAgo).
func (o *Offload) HeardBy(peer uint64, asLeader bool) Heard {
	var h Heard
	if t := o.tr.LastHeard(peer); !t.IsZero() {
		d := time.Since(t)
		h.Transport = &d
	}
	if k, ok := o.fol.kernelHeard(peer, asLeader); ok {
		h.Kernel = &k
	}
	return h
}

// Mode describes the follower kernel path ("xdp-native on eth0"; "" when off).
func (o *Offload) Mode() string {
	if o.fol == nil {
		return ""
	}
	return o.fol.k.Mode() + " on " + o.fol.k.Interface()
}

// Bounds is what the kernel paths vouch for the node with now (0: that path is off): how
// long the follower program answers for it after the loop's last refresh (the alive bound:
// Config.AliveBound, else the adaptive bound, cpuwait.go) and how long one renewal keeps
// the kernel heartbeating for it as leader (the sender's lease). Safe from any goroutine.
func (o *Offload) Bounds() (alive, lease time.Duration) {
	if o.fol != nil {
		alive = o.aliveBound()
	}
	if o.hbLease != nil {
		lease = o.hbLease.Lease()
	}
	return alive, lease
}

// KernelHeartbeats reports whether the kernel sends this node's heartbeats as leader.
func (o *Offload) KernelHeartbeats() bool { return o.hb != nil }

// Close stops the transport and detaches the kernel paths (the follower program stops
// answering, the kernel stops heartbeating). Call it after the Ready loop returned.
func (o *Offload) Close() error {
	close(o.closed)
	err := o.tr.Close()
	if o.fol != nil && o.fol.recheckTimer != nil {
		o.fol.recheckTimer.Stop()
	}
	if o.fol != nil && o.fol.goneTimer != nil {
		o.fol.goneTimer.Stop()
	}
	if cerr := o.closeOffload(); err == nil && cerr != nil {
		err = fmt.Errorf("close offload: %w", cerr)
	}
	if cerr := o.closeHeartbeats(); err == nil && cerr != nil {
		err = fmt.Errorf("close kernel heartbeats: %w", cerr)
	}
	o.wg.Wait()
	if o.waits != nil {
		o.waits.close()
	}
	return err
}

// event adds e to the election record.
func (o *Offload) event(e Event) {
	if o.cfg.OnEvent == nil {
		return
	}
	if e.AtNs == 0 {
		e.AtNs = int64(offload.Monotonic())
	}
	o.cfg.OnEvent(e)
}

// resolveBind is the follower program's address: the transport's bind address.
func (o *Offload) resolveBind() (netip.AddrPort, error) { return config.ResolveAddr(o.cfg.Bind) }
