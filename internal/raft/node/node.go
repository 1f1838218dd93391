// Package node is one kedge raft node: etcd-raft's Node driven through its Ready contract
// over internal/raft/storage, with its transport and kernel paths from the public package
// pkg/raft/kernelpaths (the node is an application of it like any other), a key-value state
// machine, and the HTTP/JSON client API. docs/raft.md sections 1, 2 and 5.
package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/config"
	"github.com/kedge-dev/kedge/internal/raft/storage"
	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Options beyond the config file.
type Options struct {
	// UnsafeLocalReads serves reads from local state without ReadIndex: NOT linearizable.
	// Only for the linearizability checker's self-test (docs/raft.md section 7).
	UnsafeLocalReads bool
	// Offload: the follower's kernel path (heartbeats answered in XDP, leader failure detected
	// by a bpf_timer). Zero: off.
	Offload kernelpaths.Mode
	// OffloadAlive is how long one refresh of the persist/apply loop keeps the follower
	// program answering for the node (0: adaptive, kernelpaths.Config.AliveBound).
	OffloadAlive time.Duration
	// NoQuorumWait, with Offload: the program passes every follower's MsgAppResp up instead of
	// absorbing the ones that move neither its match nor the commit (docs/raft.md "Electrode:
	// broadcast and quorum wait"); for comparisons.
	NoQuorumWait bool
	// NoCloseFailover, with Offload: a follower leaves a leader whose connections all closed
	// to the election timeout (kernelpaths.Config.NoCloseFailover); for comparisons.
	NoCloseFailover bool
	Log             *slog.Logger
	// KernelHeartbeats: as leader, the kernel sends the heartbeats while a lease holds
	// (docs/raft.md "Kernel paths: leader heartbeats"): off, auto (where the kernel allows,
	// else a log line) or on (else New fails). HeartbeatLease is how long one renewal keeps it
	// sending (0: adaptive, as OffloadAlive).
	KernelHeartbeats kernelpaths.Mode
	HeartbeatLease   time.Duration
}

// command is a log entry's payload.
type command struct {
	ID           uint64 `json:"id"`
	Op           string `json:"op"` // put, del, cas
	Key          string `json:"key"`
	Value        string `json:"value,omitempty"`
	Expect       string `json:"expect,omitempty"`
	ExpectAbsent bool   `json:"expect_absent,omitempty"`
}

type snapshotData struct {
	KV map[string]string `json:"kv"`
}

type readWaiter struct {
	index uint64 // 0 until the ReadState arrived
	ch    chan uint64
}

// Node is a running node.
type Node struct {
	cfg  *config.Config
	opts Options
	log  *slog.Logger

	st  *storage.Storage
	rn  raft.Node
	off *kernelpaths.Offload // the transport and the kernel paths
	reg *prometheus.Registry
	m   *metrics

	clientLn net.Listener
	http     *http.Server

	// Owned by the Ready loop; mu guards what request handlers touch.
	mu        sync.Mutex
	kv        map[string]string
	waiters   map[uint64]chan api.WriteResponse
	reads     map[uint64]*readWaiter
	confState *pb.ConfState

	// beforeSend, when set (tests), sees every Ready's messages just before they are sent,
	// with the entries of the Ready being saved meanwhile (nil once the save returned).
	beforeSend func(msgs []*pb.Message, saving []*pb.Entry)

	// The election record (events.go, written by the offload): GET /v1/events and GET
	// /v1/leader.
	events      eventRing
	leaderWatch leaderWatch

	applied   atomic.Uint64
	snapIndex atomic.Uint64
	leader    atomic.Uint64
	done      chan struct{}
	loopErr   error
}

// New opens the data dir, binds the raft and client sockets and starts raft. Run serves.
func New(cfg *config.Config, opts Options) (*Node, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	n := &Node{cfg: cfg, opts: opts, log: opts.Log.With("node", cfg.ID), reg: prometheus.NewRegistry(),
		kv: map[string]string{}, waiters: map[uint64]chan api.WriteResponse{}, reads: map[uint64]*readWaiter{},
		confState: &pb.ConfState{}, done: make(chan struct{})}
	n.m = newMetrics(n.reg)
	st, rec, err := storage.Open(cfg.DataDir, n.log)
	if err != nil {
		return nil, err
	}
	st.FsyncObserver = func(d time.Duration) { n.m.fsync.Observe(d.Seconds()) }
	n.st = st
	if rec.Snapshot != nil {
		if err := n.restore(rec.Snapshot); err != nil {
			st.Close()
			return nil, err
		}
	}
	var peers []kernelpaths.Peer
	for _, p := range cfg.Peers {
		a, err := config.ResolveAddr(p.Raft)
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("resolve peer %d: %w", p.ID, err)
		}
		peers = append(peers, kernelpaths.Peer{ID: p.ID, Addr: a})
	}
	n.off, err = kernelpaths.Open(kernelpaths.Config{ClusterID: cfg.ClusterID, ID: cfg.ID, Peers: peers,
		Bind: cfg.RaftBind(), Key: (*[16]byte)(cfg.ClusterKey), Tick: cfg.Tick, ElectionTicks: cfg.ElectionTicks,
		HeartbeatTicks: cfg.HeartbeatTicks, Follower: opts.Offload, AliveBound: opts.OffloadAlive,
		NoQuorumWait: opts.NoQuorumWait, NoCloseFailover: opts.NoCloseFailover, LeaderHeartbeats: opts.KernelHeartbeats, HeartbeatLease: opts.HeartbeatLease,
		Log: n.log, Registry: n.reg, OnEvent: func(e kernelpaths.Event) { n.events.add(api.Event(e)) }})
	if err != nil {
		st.Close()
		return nil, err
	}
	if n.clientLn, err = net.Listen("tcp", cfg.ClientBind()); err != nil {
		n.off.Close()
		st.Close()
		return nil, fmt.Errorf("listen client api %s: %w (is another node using the port?)", cfg.ClientBind(), err)
	}
	rc := &raft.Config{
		ID:              cfg.ID,
		ElectionTick:    cfg.ElectionTicks,
		HeartbeatTick:   cfg.HeartbeatTicks,
		Storage:         st,
		Applied:         n.applied.Load(),
		MaxSizePerMsg:   cfg.MaxAppendBytes,
		MaxInflightMsgs: cfg.MaxInflight,
		CheckQuorum:     true,
		PreVote:         true,
		ReadOnlyOption:  raft.ReadOnlySafe,
		Logger:          raftLogger{n.log.With("component", "etcd-raft")},
	}
	if rec.Fresh {
		var rp []raft.Peer
		for _, p := range cfg.Peers {
			rp = append(rp, raft.Peer{ID: p.ID})
		}
		n.log.Info("raft: bootstrapping a new node", "peers", len(rp), "data_dir", cfg.DataDir)
		n.rn = raft.StartNode(rc, rp)
	} else {
		n.log.Info("raft: restarting", "data_dir", cfg.DataDir, "snapshot_index", n.snapIndex.Load(),
			"entries", rec.Entries, "term", rec.HardState.GetTerm(), "commit", rec.HardState.GetCommit(), "torn_bytes", rec.TornBytes)
		n.rn = raft.RestartNode(rc)
	}
	if opts.UnsafeLocalReads {
		n.log.Warn("raft: --unsafe-local-reads: reads are served from local state WITHOUT ReadIndex and are NOT linearizable (checker self-test only)")
	}
	if err := n.off.Start(n.rn, st); err != nil {
		n.rn.Stop()
		n.clientLn.Close()
		n.off.Close()
		st.Close()
		return nil, err
	}
	return n, nil
}

// OffloadMode describes the follower kernel path ("xdp-native on eth0"; "" when off).
func (n *Node) OffloadMode() string { return n.off.Mode() }

// ClientAddr is the bound client API address.
func (n *Node) ClientAddr() string { return n.clientLn.Addr().String() }

// Run serves until ctx is done or the Ready loop fails, then shuts down.
func (n *Node) Run(ctx context.Context) error {
	n.http = &http.Server{Handler: n.handler(), ReadHeaderTimeout: 5 * time.Second}
	httpErr := make(chan error, 1)
	go func() { httpErr <- n.http.Serve(n.clientLn) }()
	loopCtx, stopLoop := context.WithCancel(ctx)
	defer stopLoop()
	go n.loop(loopCtx)
	var err error
	select {
	case <-ctx.Done():
	case <-n.done:
		err = n.loopErr
	case err = <-httpErr:
		err = fmt.Errorf("serve client api: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n.http.Shutdown(sctx)
	stopLoop()
	<-n.done
	// The loop no longer reads the kernel's record nor renews its lease: the transport
	// stops, the program stops answering, the kernel sender goes.
	if cerr := n.off.Close(); err == nil && cerr != nil {
		err = cerr
	}
	n.rn.Stop()
	if cerr := n.st.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close storage: %w", cerr)
	}
	if err == nil && n.loopErr != nil {
		err = n.loopErr
	}
	return err
}

// loop is the Ready loop: the only goroutine that writes storage and applies entries.
func (n *Node) loop(ctx context.Context) {
	defer close(n.done)
	tick := time.NewTicker(n.cfg.Tick)
	defer tick.Stop()
	fail := func(err error) {
		n.loopErr = err
		n.log.Error("raft: ready loop stopped", "err", err)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			n.off.Tick(ctx)
		case w := <-n.off.Wakeups():
			n.off.Wake(ctx, w)
		case rd, ok := <-n.rn.Ready():
			if !ok {
				return
			}
			if err := n.handleReady(rd); err != nil {
				fail(err)
				return
			}
			n.rn.Advance()
			n.off.Advanced()
		}
	}
}

// handleReady follows etcd-raft's contract (docs/raft.md section 5) and the kernel paths'
// (pkg/raft/kernelpaths): BeforeSave, persist, AfterSave, send, apply.
func (n *Node) handleReady(rd raft.Ready) error {
	if rd.SoftState != nil {
		old := n.leader.Swap(rd.SoftState.Lead)
		if old != rd.SoftState.Lead {
			n.m.leaderChanges.Inc()
			n.log.Info("raft: leader changed", "from", old, "to", rd.SoftState.Lead, "state", stateName(rd.SoftState.RaftState))
		}
		n.m.isLeader.Set(b2f(rd.SoftState.RaftState == raft.StateLeader))
	}
	// A leader's appends and heartbeats go out before its own fsync (section 5): the
	// followers write an entry while the leader does. So do the proposals and read requests
	// a follower forwards to its leader: they claim nothing about its durable state.
	n.send(n.off.BeforeSave(&rd), rd.Entries)
	// 1. A snapshot from the leader: durable, then the state machine takes it.
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := n.st.ApplySnapshot(rd.Snapshot, rd.HardState); err != nil {
			return fmt.Errorf("save received snapshot: %w", err)
		}
		if err := n.restore(rd.Snapshot); err != nil {
			return err
		}
		n.log.Info("raft: installed snapshot from leader", "index", rd.Snapshot.GetMetadata().GetIndex())
	}
	// 2. Entries and HardState durable. Committed entries are durable on a quorum already:
	// applied now, their writers are answered while this node saves what it appends (etcd's
	// server applies in parallel with its save too); a conf change or a snapshot waits for
	// the save.
	applyEarly := raft.IsEmptySnap(rd.Snapshot) && !hasConfChange(rd.CommittedEntries)
	if applyEarly {
		if err := n.apply(rd.CommittedEntries); err != nil {
			return err
		}
	}
	if err := n.st.Save(rd.HardState, rd.Entries, rd.MustSync); err != nil {
		return fmt.Errorf("save ready: %w", err)
	}
	if rd.HardState != nil {
		n.m.term.Set(float64(rd.HardState.GetTerm()))
		n.m.commit.Set(float64(rd.HardState.GetCommit()))
	}
	// The kernel answers heartbeats of the durable term only, now that it is durable; the
	// answers it sent and early pre-votes leave rd.Messages.
	n.off.AfterSave(&rd)
	if rd.SoftState != nil || rd.HardState != nil {
		n.leaderWatch.changed()
	}
	// 3. Only now the messages.
	n.send(rd.Messages, nil)
	// 4. Apply in order (unless done before the save), then release reads.
	if !applyEarly {
		if err := n.apply(rd.CommittedEntries); err != nil {
			return err
		}
	}
	n.readStates(rd.ReadStates)
	// 5. Snapshot and compaction.
	if applied := n.applied.Load(); applied-n.snapIndex.Load() >= n.cfg.SnapshotEntries {
		if err := n.snapshot(applied); err != nil {
			return err
		}
	}
	return nil
}

// hasConfChange reports whether ents hold a configuration change (applied only after the
// save of the Ready that carries it, as etcd's server waits for its save before one).
func hasConfChange(ents []*pb.Entry) bool {
	for _, e := range ents {
		if t := e.GetType(); t == pb.EntryConfChange || t == pb.EntryConfChangeV2 {
			return true
		}
	}
	return false
}

// send hands msgs to the transport (the kernel takes the heartbeats it sends itself);
// saving are the entries being saved meanwhile (the test hook's).
func (n *Node) send(msgs []*pb.Message, saving []*pb.Entry) {
	if len(msgs) == 0 {
		return
	}
	if n.beforeSend != nil {
		n.beforeSend(msgs, saving)
	}
	n.off.Send(msgs)
}

func (n *Node) apply(ents []*pb.Entry) error {
	for _, e := range ents {
		switch e.GetType() {
		case pb.EntryNormal:
			if len(e.GetData()) > 0 {
				var c command
				if err := decodeCommand(e.GetData(), &c); err != nil {
					// Entries are only written by kedge: a bad one is a bug; skipping it on
					// every node keeps them identical.
					n.log.Error("raft: undecodable entry skipped", "index", e.GetIndex(), "err", err)
				} else {
					n.applyCommand(e.GetIndex(), &c)
				}
			}
		case pb.EntryConfChange:
			var cc pb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return fmt.Errorf("decode conf change at %d: %w", e.GetIndex(), err)
			}
			n.setConfState(n.rn.ApplyConfChange(&cc))
		case pb.EntryConfChangeV2:
			var cc pb.ConfChangeV2
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return fmt.Errorf("decode conf change at %d: %w", e.GetIndex(), err)
			}
			n.setConfState(n.rn.ApplyConfChange(&cc))
		}
		n.applied.Store(e.GetIndex())
	}
	if len(ents) > 0 {
		n.m.applied.Set(float64(n.applied.Load()))
	}
	return nil
}

func (n *Node) setConfState(cs *pb.ConfState) {
	n.mu.Lock()
	n.confState = cs
	n.mu.Unlock()
	n.off.SetConfState(cs)
}

func (n *Node) applyCommand(index uint64, c *command) {
	n.mu.Lock()
	defer n.mu.Unlock()
	res := api.WriteResponse{Index: index}
	cur, found := n.kv[c.Key]
	switch c.Op {
	case "put":
		n.kv[c.Key] = c.Value
		res.OK = true
	case "del":
		delete(n.kv, c.Key)
		res.OK, res.Found = true, found
	case "cas":
		if (c.ExpectAbsent && !found) || (!c.ExpectAbsent && found && cur == c.Expect) {
			n.kv[c.Key] = c.Value
			res.OK = true
		} else {
			res.Found, res.Value = found, cur
		}
	default:
		n.log.Error("raft: unknown command skipped", "index", index, "op", c.Op)
	}
	if ch, ok := n.waiters[c.ID]; ok {
		ch <- res
		delete(n.waiters, c.ID)
	}
}

// readStates records the read indexes raft confirmed and releases the reads whose index is
// applied.
func (n *Node) readStates(rss []raft.ReadState) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, rs := range rss {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		if w := n.reads[binary.BigEndian.Uint64(rs.RequestCtx)]; w != nil && w.index == 0 {
			w.index = rs.Index
		}
	}
	applied := n.applied.Load()
	for id, w := range n.reads {
		if w.index != 0 && w.index <= applied {
			w.ch <- w.index
			delete(n.reads, id)
		}
	}
}

func (n *Node) restore(snap *pb.Snapshot) error {
	var d snapshotData
	if err := json.Unmarshal(snap.GetData(), &d); err != nil {
		return fmt.Errorf("decode snapshot %d: %w", snap.GetMetadata().GetIndex(), err)
	}
	if d.KV == nil {
		d.KV = map[string]string{}
	}
	n.mu.Lock()
	n.kv = d.KV
	n.confState = snap.GetMetadata().GetConfState()
	n.mu.Unlock()
	if n.off != nil { // nil: New restoring the snapshot on disk, before the offload opens
		n.off.SetConfState(snap.GetMetadata().GetConfState())
	}
	n.applied.Store(snap.GetMetadata().GetIndex())
	n.snapIndex.Store(snap.GetMetadata().GetIndex())
	return nil
}

func (n *Node) snapshot(applied uint64) error {
	n.mu.Lock()
	data, err := json.Marshal(snapshotData{KV: n.kv})
	cs := n.confState
	n.mu.Unlock()
	if err != nil {
		return fmt.Errorf("encode snapshot: %w", err)
	}
	if _, err := n.st.CreateSnapshot(applied, cs, data, n.cfg.KeepEntries); err != nil {
		return err
	}
	n.snapIndex.Store(applied)
	n.m.snapshots.Inc()
	n.log.Info("raft: snapshot taken", "index", applied, "bytes", len(data))
	return nil
}

// Errors of the request paths, mapped to HTTP statuses by the handler.
var (
	errNoLeader = errors.New("no leader known")
	errTimeout  = errors.New("request timed out")
)

func newID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1 // never 0
}

// propose commits c and waits until this node applied it.
func (n *Node) propose(ctx context.Context, c *command) (api.WriteResponse, error) {
	c.ID = newID()
	data, err := encodeCommand(c)
	if err != nil {
		return api.WriteResponse{}, err
	}
	ch := make(chan api.WriteResponse, 1)
	n.mu.Lock()
	n.waiters[c.ID] = ch
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.waiters, c.ID)
		n.mu.Unlock()
	}()
	if n.leader.Load() == raft.None {
		n.m.proposals.WithLabelValues("no_leader").Inc()
		return api.WriteResponse{}, errNoLeader
	}
	if err := n.rn.Propose(ctx, data); err != nil {
		if errors.Is(err, raft.ErrProposalDropped) {
			n.m.proposals.WithLabelValues("no_leader").Inc()
			return api.WriteResponse{}, errNoLeader
		}
		n.m.proposals.WithLabelValues("timeout").Inc()
		return api.WriteResponse{}, errTimeout
	}
	select {
	case r := <-ch:
		n.m.proposals.WithLabelValues("ok").Inc()
		return r, nil
	case <-ctx.Done():
		n.m.proposals.WithLabelValues("timeout").Inc()
		return api.WriteResponse{}, errTimeout
	}
}

// get is a linearizable read through ReadIndex (or a local one in the unsafe mode).
func (n *Node) get(ctx context.Context, key string) (api.GetResponse, error) {
	local := func(index uint64) api.GetResponse {
		n.mu.Lock()
		defer n.mu.Unlock()
		v, ok := n.kv[key]
		return api.GetResponse{Key: key, Value: v, Found: ok, Index: index}
	}
	if n.opts.UnsafeLocalReads {
		n.m.reads.WithLabelValues("unsafe_local").Inc()
		return local(n.applied.Load()), nil
	}
	if n.leader.Load() == raft.None {
		n.m.reads.WithLabelValues("no_leader").Inc()
		return api.GetResponse{}, errNoLeader
	}
	id := newID()
	w := &readWaiter{ch: make(chan uint64, 1)}
	n.mu.Lock()
	n.reads[id] = w
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.reads, id)
		n.mu.Unlock()
	}()
	rctx := binary.BigEndian.AppendUint64(nil, id)
	// etcd-raft drops a read index request silently when there is no leader or the leader
	// has not committed in its term yet: ask again every election timeout. Any index
	// confirmed after the request arrived is a valid read point.
	retry := time.NewTicker(time.Duration(n.cfg.ElectionTicks) * n.cfg.Tick)
	defer retry.Stop()
	for {
		if err := n.rn.ReadIndex(ctx, rctx); err != nil {
			n.m.reads.WithLabelValues("timeout").Inc()
			return api.GetResponse{}, errTimeout
		}
		select {
		case idx := <-w.ch:
			n.m.reads.WithLabelValues("ok").Inc()
			return local(idx), nil
		case <-retry.C:
		case <-ctx.Done():
			n.m.reads.WithLabelValues("timeout").Inc()
			return api.GetResponse{}, errTimeout
		}
	}
}

// Status is this node's view (GET /v1/status).
func (n *Node) Status() api.Status {
	s := n.rn.Status()
	last, _ := n.st.LastIndex()
	st := api.Status{ID: n.cfg.ID, ClusterID: n.cfg.ClusterID, State: stateName(s.RaftState), Leader: s.Lead,
		Term: s.GetTerm(), Commit: s.GetCommit(), Applied: n.applied.Load(), LastIndex: last,
		SnapshotIndex: n.snapIndex.Load(), UnsafeLocalReads: n.opts.UnsafeLocalReads, Offload: n.OffloadMode()}
	if alive, lease := n.off.Bounds(); alive > 0 || lease > 0 {
		st.AliveBoundMs, st.HeartbeatLeaseMs = positiveMs(alive), positiveMs(lease)
	}
	if s.RaftState == raft.StateLeader {
		var oldest *float64
		for id, pr := range s.Progress {
			if id == n.cfg.ID {
				continue
			}
			h := n.heardMs(id, true)
			tr, k := n.heardByMs(id, true)
			st.Peers = append(st.Peers, api.PeerStatus{ID: id, Match: pr.Match, Next: pr.Next, State: strings.ToLower(strings.TrimPrefix(pr.State.String(), "State")), LastHeardMs: h,
				TransportHeardMs: tr, KernelHeardMs: k})
			if h != nil && (oldest == nil || *h > *oldest) {
				oldest = h
			}
		}
		st.LastHeartbeatMs = oldest
	} else if s.Lead != raft.None {
		st.LastHeartbeatMs = n.heardMs(s.Lead, false)
		st.TransportHeartbeatMs, st.KernelHeartbeatMs = n.heardByMs(s.Lead, false)
	}
	return st
}

// heardMs is how many milliseconds ago this node last heard peer (nil: never), for Status:
// as follower (peer is the leader) its heartbeats, as leader (leading) peer's heartbeat
// responses, from the transport's and the kernel's record (kernelpaths.Offload.HeardAgo).
func (n *Node) heardMs(peer uint64, leading bool) *float64 {
	age, ok := n.off.HeardAgo(peer, leading)
	if !ok {
		return nil
	}
	v := float64(age.Microseconds()) / 1000
	return &v
}

// heardByMs is heardMs by each record, the transport's and the kernel's (nil: never heard).
func (n *Node) heardByMs(peer uint64, leading bool) (transport, kernel *float64) {
	h := n.off.HeardBy(peer, leading)
	return durMs(h.Transport), durMs(h.Kernel)
}

// positiveMs is d in milliseconds, nil when d is not positive (a path that is off).
func positiveMs(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	return durMs(&d)
}

func durMs(d *time.Duration) *float64 {
	if d == nil {
		return nil
	}
	v := float64(d.Microseconds()) / 1000
	return &v
}

func stateName(s raft.StateType) string {
	switch s {
	case raft.StateFollower:
		return "follower"
	case raft.StateCandidate:
		return "candidate"
	case raft.StatePreCandidate:
		return "pre-candidate"
	case raft.StateLeader:
		return "leader"
	}
	return strings.ToLower(s.String())
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
