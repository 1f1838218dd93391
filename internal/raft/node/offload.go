package node

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/config"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Offload says whether the node answers heartbeats and detects leader failure in the kernel
// (docs/raft.md "Kernel paths: follower").
type Offload int

const (
	// OffloadOff: everything in user space (part 1).
	OffloadOff Offload = iota
	// OffloadAuto: on where the kernel and the raft address allow it, else off with a log line.
	OffloadAuto
	// OffloadOn: on, or New fails (a *kedge.FeatureError where the kernel lacks something).
	OffloadOn
)

// synthContext marks the heartbeats the node synthesizes from the kernel's heartbeat record:
// etcd-raft echoes it in the MsgHeartbeatResp, which the node then does not send (the kernel
// already answered the real heartbeat). 12 bytes: never one of kedge's 8-byte read contexts.
var synthContext = []byte("kedge-xdp-hb")

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

	// recheck: a wake-up the leader's appends made stale is looked at again when the
	// silence after them reaches the node's slot (Ready loop only).
	recheck   *time.Timer
	recheckEv offload.Event

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

// stepSince records, for the Ready loop, the leader and term of the last message that
// restarted etcd-raft's lease since the loop's last tick.
type stepSince struct {
	mu         sync.Mutex
	set        bool
	from, term uint64
}

func (s *stepSince) stepped(from, term uint64) {
	s.mu.Lock()
	s.set, s.from, s.term = true, from, term
	s.mu.Unlock()
}

// take returns what was recorded since the last take and clears it.
func (s *stepSince) take() (set bool, from, term uint64) {
	s.mu.Lock()
	set, from, term = s.set, s.from, s.term
	s.set = false
	s.mu.Unlock()
	return set, from, term
}

// skipSynth reports whether the synthesized heartbeat m (hbFeeder) may be left out: since
// the last tick the node stepped a message from m's leader at m's term that restarted
// etcd-raft's election timer (stepped: an append, heartbeat or snapshot - electionElapsed =
// 0 and lead = From, all the heartbeat would do to them), and m's commit is no higher than
// the commit already saved (commit: commitTo(m.Commit) is a no-op). The response etcd-raft
// would send is dropped anyway (the kernel's went out). Stepping m then changes nothing in
// etcd-raft, and leaving it out saves a Ready cycle per tick on a follower that appends
// reach anyway (docs/raft.md section 14, "The synthesized heartbeat").
func skipSynth(m *pb.Message, stepped bool, from, term, commit uint64) bool {
	return stepped && m.GetFrom() == from && m.GetTerm() == term && m.GetCommit() <= commit
}

// hbFeeder turns the kernel's heartbeat record into the etcd-raft step it stands for: one
// MsgHeartbeat per tick when heartbeats were answered since the last one, carrying the
// leader, the term and the highest commit they said. etcd-raft's follower does on a heartbeat
// exactly: electionElapsed = 0, lead = From, commitTo(Commit) (monotonic, so the highest of
// several is what several in a row leave), and a response (the kernel's).
type hbFeeder struct{ seen uint64 }

func (f *hbFeeder) next(hb offload.Heartbeat, self uint64) *pb.Message {
	if hb.Count == f.seen {
		return nil
	}
	f.seen = hb.Count
	m := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(hb.Leader), To: proto.Uint64(self),
		Term: proto.Uint64(hb.Term), Context: synthContext}
	if hb.Commit != 0 {
		m.Commit = proto.Uint64(hb.Commit)
	}
	return m
}

// isSynthResp reports whether m answers a synthesized heartbeat.
func isSynthResp(m *pb.Message) bool {
	return m.GetType() == pb.MsgHeartbeatResp && string(m.GetContext()) == string(synthContext)
}

// startOffload loads and attaches the follower program for the node's raft address.
func (n *Node) startOffload(mode Offload) error {
	if mode == OffloadOff {
		return nil
	}
	self, err := config.ResolveAddr(n.cfg.RaftBind())
	if err != nil {
		return fmt.Errorf("resolve raft address: %w", err)
	}
	et := time.Duration(n.cfg.ElectionTicks) * n.cfg.Tick
	alive := offload.DefaultBound(et)
	if n.opts.OffloadAlive > 0 {
		alive = n.opts.OffloadAlive
	}
	f := &follower{peers: map[uint64]netip.AddrPort{}, detect: et, aliveFor: alive, acked: map[uint64]uint64{},
		ackAfter: 2 * time.Duration(n.cfg.HeartbeatTicks) * n.cfg.Tick, appFed: map[uint64]uint64{},
		quorumOff: n.opts.NoQuorumWait}
	var allow []wire.AuthPeer
	for _, p := range n.cfg.Peers {
		a, err := config.ResolveAddr(p.Raft)
		if err != nil {
			return fmt.Errorf("resolve peer %d: %w", p.ID, err)
		}
		f.peers[p.ID] = a
		if p.ID != n.cfg.ID {
			allow = append(allow, wire.AuthPeer{ID: p.ID, Addr: a})
		}
	}
	// With a key, the program marks the packets whose MAC it verified and the transport
	// skips its own SipHash of them (docs/raft.md, "Kernel paths: pre-vote and
	// authentication"). The transport knows the mark before the program can write it.
	var mark wire.Mark
	if n.cfg.ClusterKey != nil && *n.cfg.ClusterKey != (wire.Key{}) {
		if mark, err = wire.NewMark(); err != nil {
			return err
		}
		n.tr.SetPassMark(mark)
	}
	f.k, err = offload.NewFollower(offload.FollowerOptions{ClusterID: n.cfg.ClusterID, Self: n.cfg.ID, RaftAddr: self,
		Key: n.cfg.ClusterKey, PassMark: mark, Peers: allow, Netns: -1, Detect: et, AliveFor: alive, Log: n.log})
	if err != nil {
		if mode == OffloadAuto {
			n.log.Warn("raft offload: off, the follower kernel path is not available here", "err", err)
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
	n.reg.MustRegister(f.wakeups, f.leaseOver, f.ackFed, synth, f.appFedC, &offloadCollector{k: f.k})
	f.recheck = time.NewTimer(time.Hour)
	f.recheck.Stop()
	n.fol = f
	return nil
}

// events is the failure detector's channel (nil without offload: never ready).
func (f *follower) events() <-chan offload.Event {
	if f == nil {
		return nil
	}
	return f.k.Events()
}

// rechecks is the channel of the delayed second look (nil without offload: never ready).
func (f *follower) rechecks() <-chan time.Time {
	if f == nil {
		return nil
	}
	return f.recheck.C
}

// tick feeds the kernel's heartbeat record into etcd-raft; called before each Tick.
func (n *Node) offloadTick(ctx context.Context) {
	f := n.fol
	if f == nil {
		return
	}
	stepped, from, term := f.since.take() // this tick's, whatever happens below
	hb, err := f.k.Heartbeat()
	if err != nil {
		n.log.Warn("raft offload: read heartbeat record", "err", err)
		return
	}
	if m := f.feed.next(hb, n.cfg.ID); m != nil && hb.Term >= n.termDurable {
		// (A record of an older term than the saved one: the node moved on since the
		// kernel answered; stepping it would only make etcd-raft answer a stale leader.)
		if skipSynth(m, stepped, from, term, f.commit) {
			f.skipped.Inc()
			return
		}
		f.stepped.Inc()
		if err := n.rn.Step(ctx, m); err != nil && ctx.Err() == nil {
			n.log.Debug("raft offload: step synthesized heartbeat", "err", err)
		}
	}
}

// offloadAcks, as leader, steps a MsgHeartbeatResp for each follower whose response the
// kernel recorded (offload.Follower.Ack) but whose messages the transport has not delivered
// for ackAfter; called before each Tick. etcd-raft's CheckQuorum counts a follower active
// when a response reached Step within the election timeout, in ticks: under CPU starvation
// the transport's receiving goroutine waited for a CPU while the Ready loop kept ticking, and
// the leader stepped down although both followers had answered in time (section 14,
// "CheckQuorum under starvation"). The synthesized response says what the kernel saw - that
// follower answered a heartbeat of this term - without a context (it confirms no ReadIndex);
// etcd-raft marks the follower active and, if it is behind, sends it an append, as it does
// for the real response, which still comes later through the transport.
func (n *Node) offloadAcks(ctx context.Context) {
	f := n.fol
	if f == nil || n.lastState != raft.StateLeader {
		return
	}
	for id := range f.peers {
		if id == n.cfg.ID {
			continue
		}
		t := n.tr.LastHeard(id)
		if !t.IsZero() && time.Since(t) < f.ackAfter {
			continue // the transport keeps up with this follower: nothing to read
		}
		a, ok, err := f.k.Ack(id)
		if err != nil {
			n.log.Debug("raft offload: read follower ack", "peer", id, "err", err)
			continue
		}
		var heard int64
		if !t.IsZero() {
			heard = int64(offload.Monotonic() - time.Since(t))
		}
		if !ackToStep(a, ok, n.termDurable, f.acked[id], heard) {
			continue
		}
		f.acked[id] = a.Count
		m := &pb.Message{Type: pb.MsgHeartbeatResp.Enum(), From: proto.Uint64(id), To: proto.Uint64(n.cfg.ID),
			Term: proto.Uint64(n.termDurable)}
		if err := n.rn.Step(ctx, m); err != nil && ctx.Err() == nil {
			n.log.Debug("raft offload: step recorded ack", "peer", id, "err", err)
			continue
		}
		f.ackFed.Inc()
	}
}

// offloadQuorum keeps the quorum wait's voters equal to etcd-raft's configuration and, as
// leader, steps for each voter whose responses the kernel absorbed since the last tick one
// MsgAppResp carrying the highest index it acknowledged: what stepping each absorbed response
// leaves (Progress.MaybeUpdate only moves forward; RecentActive is set), a tick later. The
// program absorbs only responses that move neither the commit index nor, at once, anything
// else etcd-raft needs (docs/raft.md "Electrode: broadcast and quorum wait"); called before
// each Tick, so CheckQuorum sees a follower active whose responses were all absorbed.
func (n *Node) offloadQuorum(ctx context.Context) {
	f := n.fol
	if f == nil {
		return
	}
	n.mu.Lock()
	cs := n.confState
	n.mu.Unlock()
	if cs != f.cs {
		var voters []uint64
		if !f.quorumOff {
			voters = quorumVoters(cs, n.cfg.ID)
		}
		if err := f.k.SetVoters(voters); err != nil {
			n.log.Warn("raft offload: quorum wait voters", "err", err)
			return
		}
		f.cs, f.voters = cs, voters
		f.appTerm = 0 // the program's records start over
	}
	if len(f.voters) == 0 || n.lastState != raft.StateLeader {
		return
	}
	term, vs, err := f.k.Quorum()
	if err != nil {
		n.log.Debug("raft offload: read the quorum wait's records", "err", err)
		return
	}
	if term != n.termDurable {
		return // made at another term (or none yet): not this leader's acknowledgements
	}
	if term != f.appTerm {
		clear(f.appFed)
		f.appTerm = term
	}
	for _, v := range vs {
		if v.Absorbed == f.appFed[v.ID] {
			continue
		}
		m := &pb.Message{Type: pb.MsgAppResp.Enum(), From: proto.Uint64(v.ID), To: proto.Uint64(n.cfg.ID),
			Term: proto.Uint64(term), Index: proto.Uint64(v.Index)}
		if err := n.rn.Step(ctx, m); err != nil && ctx.Err() == nil {
			n.log.Debug("raft offload: step the quorum wait's record", "peer", v.ID, "err", err)
			continue
		}
		f.appFed[v.ID] = v.Absorbed
		f.appFedC.Inc()
	}
}

// quorumVoters are the voters of cs other than self, in order, for the quorum wait: none
// (the wait off) in a joint configuration, whose commit needs two majorities, or when self
// is not a voter (its own acknowledgement is what the program counts on), or with more than
// the program tracks.
func quorumVoters(cs *pb.ConfState, self uint64) []uint64 {
	if len(cs.GetVotersOutgoing()) > 0 || !slices.Contains(cs.GetVoters(), self) {
		return nil
	}
	var vs []uint64
	for _, id := range cs.GetVoters() {
		if id != self {
			vs = append(vs, id)
		}
	}
	if len(vs) > offload.MaxVoters {
		return nil
	}
	slices.Sort(vs)
	return vs
}

// ackToStep reports whether a leader of term steps the kernel's record a of a follower's
// heartbeat responses: one was recorded (ok) at this term, since the count fed last (fed),
// and after the last message the transport delivered from that follower (heardNs,
// CLOCK_MONOTONIC ns; 0: none).
func ackToStep(a offload.Ack, ok bool, term, fed uint64, heardNs int64) bool {
	return ok && a.Term == term && a.Count != fed && int64(a.Arrival) > heardNs
}

// offloadAlive refreshes the alive deadline from the persist/apply loop: at most every quarter
// of the bound, so a busy loop does not make a system call per Ready.
func (n *Node) offloadAlive() {
	f := n.fol
	if f == nil {
		return
	}
	now := offload.Monotonic()
	if now-f.lastAlive < f.aliveFor/4 {
		return
	}
	if err := f.k.Alive(); err != nil {
		n.log.Warn("raft offload: refresh alive deadline", "err", err)
		return
	}
	f.lastAlive = now
}

// offloadMirror gives the kernel the durable term, its leader and the end of the durable log;
// called after the Ready's HardState and entries are saved, before its messages are sent
// (tick false), and on every tick (tick true), which writes what a Ready left behind
// (mirrorWrite).
func (n *Node) offloadMirror(term, lead uint64, tick bool) {
	f := n.fol
	if f == nil {
		return
	}
	// A leader mirrors itself: its program then answers no heartbeat (none comes from
	// itself) and passes every pre-vote up (prevote.h RAFT_PV_PASS_LEADER), where
	// etcd-raft's leader ignores it while its lease holds. Mirrored as "no leader" (as
	// before), its XDP granted a follower's pre-vote for a higher term: with the
	// candidate's own, a quorum of a 3-node cluster, and the real election that followed
	// deposed the live leader (the false elections under stress, docs/raft.md section 12).
	d := offload.Durable{Term: term, Leader: lead}
	if lead != 0 {
		d.LeaderAddr = f.peers[lead]
	}
	if lead != 0 && lead != n.cfg.ID {
		if f.detLead != lead {
			f.detLead, f.detAfter = lead, detectAfter(f.detect, n.cfg.ID, lead, f.peers)
		}
		d.DetectAfter = f.detAfter
	}
	if tick || !f.endKnown {
		last, err := n.st.LastIndex()
		if err == nil {
			f.end.index = last
			f.end.term, err = n.st.Term(last)
		}
		if err != nil {
			f.endKnown = false
			n.log.Warn("raft offload: read the durable log's end", "err", err)
			return
		}
		f.endKnown = true
	}
	d.LastIndex, d.LastTerm = f.end.index, f.end.term
	if !mirrorWrite(f.mirror, d, f.mirrored, tick, n.cfg.ID) {
		return
	}
	if err := f.k.Mirror(d); err != nil {
		n.log.Warn("raft offload: mirror durable state", "err", err)
		return
	}
	f.mirror, f.mirrored = d, true
}

// logEnd is the last index of a log and its term.
type logEnd struct{ index, term uint64 }

// saved moves the durable log's end after a Ready was saved: etcd-raft's unstable entries
// are a suffix of its log, so the last one of a Ready is the end after the save (a conflict
// truncates the storage after it); a snapshot makes the next mirror read the storage.
func (f *follower) saved(rd *raft.Ready) {
	if f == nil {
		return
	}
	switch {
	case !raft.IsEmptySnap(rd.Snapshot):
		f.endKnown = false
	case len(rd.Entries) > 0:
		e := rd.Entries[len(rd.Entries)-1]
		f.end = logEnd{e.GetIndex(), e.GetTerm()}
	}
}

// mirrorWrite reports whether the durable state d is written to the kernel, which holds cur
// (held: anything was written), at a Ready (tick false) or a tick (tick true) of a node whose
// id is self. Everything the program answers heartbeats by (term, leader, its address, the
// detector's timeout) and a change of the log's last term or a shorter log go at once. The
// growth of the log alone - LastIndex moves with every append, so writing it after each
// Ready made a map update per Ready on every node (docs/raft.md section 12, "The fault-free
// path") - goes:
//   - never while self leads: its program passes every pre-vote up (prevote.h
//     RAFT_PV_PASS_LEADER) and reads no log end; a step down changes the leader and writes
//     the log end of then;
//   - on a follower, at the next tick. Until then the kernel holds a shorter log than the
//     durable one (never a longer one: d is read after the save). Its only reader is the
//     pre-vote, which grants nothing while the leader's last word is less than an election
//     timeout (>= 2 ticks) old - and the entries came with a word - so the tick writes them
//     first unless the Ready loop misses its ticks for that long; then the program could grant
//     a candidate missing those entries a pre-vote user space would refuse. That changes no
//     state, and the real vote stays with etcd-raft on the real log: liveness, not safety.
func mirrorWrite(cur, d offload.Durable, held, tick bool, self uint64) bool {
	if !held {
		return true
	}
	if cur == d {
		return false
	}
	grown := cur
	grown.LastIndex = d.LastIndex
	if grown != d || d.LastIndex < cur.LastIndex {
		return true
	}
	return tick && d.Leader != self
}

// offloadPending tells the kernel that the node has taken term and is about to fsync it
// (called before the Ready that carries it is saved): the program then passes pre-votes up to
// that term to user space instead of granting them from the older durable term. Without it,
// a candidate whose own vote took 13 ms to fsync granted, from its XDP, the pre-vote of the
// next follower's detector for the same term: two candidates of one term, a split vote and a
// second election.
func (n *Node) offloadPending(term uint64) {
	if n.fol == nil {
		return
	}
	if err := n.fol.k.Pending(term); err != nil {
		n.log.Warn("raft offload: announce pending term", "err", err)
	}
}

// Failure detector timing (docs/raft.md section 14): the first follower after the leader
// (ids in ascending order, wrapping) wakes detectMargin after the election timeout, the next
// one detectStagger(T) later, and so on. The margin covers the spread of one heartbeat's
// arrivals at the followers (the voter's lease, in XDP and in etcd-raft, must have run out
// when the pre-vote arrives); the stagger is more than a pre-vote and vote round with its
// fsyncs (2 ms was too short under load), so that two followers do not split the vote.
// etcd-raft's own randomized timer ([T, 2T) ticks) still runs behind it.
const detectMargin = time.Millisecond

func detectStagger(et time.Duration) time.Duration { return max(et/4, 5*time.Millisecond) }

// detectAfter is self's detector timeout while leader leads, et the election timeout.
func detectAfter(et time.Duration, self, leader uint64, peers map[uint64]netip.AddrPort) time.Duration {
	rank := 0
	for id := range peers {
		// the followers before self, going up from the leader and wrapping (unsigned)
		if id != leader && id != self && id-leader-1 < self-leader-1 {
			rank++
		}
	}
	return et + detectMargin + time.Duration(rank)*detectStagger(et)
}

// onLeaderSilent handles a failure-detector wake-up: if the node still follows that leader in
// that term, nothing newer was answered in the kernel and user space heard nothing from the
// leader either, it starts a pre-vote now (PreVote is on: Campaign begins with one) instead of
// waiting for its own election timer.
func (n *Node) onLeaderSilent(ctx context.Context, ev offload.Event) {
	f := n.fol
	stale := func(why string) {
		n.events.add(api.Event{AtNs: int64(ev.Fired), Kind: api.EventDetector, Term: ev.Term, Leader: ev.Leader,
			HeardNs: int64(ev.LastArrival), Detail: "stale: " + why})
		f.wakeups.WithLabelValues("stale").Inc()
		n.log.Debug("raft offload: leader-silent event ignored", "why", why, "leader", ev.Leader, "term", ev.Term)
	}
	// A pre-candidate of the same term is the node whose own etcd-raft timer fired first:
	// its ticks count the election timeout to within a tick, so its pre-vote may have gone
	// out before the voters' leases ran out (XDP's is exact: T after the last heartbeat) and
	// been ignored. The detector fires after the leases: ask again now rather than after
	// another randomized timeout.
	if !silenceCalls(ev, f.mirror.Term, n.leader.Load(), n.lastState) {
		stale("leader or term changed")
		return
	}
	hb, err := f.k.Heartbeat()
	if err != nil || hb.Arrival != ev.LastArrival {
		stale("newer heartbeat")
		return
	}
	// The checks above are the Ready loop's view, which lags etcd-raft's own: a vote request
	// the transport stepped meanwhile may have moved it on (it voted for another candidate in
	// a newer term). Campaigning then, from that newer term, deposed the candidate it had just
	// elected (a second election after a failover).
	if s := n.rn.Status(); !silenceCalls(ev, s.GetTerm(), s.Lead, s.RaftState) {
		stale("etcd-raft moved on")
		return
	}
	if w := f.lastWord(ev.Leader); w > 0 {
		// An append (TCP: the program does not see it) came after the last heartbeat:
		// look again when this node's slot after it has passed, as the kernel would have.
		since := offload.Monotonic() - time.Duration(w)
		if wait := slotWait(since, detectAfter(f.detect, n.cfg.ID, ev.Leader, f.peers)); wait > 0 {
			stale("leader heard in user space")
			f.recheck.Reset(wait)
			f.recheckEv = ev
			return
		}
	}
	n.events.add(api.Event{AtNs: int64(ev.Fired), Kind: api.EventDetector, Term: ev.Term, Leader: ev.Leader,
		HeardNs: int64(ev.LastArrival), Detail: "campaign"})
	f.wakeups.WithLabelValues("campaign").Inc()
	n.log.Info("raft offload: leader silent, starting a pre-vote", "leader", ev.Leader, "term", ev.Term,
		"silent_for", ev.Fired-ev.LastArrival)
	if err := n.rn.Campaign(ctx); err != nil && ctx.Err() == nil {
		n.log.Warn("raft offload: campaign", "err", err)
	}
}

// transportIn is what the transport steps received messages into: etcd-raft, with a vote
// request first judged against CheckQuorum's lease in real time (judgeLease).
type transportIn struct{ n *Node }

func (t transportIn) Step(ctx context.Context, m *pb.Message) error {
	t.n.judgeLease(m)
	f := t.n.fol
	if f == nil || !resetsLease(m, f.k.Term()) {
		return t.n.rn.Step(ctx, m)
	}
	// The leader's last word, for the program's pre-vote lease (prevote.h) and the node's
	// judges (lastWord): stored before etcd-raft takes the message, so the kernel never
	// knows less than etcd-raft, and again after, so the kernel's lease runs at least the
	// election timeout from when etcd-raft restarted its own (Step may wait for the raft
	// goroutine). A receiving goroutine that is starved before it gets here makes the word
	// later than the arrival, never earlier: the kernel then refuses longer, not less.
	t.n.heard(f)
	err := t.n.rn.Step(ctx, m)
	t.n.heard(f)
	if err == nil {
		f.since.stepped(m.GetFrom(), m.GetTerm())
	}
	return err
}

// resetsLease reports whether etcd-raft's follower restarts its CheckQuorum lease on m
// (electionElapsed = 0: an append, heartbeat or snapshot from a leader, at its term or a
// newer one). term is the mirrored durable term: a message below it is one etcd-raft ignores
// (it answers a deposed leader with its newer term). The mirror may lag etcd-raft's term, so
// a message between the two counts although etcd-raft ignores it: the kernel refuses more,
// for at most one election timeout.
func resetsLease(m *pb.Message, term uint64) bool {
	switch m.GetType() {
	case pb.MsgApp, pb.MsgHeartbeat, pb.MsgSnap:
		return m.GetTerm() >= term
	}
	return false
}

// heard stores now as the leader's last word.
func (n *Node) heard(f *follower) {
	if err := f.k.Heard(offload.Monotonic()); err != nil {
		n.log.Warn("raft offload: record the leader's last word", "err", err)
	}
}

// lastWord is when the node last heard from leader, in CLOCK_MONOTONIC ns (0: never): the
// later of the program's heartbeat record of leader and the last word user space stored
// (transportIn.Step). It is the one definition of "heard" behind every judge of the leader's
// silence - the program's pre-vote lease (prevote.h raft_pv_heard, the same maximum),
// judgeLease, the detector's second look (onLeaderSilent), holdEarlyPreVotes and the election
// record - so that none of them calls a leader silent that another still hears. The word is
// not tied to a leader (a message of a newer leader counts for the old one until the mirror
// moves): it can only make the judges see the leader as heard more recently.
func (f *follower) lastWord(leader uint64) int64 {
	w := int64(f.k.Word())
	if hb, err := f.k.Heartbeat(); err == nil && hb.Leader == leader && int64(hb.Arrival) > w {
		w = int64(hb.Arrival)
	}
	return w
}

func (t transportIn) ReportUnreachable(id uint64) { t.n.rn.ReportUnreachable(id) }

func (t transportIn) ReportSnapshot(id uint64, s raft.SnapshotStatus) { t.n.rn.ReportSnapshot(id, s) }

// judgeLease lets a vote request (MsgVote, or a MsgPreVote the program passed up) past
// etcd-raft's CheckQuorum lease when the lease is over in real time (forceIfLeaseOver); with
// the follower path only. Called from the transport's receivers.
func (n *Node) judgeLease(m *pb.Message) {
	f := n.fol
	if f == nil || (m.GetType() != pb.MsgVote && m.GetType() != pb.MsgPreVote) {
		return
	}
	lead := n.leader.Load()
	if lead == 0 || lead == n.cfg.ID {
		return
	}
	heard, now := n.heardNs(lead), offload.Monotonic()
	if !forceIfLeaseOver(m, lead, n.cfg.ID, heard, now, f.detect) {
		return
	}
	f.leaseOver.Inc()
	n.events.add(api.Event{AtNs: int64(now), Kind: api.EventLease, Term: m.GetTerm(), Leader: lead, Peer: m.GetFrom(),
		HeardNs: heard, Detail: m.GetType().String()})
}

// campaignTransfer is etcd-raft's context of a vote request that skips the voter's lease
// (raft.campaignTransfer, unexported).
var campaignTransfer = []byte("CampaignTransfer")

// forceIfLeaseOver judges CheckQuorum's lease for a vote request m in real time and on the
// record the program judges pre-votes by (prevote.h): the lease of a follower of lead is
// over when lead's last heartbeat (heardNs, CLOCK_MONOTONIC: answered in the kernel or passed
// up to the transport) is an election timeout et or more before now. etcd-raft judges it in
// ticks (electionElapsed < electionTimeout), and its ticks run behind real time: Go's ticker
// drops the ticks that come while the Ready loop is busy (an fsync is longer than a 1 ms
// tick), and the kernel's heartbeats are stepped at the next tick after they arrive. It also
// restarts the count on an append (TCP), which the program does not see. Either way a voter
// whose kernel had granted a candidate's pre-vote then ignored the same candidate's real vote,
// and the failover waited for a second election (docs/raft.md section 14, "The voter's
// lease"). When the lease is over, m gets etcd-raft's transfer context, the one input that
// makes its Step skip the lease check (nothing else reads it for a vote request: the term,
// the log comparison and the durable vote are etcd-raft's as before), and it returns true.
// While the lease holds, m is left to etcd-raft, which ignores it unless its own count says
// the lease is over too. A request that already has a context (a leader transfer) is left
// as it is.
func forceIfLeaseOver(m *pb.Message, lead, self uint64, heardNs int64, now, et time.Duration) bool {
	if (m.GetType() != pb.MsgVote && m.GetType() != pb.MsgPreVote) || len(m.GetContext()) != 0 ||
		lead == 0 || lead == self || heardNs <= 0 || time.Duration(int64(now)-heardNs) < et {
		return false
	}
	m.Context = campaignTransfer
	return true
}

// slotWait is how long a node whose slot after the leader's last word is slot must still
// wait when that word is since old (<= 0: the slot has passed). The detector's campaign and
// holdEarlyPreVotes judge by the same slot: until session 7 the campaign looked at the
// election timeout instead, so an append between T and the slot before the detector's event
// made it campaign and holdEarlyPreVotes then dropped its pre-votes - the failover waited for
// etcd-raft's own timer or the next follower's slot (5 ms at a 10 ms timeout).
func slotWait(since, slot time.Duration) time.Duration { return slot - since }

// silenceCalls reports whether a leader-silent event still calls for a campaign in a node of
// term that follows lead in state: it follows the silent leader in the event's term, or it is
// a pre-candidate of that term (its own timer fired first, onLeaderSilent).
func silenceCalls(ev offload.Event, term, lead uint64, state raft.StateType) bool {
	return term == ev.Term && (lead == ev.Leader || (lead == 0 && state == raft.StatePreCandidate))
}

// holdEarlyPreVotes drops the pre-votes of a campaign etcd-raft's own timer started before
// this node's detector slot (detectAfter) after the last word from leader. Its ticks count
// the election timeout to within a tick and are randomized over [T, 2T): early, the voters'
// leases still hold and the pre-votes are ignored; later, they race the detector of the
// follower ranked before this one and split the vote. Held, the node waits as a
// pre-candidate (granting others' pre-votes) until its detector fires and onLeaderSilent
// campaigns again. Dropping a pre-vote is what a lossy network does: liveness only.
func (n *Node) holdEarlyPreVotes(msgs []*pb.Message, prevLead uint64) []*pb.Message {
	f := n.fol
	if f == nil || prevLead == 0 || prevLead == n.cfg.ID || n.lastState != raft.StatePreCandidate {
		return msgs
	}
	heard := n.heardNs(prevLead)
	if heard == 0 || slotWait(time.Duration(int64(offload.Monotonic())-heard), detectAfter(f.detect, n.cfg.ID, prevLead, f.peers)) <= 0 {
		return msgs
	}
	out := msgs[:0]
	held := 0
	for _, m := range msgs {
		if m.GetType() == pb.MsgPreVote {
			held++
			continue
		}
		out = append(out, m)
	}
	if held > 0 {
		f.wakeups.WithLabelValues("held").Inc()
		n.events.add(api.Event{Kind: api.EventDetector, Term: n.termDurable, Leader: prevLead, HeardNs: heard,
			Detail: "held: etcd-raft's timer fired before this node's detector slot"})
	}
	return out
}

// dropSynthResps removes the answers to synthesized heartbeats from msgs (in place).
func dropSynthResps(msgs []*pb.Message) []*pb.Message {
	out := msgs[:0]
	for _, m := range msgs {
		if !isSynthResp(m) {
			out = append(out, m)
		}
	}
	return out
}

func (n *Node) closeOffload() error {
	if n.fol == nil {
		return nil
	}
	return n.fol.k.Close()
}

// OffloadMode describes the follower kernel path ("" when off).
func (n *Node) OffloadMode() string {
	if n.fol == nil {
		return ""
	}
	return n.fol.k.Mode() + " on " + n.fol.k.Interface()
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
