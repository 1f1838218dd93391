package kernelpaths

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/raft/v3/raftpb"
)

// follower is the node's side of the follower kernel path.
type follower struct {
	k        *offload.Follower
	peers    map[uint64]netip.AddrPort
	detect   time.Duration
	aliveFor time.Duration

	feed     hbFeeder
	mirror   offload.Durable // last mirrored (term, lead as etcd-raft has it)
	mirrored bool
	// end is the durable log's end as the Ready loop last saved it (known: read from the
	// storage at the last tick or snapshot, moved by each Ready's entries since), so a
	// Ready's mirror reads no storage; detLead and detAfter memoize detectAfter.
	end       logEnd
	endKnown  bool
	detLead   uint64
	detAfter  time.Duration
	lastAlive time.Duration // CLOCK_MONOTONIC of the last Alive refresh

	wakeups   *prometheus.CounterVec
	leaseOver prometheus.Counter // vote requests let past etcd-raft's lease (judgeLease)

	// As leader (offloadAcks): the kernel's heartbeat-response counts stepped, per
	// follower; ackAfter is the silence of the transport after which the record is read.
	acked    map[uint64]uint64
	ackAfter time.Duration
	ackFed   prometheus.Counter

	// recheckTimer: a wake-up the leader's appends made stale is looked at again when the
	// silence after them reaches the node's slot (Offload.recheck; Ready loop only).
	recheckTimer *time.Timer

	// gone: the leader whose connections all closed, while nothing was heard from it since
	// (gone.go; written by the Ready loop, read by the transport's receivers); goneTimer: the
	// campaign scheduled after it (Ready loop only).
	gone      atomic.Pointer[gone]
	goneTimer *time.Timer

	// since: the last message since the last tick that restarted etcd-raft's lease
	// (transportIn.Step); commit: the commit of the last saved HardState (Ready loop only).
	// With them offloadTick leaves out a synthesized heartbeat that would change nothing
	// (skipSynth); stepped and skipped count them (offload_synth_heartbeats_total{result}).
	since            stepSince
	commit           uint64
	stepped, skipped prometheus.Counter

	// The quorum wait (offloadQuorum): the configuration whose voters the program has (a
	// new ConfState is a new pointer: setConfState, restore), those voters (none: off, or
	// quorumOff, the node's option), and per voter the absorbed count stepped at appTerm.
	cs        *pb.ConfState
	voters    []uint64
	quorumOff bool
	appTerm   uint64
	appFed    map[uint64]uint64
	appFedC   prometheus.Counter
}

// startOffload loads and attaches the follower program for the node's raft address.
func (o *Offload) startOffload(mode Mode) error {
	if mode == Off {
		return nil
	}
	self, err := o.resolveBind()
	if err != nil {
		return fmt.Errorf("resolve raft address: %w", err)
	}
	et := o.electionTimeout()
	f := &follower{peers: o.peers, detect: et, aliveFor: o.aliveBound(), acked: map[uint64]uint64{},
		ackAfter: 2 * time.Duration(o.cfg.HeartbeatTicks) * o.cfg.Tick, appFed: map[uint64]uint64{},
		quorumOff: o.cfg.NoQuorumWait}
	var allow []wire.AuthPeer
	for _, p := range o.cfg.Peers {
		if p.ID != o.self {
			allow = append(allow, wire.AuthPeer{ID: p.ID, Addr: p.Addr})
		}
	}
	// With a key, the program marks the packets whose MAC it verified and the transport
	// skips its own SipHash of them (docs/raft.md, "Kernel paths: pre-vote and
	// authentication"). The transport knows the mark before the program can write it.
	var mark wire.Mark
	key := (*wire.Key)(o.cfg.Key)
	if key != nil && *key != (wire.Key{}) {
		if mark, err = wire.NewMark(); err != nil {
			return err
		}
		o.tr.SetPassMark(mark)
	}
	f.k, err = offload.NewFollower(offload.FollowerOptions{ClusterID: o.cfg.ClusterID, Self: o.self, RaftAddr: self,
		Key: key, PassMark: mark, Peers: allow, Netns: -1, Detect: et, AliveFor: f.aliveFor, Log: o.log})
	if err != nil {
		if mode == Auto {
			o.log.Warn("raft offload: off, the follower kernel path is not available here", "err", err)
			return nil
		}
		return fmt.Errorf("start follower offload: %w", err)
	}
	f.wakeups = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
		Name: "offload_wakeups_total", Help: "Leader-silent wake-ups from the kernel's failure detector by outcome (campaign, stale), and early campaigns of etcd-raft's own timer held until the detector's slot (held)."},
		[]string{"result"})
	f.leaseOver = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
		Name: "offload_lease_over_total", Help: "Vote requests that found the leader's lease over in real time while etcd-raft's tick count still held it (passed on with the lease check skipped)."})
	f.ackFed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
		Name: "offload_acks_fed_total", Help: "As leader: followers' heartbeat responses the kernel recorded and the node stepped into etcd-raft because its transport had not delivered them."})
	synth := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
		Name: "offload_synth_heartbeats_total", Help: "Heartbeats synthesized from the kernel's record, by result: stepped into etcd-raft, or skipped because an append of the same leader and term had restarted etcd-raft's timer since the last tick and the commit was no higher (stepping them would change nothing)."},
		[]string{"result"})
	f.stepped, f.skipped = synth.WithLabelValues("stepped"), synth.WithLabelValues("skipped")
	f.appFedC = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
		Name: "offload_quorum_fed_total", Help: "As leader: MsgAppResp the node stepped from the quorum wait's record of a follower whose responses the kernel absorbed (one per follower and tick at most)."})
	o.reg.MustRegister(f.wakeups, f.leaseOver, f.ackFed, synth, f.appFedC, &offloadCollector{k: f.k})
	o.fol = f
	return nil
}

// recheck looks at the leader-silent event ev again after wait (Wakeups), replacing a
// second look still pending.
func (o *Offload) recheck(ev offload.Event, wait time.Duration) {
	f := o.fol
	if f.recheckTimer != nil {
		f.recheckTimer.Stop()
	}
	f.recheckTimer = time.AfterFunc(wait, func() {
		select {
		case o.wake <- Wakeup{ev: ev, recheck: true}:
		case <-o.closed:
		}
	})
}

func (o *Offload) closeOffload() error {
	if o.fol == nil {
		return nil
	}
	return o.fol.k.Close()
}

// OffloadMode describes the follower kernel path ("" when off).
func (o *Offload) OffloadMode() string {
	if o.fol == nil {
		return ""
	}
	return o.fol.k.Mode() + " on " + o.fol.k.Interface()
}

// heardMs is how many milliseconds ago this node last heard peer (nil: never), for
// Status: the later of what its transport delivered and, with the follower path, the
// kernel's record - as follower (peer is the leader), the leader's heartbeats the program
// answered without waking the node (user space sees none while it answers); as leader
// (leading), peer's heartbeat responses the program recorded (maps.h leader_acks).
func (o *Offload) heardMs(peer uint64, now time.Time, leading bool) *float64 {
	var age time.Duration
	known := false
	if t := o.tr.LastHeard(peer); !t.IsZero() {
		age, known = now.Sub(t), true
	}
	if k, ok := o.fol.kernelHeard(peer, leading); ok && (!known || k < age) {
		age, known = k, true
	}
	if !known {
		return nil
	}
	v := float64(age.Microseconds()) / 1000
	return &v
}

// kernelHeard is how long ago the follower program last recorded peer (see heardMs); ok is
// false without the follower path or a record of peer.
func (f *follower) kernelHeard(peer uint64, leading bool) (age time.Duration, ok bool) {
	if f == nil {
		return 0, false
	}
	var at time.Duration
	if leading {
		a, found, err := f.k.Ack(peer)
		if err != nil || !found {
			return 0, false
		}
		at = a.Arrival
	} else {
		hb, err := f.k.Heartbeat()
		if err != nil || hb.Leader != peer {
			return 0, false
		}
		at = hb.Arrival
	}
	if at == 0 {
		return 0, false
	}
	return max(offload.Monotonic()-at, 0), true
}

// offloadCollector exports the program's counters as kedge_raft_offload_packets_total{counter}.
type offloadCollector struct{ k *offload.Follower }

var offloadDesc = prometheus.NewDesc("kedge_raft_offload_packets_total",
	"Follower XDP program counters (docs/raft.md \"Kernel paths: follower\").", []string{"counter"}, nil)

func (c *offloadCollector) Describe(ch chan<- *prometheus.Desc) { ch <- offloadDesc }

func (c *offloadCollector) Collect(ch chan<- prometheus.Metric) {
	cs, err := c.k.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(offloadDesc, err)
		return
	}
	for _, s := range cs {
		ch <- prometheus.MustNewConstMetric(offloadDesc, prometheus.CounterValue, float64(s.Value), s.Name)
	}
}
