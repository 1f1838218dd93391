// Package kernelpaths gives an application built on go.etcd.io/raft/v3 kedge's transport
// and its kernel paths: the small raft messages as single UDP packets (the rest over TCP),
// the follower's heartbeat answers and the leader's failure detection in XDP and a
// bpf_timer, pre-votes judged and packets authenticated before they reach user space, the
// leader's heartbeats sent by the kernel while a lease holds, and the leader's quorum wait
// (docs/raft.md sections 13-16). kedge raft's own node (internal/raft/node) is built on it.
//
// The application keeps its raft.Node, its storage and its state machine. It opens an
// Offload with its cluster's members and raft timing, uses it as its transport, and calls it
// at fixed points of its Ready loop:
//
//	off, err := kernelpaths.Open(kernelpaths.Config{ClusterID: 1, ID: id, Peers: peers,
//		Tick: tick, ElectionTicks: 10, HeartbeatTicks: 1,
//		Follower: kernelpaths.Auto, LeaderHeartbeats: kernelpaths.Auto})
//	rn := raft.StartNode(&raft.Config{ID: id, ElectionTick: 10, HeartbeatTick: 1,
//		Storage: storage, PreVote: true, CheckQuorum: true, ...}, members)
//	off.Start(rn, storage)
//	for {
//		select {
//		case <-ticker.C:
//			off.Tick(ctx) // instead of rn.Tick()
//		case w := <-off.Wakeups():
//			off.Wake(ctx, w) // the kernel saw the leader fall silent
//		case rd := <-rn.Ready():
//			off.Send(off.BeforeSave(&rd))
//			persist(rd.Snapshot, rd.HardState, rd.Entries) // durable before AfterSave
//			off.AfterSave(&rd)
//			off.Send(rd.Messages)
//			apply(rd.CommittedEntries) // ApplyConfChange's result to off.SetConfState
//			rn.Advance()
//			off.Advanced()
//		}
//	}
//
// # The contract
//
// The safety argument of docs/raft.md (sections 13-16) holds for an application that does
// the following; each rule says what breaks without it.
//
//  1. raft.Config has PreVote and CheckQuorum on, the ElectionTick and HeartbeatTick of
//     Config.ElectionTicks and HeartbeatTicks, and synchronous storage writes (no
//     AsyncStorageWrites). The kernel judges pre-votes and leases as etcd-raft does with
//     those settings, in real time at Config.Tick per tick.
//  2. Every member of the cluster runs an Offload with the same ClusterID, Key and member
//     list: the wire format is kedge's (docs/raft.md section 3), not etcd's rafthttp.
//  3. Messages from peers reach raft only through the Offload (Start makes it call
//     rn.Step); messages go out only through Send. The follower program, the node's
//     last-word record and the kernel heartbeat sender each see the traffic they judge by.
//  4. Each Ready is taken in this order: BeforeSave; then the Ready's snapshot, HardState and
//     entries made durable (fsync when rd.MustSync) and appended to the raft.Storage given
//     to Start; then AfterSave; then Send(rd.Messages); then the committed entries applied
//     and Advance. Persist before AfterSave: AfterSave mirrors the durable term into the
//     kernel, which then answers heartbeats of that term for the node - a term mirrored
//     before it is durable would be acknowledged by a node that forgets it in a crash.
//     Send after AfterSave: the kernel must hold the new term before any message of it
//     leaves (the ReadIndex argument, section 14), and AfterSave removes the answers the
//     kernel already sent. Only the messages BeforeSave returns may go before the save.
//     Committed entries are durable on a quorum: they may be applied before the save as
//     well (kedge's node does), except a conf change or with a snapshot in the Ready.
//  5. Tick replaces rn.Tick(), at Config.Tick; a Wakeups value goes to Wake. The Ready loop
//     is one goroutine, and Tick, Wake, BeforeSave, AfterSave, Send and Advanced are called
//     only from it. While the loop runs, Tick and Advanced keep the kernel's deadlines
//     alive; a loop that stops (a hung disk, a stopped process) makes the kernel stop
//     speaking for the node within AliveBound and HeartbeatLease. Do not refresh them from
//     another goroutine: that would keep a stuck node looking alive.
//  6. The result of every rn.ApplyConfChange (and a snapshot's ConfState) goes to
//     SetConfState: the quorum wait counts the current voters. (kedge's own node does not
//     change its membership; the wait turns itself off in a joint configuration.)
//  7. Close after the Ready loop has returned, before rn.Stop.
//
// The kernel paths need root (CAP_BPF and CAP_NET_ADMIN), Linux 5.15 or later for the
// follower program, and a raft address on a real interface (not loopback): with Auto a node
// where one is missing runs with the user-space paths and says so in a log line; On makes
// Open fail (a *kedge.FeatureError when the kernel lacks a feature). The transport alone
// (both modes Off) needs neither.
package kernelpaths
