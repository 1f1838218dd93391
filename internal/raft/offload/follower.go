// Package offload moves kedge raft's small, frequent work into the kernel (docs/raft.md,
// "Kernel paths"). The follower side (this file, bpf/raft/raftxdp.bpf.c): an XDP program on
// the interface of the node's raft address answers the current leader's heartbeats while the
// node is alive, records them in a map the node feeds into etcd-raft, and a bpf_timer wakes
// the node through a ring buffer when the leader falls silent.
//
// Nothing the kernel does is durable, and nothing outlives the process for long: the XDP
// attachment is a bpf_link and the maps are held by file descriptors, none pinned. The link's
// release waits for an RCU grace period, so a duplicate is kept by internal/fastexit's helper:
// a killed node's exit closes its sockets at once, and the helper detaches the program right
// after (the lab test checks that the interface has no XDP program soon after kill -9).
package offload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/fastexit"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/raft/wire"
)

// ErrNoDevice says the raft address is not on an interface the follower program can answer
// from (loopback or an unspecified bind address): offload is off for this node.
var ErrNoDevice = errors.New("raft address is not on an interface XDP can answer from")

// FollowerOptions configure the follower's kernel path.
type FollowerOptions struct {
	ClusterID uint64
	Self      uint64
	// RaftAddr is this node's raft address: the program attaches to the interface that holds
	// the IP and looks at UDP to the port.
	RaftAddr netip.AddrPort
	// Netns is the namespace of that interface (-1: the caller's).
	Netns netns.NsHandle
	// Detect is the silence after the last answered heartbeat that wakes the node (the
	// election timeout); DetectJitter adds uniform [0, jitter) per arming, as etcd-raft
	// randomizes its timeout. Detect 0: no kernel failure detection.
	Detect, DetectJitter time.Duration
	// AliveFor is how long one refresh (Alive) keeps the program answering: the bound within
	// which a stopped, hung or disk-stuck node stops answering for itself.
	AliveFor time.Duration
	// Key is the cluster key (nil: none): packets must carry its MAC, and the program signs
	// its answers with it (bpf/raft/auth.h).
	Key *wire.Key
	// Peers is the allowlist: every other node's id and raft address.
	Peers []wire.AuthPeer
	// PassMark, with a Key, is written over the MAC of every packet the program verified and
	// passes up (bpf/raft/raftxdp.bpf.c mark): give the node's wire.Verifier the same mark
	// before attaching. Zero: packets go up as they came.
	PassMark wire.Mark
	// Mode is the XDP attach mode (default: native, falling back to generic).
	Mode bpfx.XDPMode
	// Syscall records the leader's last word (Heard) with map updates even where the kernel
	// can memory-map the map (tests of the fallback).
	Syscall bool
	Log     *slog.Logger
}

// Heartbeat is the program's record of the leader's heartbeats: the last one of the mirrored
// leader at the mirrored term it saw - answered, or passed up while the alive deadline was
// past (then only Leader, Term and Arrival move: the leader is not silent, the node just did
// not answer for itself).
type Heartbeat struct {
	Leader, Term, Commit uint64        // Commit: the highest answered
	Arrival              time.Duration // CLOCK_MONOTONIC
	Answered             time.Duration // CLOCK_MONOTONIC of the last one answered
	Count                uint64        // answered since load
}

// Event is a ring buffer record: the leader fell silent.
type Event struct {
	Leader, Term uint64
	LastArrival  time.Duration // CLOCK_MONOTONIC of the last heartbeat seen (Heartbeat.Arrival)
	Fired        time.Duration // CLOCK_MONOTONIC when the timer expired
}

// Follower is the loaded and attached follower program.
type Follower struct {
	opts    FollowerOptions
	objs    raftxdpObjects
	link    bpfx.Attachment
	hold    *fastexit.Hold // the helper's duplicate of the link (nil: none)
	ifname  string
	rd      *ringbuf.Reader
	events  chan Event
	wg      sync.WaitGroup
	mu      sync.Mutex // guards st (one writer in practice: the node's loop)
	st      raftxdpRaftxState
	closeMu sync.Once

	// The leader's last word (Heard): wmem is follower_word memory-mapped; without it
	// (wmem nil) word is what the map holds, written with map updates under wordMu.
	wmem   []byte
	word   atomic.Int64
	wordMu sync.Mutex
	term   atomic.Uint64 // the mirrored term (st.Term), read without f.mu
}

// wordAhead is how far ahead of the arrival a map update dates the last word where the map
// cannot be memory-mapped: messages within it cost no system call. Dating it later makes the
// program refuse pre-votes up to wordAhead longer (the safe direction: a refusal changes no
// state); it stays well below the failure detector's margin (1 ms, internal/raft/node), so a
// candidate's first pre-vote after a real failure is not refused for it.
const wordAhead = 250 * time.Microsecond

// Probe reports what the follower program needs from the kernel and this kernel lacks, as a
// *kedge.FeatureError (nil: everything is there).
func Probe() error {
	if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		return bpfx.NotSupported("BPF ring buffer", "5.8", "run with --offload=false", err)
	}
	if err := features.HaveProgramHelper(ebpf.XDP, asm.FnTimerInit); err != nil {
		return bpfx.NotSupported("bpf_timer in XDP programs", "5.15", "run with --offload=false", err)
	}
	if err := features.HaveProgramHelper(ebpf.XDP, asm.FnSpinLock); err != nil {
		return bpfx.NotSupported("bpf_spin_lock in XDP programs", "5.1", "run with --offload=false", err)
	}
	return nil
}

// load loads the program for opts without attaching it (also used by the fixtures).
func load(opts FollowerOptions, objs *raftxdpObjects) error {
	if err := Probe(); err != nil {
		return err
	}
	spec, err := loadRaftxdp()
	if err != nil {
		return fmt.Errorf("load follower program spec: %w", err)
	}
	cfg := raftxdpRaftxConfig{ClusterId: opts.ClusterID, Self: opts.Self, Port: opts.RaftAddr.Port()}
	if opts.Key != nil && *opts.Key != (wire.Key{}) {
		cfg.Mark[0], cfg.Mark[1] = opts.PassMark.Halves()
	}
	if err := spec.Variables[raftxdpVarRaftxCfg].Set(cfg); err != nil {
		return fmt.Errorf("set follower config: %w", err)
	}
	if opts.Syscall || !HaveMmapableArray() {
		spec.Maps["follower_word"].Flags &^= unix.BPF_F_MMAPABLE
	}
	if err := bpfx.LoadAndAssign("raft follower", spec, objs, nil); err != nil {
		return err
	}
	am := wire.AuthMaps{Config: objs.RaftAuthCfg, Peers: objs.RaftPeers, TxSeq: objs.RaftTxSeq}
	if err := am.Fill(opts.ClusterID, opts.Key, opts.Peers); err != nil {
		objs.Close()
		return err
	}
	return nil
}

// NewFollower loads the program, attaches it to the interface of opts.RaftAddr and starts the
// ring buffer reader. The program answers nothing until Mirror and Alive were called.
func NewFollower(opts FollowerOptions) (_ *Follower, err error) {
	ifindex, ifname, veth, err := raftInterface(opts.Netns, opts.RaftAddr.Addr())
	if err != nil {
		return nil, err
	}
	if veth && opts.Mode == bpfx.XDPAuto {
		// A veth delivers what XDP_TX sends only when its peer has an XDP program (or GRO)
		// too; the peer sits in a namespace the node does not see. Generic XDP transmits
		// through the ordinary skb path, which needs nothing from the peer.
		opts.Mode = bpfx.XDPGeneric
	}
	f, err := newFollower(opts)
	if err != nil {
		return nil, err
	}
	f.ifname = ifname
	if f.link, err = bpfx.AttachXDP(f.objs.RaftxXdp, opts.Netns, ifindex, opts.Mode); err != nil {
		f.Close()
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("attach raft follower program to %s: %w (an interface takes one XDP program: is another node or program attached there? use --offload=false for this node)", ifname, err)
		}
		return nil, fmt.Errorf("attach raft follower program to %s: %w", ifname, err)
	}
	f.hold = keepForExit("raft follower", f.opts.Log, []int{bpfx.LinkFD(f.link)})
	f.opts.Log.Info("raft offload: follower program attached", "iface", ifname, "mode", f.link.Mode(),
		"detect", opts.Detect, "detect_jitter", opts.DetectJitter, "alive_for", opts.AliveFor, "last_word", f.WordMode())
	return f, nil
}

// newFollower loads the program and starts the ring buffer reader, without attaching
// (BPF_PROG_TEST_RUN fixtures run it so).
func newFollower(opts FollowerOptions) (_ *Follower, err error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	f := &Follower{opts: opts, events: make(chan Event, 16)}
	if err := load(opts, &f.objs); err != nil {
		return nil, err
	}
	f.st.DetectNs = uint64(opts.Detect)
	f.st.DetectJitterNs = uint64(opts.DetectJitter)
	if f.objs.FollowerWord.Flags()&unix.BPF_F_MMAPABLE != 0 {
		if f.wmem, err = mapMemory(f.objs.FollowerWord); err != nil {
			f.objs.Close()
			return nil, err
		}
	}
	if f.rd, err = ringbuf.NewReader(f.objs.FollowerEvents); err != nil {
		f.Close()
		return nil, fmt.Errorf("open follower event ring: %w", err)
	}
	f.wg.Add(1)
	go f.readEvents()
	return f, nil
}

// Interface is the interface the program is attached to.
func (f *Follower) Interface() string { return f.ifname }

// Mode is the XDP attach mode ("xdp-native" or "xdp-generic").
func (f *Follower) Mode() string {
	if f.link == nil {
		return "detached"
	}
	return f.link.Mode()
}

// CheckAddr says whether the follower program can serve a node whose raft address is addr:
// not on loopback and not unspecified (it answers on the interface that holds the address).
func CheckAddr(addr netip.Addr) error {
	addr = addr.Unmap()
	if !addr.IsValid() || addr.IsUnspecified() || addr.IsLoopback() {
		return fmt.Errorf("raft address %s: %w (give the node a raft address on a real interface, or use --offload=false)", addr, ErrNoDevice)
	}
	return nil
}

// raftInterface finds the interface in ns that holds addr, and whether it is a veth.
func raftInterface(ns netns.NsHandle, addr netip.Addr) (int, string, bool, error) {
	addr = addr.Unmap()
	if err := CheckAddr(addr); err != nil {
		return 0, "", false, err
	}
	var idx int
	var name string
	var veth bool
	err := netnsx.In(ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list interfaces: %w", err)
		}
		for _, l := range links {
			addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				return fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
			}
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
					if l.Attrs().Flags&net.FlagLoopback != 0 {
						return fmt.Errorf("raft address %s is on loopback %s: %w", addr, l.Attrs().Name, ErrNoDevice)
					}
					idx, name, veth = l.Attrs().Index, l.Attrs().Name, l.Type() == "veth"
					return nil
				}
			}
		}
		return fmt.Errorf("raft address %s is on no interface: %w", addr, ErrNoDevice)
	})
	return idx, name, veth, err
}

// Monotonic is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns. It is the Go runtime's clock
// (runtime.nanotime: clock_gettime(CLOCK_MONOTONIC) through the vDSO on Linux, no system
// call), so that the node can read it for every message it receives (transportIn.Step).
// TestMonotonicIsClockMonotonic compares it with the system call.
func Monotonic() time.Duration { return time.Duration(nanotime()) }

// nanotime is the runtime's monotonic clock (linkname kept for compatibility by the runtime).
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Durable is what the node mirrors into the kernel after it is on disk.
type Durable struct {
	Term       uint64         // HardState.Term, fsynced
	Leader     uint64         // the leader of Term etcd-raft knows (0: none; not this node)
	LeaderAddr netip.AddrPort // its raft address (ignored without a leader)
	// LastIndex and LastTerm are the end of the fsynced log (pre-votes are judged on it).
	LastIndex, LastTerm uint64
	// DetectAfter is the failure detector's timeout while Leader leads (0: Detect); the
	// pre-vote lease stays Detect (the election timeout).
	DetectAfter time.Duration
}

// Mirror records the node's durable state. Call it only after what it says is fsynced: the
// program answers heartbeats of exactly this term and pre-votes against this log.
func (f *Follower) Mirror(d Durable) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	term, leader, leaderAddr := d.Term, d.Leader, d.LeaderAddr
	f.st.Term, f.st.Leader = term, leader
	f.term.Store(term)
	f.st.LastIndex, f.st.LastTerm = d.LastIndex, d.LastTerm
	f.st.DetectAfterNs = uint64(d.DetectAfter)
	f.st.LeaderAddr.In6U.U6Addr8 = [16]byte{}
	f.st.LeaderPort = 0
	if leader != 0 {
		a := leaderAddr.Addr()
		if a.Is4() {
			a = netip.AddrFrom16(a.As16()) // v4-mapped, as parse_pkt stores it
		}
		f.st.LeaderAddr.In6U.U6Addr8 = a.As16()
		f.st.LeaderPort = bpfx.Htons(leaderAddr.Port())
	}
	return f.write()
}

// Pending tells the program that user space has taken term (it campaigns, or voted in a newer
// term) and is fsyncing it: pre-votes for terms up to it go to user space, which judges them
// from the state it is making durable (prevote.h, RAFT_PV_PASS_PENDING). Mirror then records
// the term as durable; a pending term at or below the durable one changes nothing.
func (f *Follower) Pending(term uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if term <= f.st.PendingTerm {
		return nil
	}
	f.st.PendingTerm = term
	return f.write()
}

// Alive extends the answering deadline to now + AliveFor. The node calls it from its
// persist/apply loop: a node whose loop stops (process stopped, hung, stuck on the disk)
// stops answering within AliveFor.
func (f *Follower) Alive() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.AliveUntilNs = uint64(Monotonic() + f.opts.AliveFor)
	return f.write()
}

// SetAliveFor changes AliveFor from the next refresh on (the node's adaptive bound).
func (f *Follower) SetAliveFor(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opts.AliveFor = d
}

// Stop makes the program pass every heartbeat to user space (alive deadline in the past).
func (f *Follower) Stop() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.AliveUntilNs = 0
	return f.write()
}

func (f *Follower) write() error {
	if err := f.objs.FollowerState.Update(uint32(0), &f.st, ebpf.UpdateLock); err != nil {
		return fmt.Errorf("write follower state: %w", err)
	}
	return nil
}

// Heartbeat reads the program's heartbeat record (Count 0: none answered yet).
func (f *Follower) Heartbeat() (Heartbeat, error) {
	var hb raftxdpRaftxHb
	if err := f.objs.FollowerHb.LookupWithFlags(uint32(0), &hb, ebpf.LookupLock); err != nil {
		return Heartbeat{}, fmt.Errorf("read follower heartbeat: %w", err)
	}
	return heartbeatOf(hb), nil
}

func heartbeatOf(hb raftxdpRaftxHb) Heartbeat {
	return Heartbeat{Leader: hb.Leader, Term: hb.Term, Commit: hb.Commit, Arrival: time.Duration(hb.LastNs),
		Answered: time.Duration(hb.AnsweredNs), Count: hb.Count}
}

// Heard records that the node heard its leader at arrival (CLOCK_MONOTONIC): a MsgApp,
// MsgHeartbeat or MsgSnap it steps into etcd-raft, each of which resets etcd-raft's
// CheckQuorum lease. The program's pre-vote lease (prevote.h) runs from the later of this and
// its own heartbeat record, so it does not grant a pre-vote that etcd-raft would ignore
// because of a message the program does not see (an append over TCP). The word only moves
// forward (concurrent receivers may call it out of order). Memory-mapped, it is an atomic
// compare-and-swap on the map's memory; otherwise a map update, at most one per wordAhead
// while messages keep coming (the word is then dated up to wordAhead after the arrival).
// Safe for concurrent use.
func (f *Follower) Heard(arrival time.Duration) error {
	if f.wmem != nil {
		p := (*uint64)(unsafe.Pointer(&f.wmem[0]))
		for {
			cur := atomic.LoadUint64(p)
			if uint64(arrival) <= cur || atomic.CompareAndSwapUint64(p, cur, uint64(arrival)) {
				return nil
			}
		}
	}
	if int64(arrival) <= f.word.Load() {
		return nil
	}
	f.wordMu.Lock()
	defer f.wordMu.Unlock()
	if int64(arrival) <= f.word.Load() {
		return nil
	}
	w := raftxdpRaftxWord{LastNs: uint64(arrival + wordAhead)}
	if err := f.objs.FollowerWord.Update(uint32(0), &w, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("record the leader's last word: %w", err)
	}
	f.word.Store(int64(w.LastNs))
	return nil
}

// Term is the mirrored durable term (Mirror), without a lock.
func (f *Follower) Term() uint64 { return f.term.Load() }

// Word is the leader's last word as the program reads it (CLOCK_MONOTONIC; 0: none), without
// a system call.
func (f *Follower) Word() time.Duration {
	if f.wmem != nil {
		return time.Duration(atomic.LoadUint64((*uint64)(unsafe.Pointer(&f.wmem[0]))))
	}
	return time.Duration(f.word.Load())
}

// WordMode is "mmap" (Heard is a memory store) or "syscall" (a map update).
func (f *Follower) WordMode() string {
	if f.wmem != nil {
		return "mmap"
	}
	return "syscall"
}

// Ack is the program's record of one follower's heartbeat responses while this node leads
// (maps.h leader_acks).
type Ack struct {
	Term    uint64        // the term they answered (the node's mirrored term then)
	Arrival time.Duration // CLOCK_MONOTONIC of the last one
	Count   uint64        // recorded since load
}

// Ack reads the record of follower peer; ok is false when none was recorded.
func (f *Follower) Ack(peer uint64) (a Ack, ok bool, err error) {
	var v raftxdpRaftxAck
	if err := f.objs.LeaderAcks.Lookup(peer, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Ack{}, false, nil
		}
		return Ack{}, false, fmt.Errorf("read leader ack of %d: %w", peer, err)
	}
	return Ack{Term: v.Term, Arrival: time.Duration(v.LastNs), Count: v.Count}, true, nil
}

// MaxVoters is how many voters besides this node the quorum wait tracks (maps.h
// RAFTX_QUORUM_MAX); a larger configuration runs without it.
const MaxVoters = len(raftxdpRaftxQuorum{}.V)

// SetVoters gives the quorum wait (maps.h leader_quorum) the voters other than this node,
// from etcd-raft's configuration (at most MaxVoters); nil turns it off (a joint
// configuration, this node not a voter). The records start over at the next response.
func (f *Follower) SetVoters(ids []uint64) error {
	if len(ids) > MaxVoters {
		return fmt.Errorf("quorum wait: %d voters, it tracks at most %d", len(ids), MaxVoters)
	}
	var q raftxdpRaftxQuorum
	q.N = uint32(len(ids))
	for i, id := range ids {
		q.V[i].Id = id
	}
	if err := f.objs.LeaderQuorum.Update(uint32(0), &q, ebpf.UpdateLock); err != nil {
		return fmt.Errorf("write the quorum wait's voters: %w", err)
	}
	return nil
}

// VoterAck is the quorum wait's record of one voter's MsgAppResp at the term of the record.
type VoterAck struct {
	ID       uint64
	Index    uint64 // highest index acknowledged (0: none yet)
	Count    uint64 // responses recorded, passed or absorbed
	Absorbed uint64 // of them absorbed in XDP: etcd-raft has not seen them
}

// Quorum reads the quorum wait's records and the term they were made at (0: none yet).
func (f *Follower) Quorum() (term uint64, voters []VoterAck, err error) {
	var q raftxdpRaftxQuorum
	if err := f.objs.LeaderQuorum.LookupWithFlags(uint32(0), &q, ebpf.LookupLock); err != nil {
		return 0, nil, fmt.Errorf("read the quorum wait's records: %w", err)
	}
	for i := range min(int(q.N), len(q.V)) {
		v := q.V[i]
		voters = append(voters, VoterAck{ID: v.Id, Index: v.Index, Count: v.Count, Absorbed: v.Absorbed})
	}
	return q.Term, voters, nil
}

// Events delivers the failure detector's wake-ups; closed by Close.
func (f *Follower) Events() <-chan Event { return f.events }

func (f *Follower) readEvents() {
	defer f.wg.Done()
	defer close(f.events)
	for {
		rec, err := f.rd.Read()
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				f.opts.Log.Warn("raft offload: follower event ring", "err", err)
			}
			return
		}
		var e raftxdpRaftxEvent
		if len(rec.RawSample) < binary.Size(e) {
			continue
		}
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &e); err != nil {
			continue
		}
		ev := Event{Leader: e.Leader, Term: e.Term, LastArrival: time.Duration(e.LastNs), Fired: time.Duration(e.NowNs)}
		select {
		case f.events <- ev:
		default: // the node has not taken the last one: it wakes for that one anyway
		}
	}
}

// Close detaches the program and releases the maps (the timer dies with its map).
func (f *Follower) Close() error {
	var err error
	f.closeMu.Do(func() {
		err = f.hold.Release() // first: the link's close below is then its last
		if f.link != nil {
			err = errors.Join(err, f.link.Close())
		}
		if f.rd != nil {
			err = errors.Join(err, f.rd.Close())
			f.wg.Wait()
		}
		if f.wmem != nil {
			err = errors.Join(err, unix.Munmap(f.wmem))
			f.wmem = nil
		}
		err = errors.Join(err, f.objs.Close())
	})
	return err
}

// Stats are the program's counters (struct raftx_stats), summed over the CPUs.
func (f *Follower) Stats() ([]bpfx.Counter, error) {
	return readStats(f.objs.FollowerStats)
}

// dropNames names raftx_stats.drop's slots by enum raft_drop (wire.Reason).
func dropNames() []string {
	names := make([]string, 16)
	for i := range names {
		names[i] = wire.Reason(i).String()
	}
	return names
}

func readStats(m *ebpf.Map) ([]bpfx.Counter, error) {
	s, err := bpfx.SumPerCPU[raftxdpRaftxStats](m, uint32(0))
	if err != nil {
		return nil, fmt.Errorf("read follower counters: %w", err)
	}
	return bpfx.Fields(s, "", bpfx.Naming{C: true, Elems: map[string][]string{"drop": dropNames()}})
}

// LoadDetached loads the program without attaching it, for BPF_PROG_TEST_RUN: the fixtures
// here and the offload-on/off equivalence test of internal/raft/node run packets through it
// with Run.
func LoadDetached(opts FollowerOptions) (*Follower, error) { return newFollower(opts) }

// Run runs the program once on frame (BPF_PROG_TEST_RUN) and returns its verdict and the frame
// after it.
func (f *Follower) Run(frame []byte) (uint32, []byte, error) {
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Repeat: 1}
	ret, err := f.objs.RaftxXdp.Run(&opts)
	if err != nil {
		return 0, nil, fmt.Errorf("run follower program: %w", err)
	}
	return ret, opts.DataOut, nil
}

// keepForExit hands duplicates of a kernel path's slow files (links, packet sockets: their
// release waits for an RCU grace period) and its namespaces to internal/fastexit's helper, so
// that a killed node's exit closes its sockets at once instead of after 55-99 ms of grace
// periods (docs/raft.md section 1). Without the helper (it could not start) the node runs
// as before and exits slowly: a warning, not an error.
func keepForExit(what string, log *slog.Logger, fds []int, namespaces ...string) *fastexit.Hold {
	h, err := fastexit.Keep(what, fds, namespaces...)
	if err != nil {
		log.Warn("raft offload: a killed node will close its sockets only after its kernel paths are torn down", "err", err)
		return nil
	}
	return h
}
