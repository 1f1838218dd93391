package kernelpaths

import (
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
)

// The mirror: the node writes what the kernel program needs of etcd-raft's state (term,
// leader, log end, liveness) into its maps after each Ready.

// offloadAlive refreshes the alive deadline from the persist/apply loop: at most every quarter
// of the bound, so a busy loop does not make a system call per Ready.
func (o *Offload) offloadAlive() {
	f := o.fol
	if f == nil {
		return
	}
	if offload.Monotonic()-f.lastAlive < f.aliveFor/4 {
		return
	}
	o.offloadAliveNow()
}

// offloadAliveNow refreshes the alive deadline now (to now + the alive bound in force).
func (o *Offload) offloadAliveNow() {
	f := o.fol
	if f == nil {
		return
	}
	now := offload.Monotonic()
	if err := f.k.Alive(); err != nil {
		o.log.Warn("raft offload: refresh alive deadline", "err", err)
		return
	}
	f.lastAlive = now
}

// offloadMirror gives the kernel the durable term, its leader and the end of the durable log;
// called after the Ready's HardState and entries are saved, before its messages are sent
// (tick false), and on every tick (tick true), which writes what a Ready left behind
// (mirrorWrite).
func (o *Offload) offloadMirror(term, lead uint64, tick bool) {
	f := o.fol
	if f == nil {
		return
	}
	// A leader mirrors itself: its program then answers no heartbeat (none comes from
	// itself) and passes every pre-vote up (prevote.h RAFT_PV_PASS_LEADER), where
	// etcd-raft's leader ignores it while its lease holds. Mirrored as "no leader" (as
	// before), its XDP granted a follower's pre-vote for a higher term: with the
	// candidate's own, a quorum of a 3-node cluster, and the real election that followed
	// deposed the live leader (the false elections under stress, docs/raft.md section 12).
	o.clearGone(term, lead) // a gone leader heard again (gone.go)
	d := offload.Durable{Term: term, Leader: lead}
	if lead != 0 {
		d.LeaderAddr = f.peers[lead]
	}
	if lead != 0 && lead != o.self {
		if f.detLead != lead {
			f.detLead, f.detAfter = lead, detectAfter(f.detect, o.self, lead, f.peers)
		}
		d.DetectAfter = f.detAfter
	}
	if tick || !f.endKnown {
		last, err := o.st.LastIndex()
		if err == nil {
			f.end.index = last
			f.end.term, err = o.st.Term(last)
		}
		if err != nil {
			f.endKnown = false
			o.log.Warn("raft offload: read the durable log's end", "err", err)
			return
		}
		f.endKnown = true
	}
	d.LastIndex, d.LastTerm = f.end.index, f.end.term
	if !mirrorWrite(f.mirror, d, f.mirrored, tick, o.self) {
		return
	}
	if err := f.k.Mirror(d); err != nil {
		o.log.Warn("raft offload: mirror durable state", "err", err)
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
func (o *Offload) offloadPending(term uint64) {
	if o.fol == nil {
		return
	}
	if err := o.fol.k.Pending(term); err != nil {
		o.log.Warn("raft offload: announce pending term", "err", err)
	}
}
