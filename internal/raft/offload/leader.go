// leader*.go: the leader's heartbeats, sent by the kernel while a lease holds. A pacer
// consumer (bpf/raft/leader.bpf.c on internal/pacer) sends one MsgHeartbeat per follower
// every interval while user space keeps renewing the lease; a renewal is a store into a
// memory-mapped BPF array (BPF_F_MMAPABLE, Linux 5.5) or, where that is refused, a map
// update. When the lease lapses - the process is stopped, hung, or stuck on its disk - the
// kernel stops at its next tick.

package offload

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/fastexit"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Limits of bpf/raft/leader.h.
const (
	MaxFollowers = int(leaderRaftLeaderConstsRAFT_LEADER_FOLLOWERS)
	MinInterval  = time.Duration(leaderRaftLeaderConstsRAFT_LEADER_MIN_INTERVAL)
	hbFrameLen   = int(leaderRaftLeaderConstsRAFT_HB_FRAME_LEN)
)

// Target is a follower the leader heartbeats.
type Target struct {
	ID   uint64
	Addr netip.AddrPort // its raft address (UDP)
}

// LeaderOptions configure the kernel heartbeat sender.
type LeaderOptions struct {
	ClusterID uint64
	Self      uint64
	// Source is this node's raft address: the heartbeats' source (followers check it).
	Source    netip.AddrPort
	Followers []Target
	// Interval between heartbeat rounds (etcd-raft's heartbeat_ticks * tick; default 10ms).
	Interval time.Duration
	// Lease: how long one renewal keeps the kernel sending (default 10 * Interval; at least
	// 2 * Interval). A wedged leader's followers elect after Lease + their election timeout.
	Lease time.Duration
	// Pacer: the pacer's options. Netns is the node's namespace (-1: the caller's); Name,
	// IfName, Resolution and RateMbit have heartbeat defaults (see NewLeader).
	Pacer pacer.Options
	// Syscall renews the lease with map updates even where the kernel can memory-map it
	// (the fallback path; tests).
	Syscall bool
	// Key is the cluster key (nil: none): every heartbeat is signed as the transport signs
	// (auth.h raft_sign, the kernel channel of auth_seq).
	Key *wire.Key
	// TxSeq, when set, is the kernel channel's auth_seq counter (auth.h raft_tx_seq) of
	// another kernel sender of this node (the follower XDP program), shared so that the
	// node's kernel-sent packets draw from one sequence; nil: the sender's own.
	TxSeq *ebpf.Map
	// Refresh: how often routes and neighbours of the followers are resolved again
	// (default 1s).
	Refresh time.Duration
	Log     *slog.Logger
}

func (o *LeaderOptions) setDefaults() error {
	if o.Interval == 0 {
		o.Interval = 10 * time.Millisecond
	}
	if o.Interval < MinInterval {
		return fmt.Errorf("heartbeat interval %v too short: use at least %v", o.Interval, MinInterval)
	}
	if o.Lease == 0 {
		o.Lease = 10 * o.Interval
	}
	if o.Lease < 2*o.Interval {
		return fmt.Errorf("lease %v shorter than two heartbeat intervals (%v): use a longer lease", o.Lease, 2*o.Interval)
	}
	if len(o.Followers) > MaxFollowers {
		return fmt.Errorf("%d followers: the kernel heartbeat sender takes at most %d (a 7-node cluster)", len(o.Followers), MaxFollowers)
	}
	if !o.Source.Addr().Unmap().Is4() || o.Source.Port() == 0 {
		return fmt.Errorf("heartbeat source %v: kernel heartbeats need an IPv4 raft address with a port", o.Source)
	}
	if o.Refresh == 0 {
		o.Refresh = time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Pacer.Name == "" {
		o.Pacer.Name = "raft-hb"
	}
	if o.Pacer.IfName == "" {
		o.Pacer.IfName = "kedge-hb0"
	}
	// The conveyor (kernels without fq/netem) sends its tick frame round once per
	// resolution while a tick is pending - always, for a leader. A tenth of the interval
	// (at most 1ms) keeps heartbeats within 0.5ms of their time at 1k passes/s, not 10k.
	if o.Pacer.Resolution == 0 {
		o.Pacer.Resolution = min(max(o.Interval/10, 100*time.Microsecond), time.Millisecond)
	}
	if o.Pacer.RateMbit == 0 {
		o.Pacer.RateMbit = 10 // 1ms = a 1250-byte tick frame
	}
	if o.Pacer.Log == nil {
		o.Pacer.Log = o.Log
	}
	return nil
}

// Leader is a running kernel heartbeat sender. It implements the node's heartbeat hook
// (Update, Suppress); Close removes everything it made.
type Leader struct {
	opts  LeaderOptions
	objs  leaderObjects
	p     *pacer.Pacer
	hold  *fastexit.Hold // the helper's duplicates of the pacer's slow files (nil: none)
	nh    *netlink.Handle
	mmap  bool   // lease renewed by memory stores
	lmem  []byte // leader_lease, mapped (mmap mode)
	smem  []byte // leader_state, mapped (mmap mode)
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	cur   leaderRaftLease                    // what user space last wrote (the whole truth in syscall mode)
	slots map[uint64]int                     // follower id -> slot
	supp  atomic.Uint64                      // heartbeats user space did not send
	late  atomic.Uint64                      // heartbeats user space sent because the kernel's round was overdue
	arm   func(deadline time.Duration) error // the pacer's Arm (tests: a recorder)
	done  bool                               // closed: Update and Suppress do nothing
}

// Field offsets in struct raft_lease / raft_follower (leader.h).
var (
	offExpires   = unsafe.Offsetof(leaderRaftLease{}.ExpiresNs)
	offInterval  = unsafe.Offsetof(leaderRaftLease{}.IntervalNs)
	offTerm      = unsafe.Offsetof(leaderRaftLease{}.Term)
	offGen       = unsafe.Offsetof(leaderRaftLease{}.Generation)
	offF         = unsafe.Offsetof(leaderRaftLease{}.F)
	followerSize = unsafe.Sizeof(leaderRaftFollower{})
	offFCommit   = unsafe.Offsetof(leaderRaftFollower{}.Commit)
	offFDport    = unsafe.Offsetof(leaderRaftFollower{}.Dport) // dport+active: one 32-bit word
	offFIfindex  = unsafe.Offsetof(leaderRaftFollower{}.Ifindex)
	offFDmac     = unsafe.Offsetof(leaderRaftFollower{}.Dmac)
)

// HaveMmapableArray reports whether this kernel memory-maps BPF arrays (BPF_F_MMAPABLE,
// Linux 5.5), which makes a lease renewal a memory store instead of a system call.
func HaveMmapableArray() bool {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1, Flags: unix.BPF_F_MMAPABLE})
	if err != nil {
		return false
	}
	m.Close()
	return true
}

// NewLeader loads the sender, starts its pacer in the node's namespace and resolves the
// followers' routes. The lease starts absent: nothing is sent until Update says leader.
func NewLeader(o LeaderOptions) (_ *Leader, err error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	if err := pacer.CheckKernel(); err != nil {
		return nil, err
	}
	l := &Leader{opts: o, slots: map[uint64]int{}, mmap: !o.Syscall && HaveMmapableArray()}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	spec, err := loadLeader()
	if err != nil {
		return nil, fmt.Errorf("load leader heartbeat spec: %w", err)
	}
	if !l.mmap {
		for _, name := range []string{"leader_lease", "leader_state"} {
			spec.Maps[name].Flags &^= unix.BPF_F_MMAPABLE
		}
	}
	if l.p, err = pacer.New(o.Pacer); err != nil {
		return nil, fmt.Errorf("start heartbeat pacer: %w", err)
	}
	l.arm = l.p.Arm
	lopts := &ebpf.CollectionOptions{}
	if o.TxSeq != nil {
		lopts.MapReplacements = map[string]*ebpf.Map{"raft_tx_seq": o.TxSeq}
	}
	if err := l.p.Client().Bind(spec, lopts); err != nil {
		return nil, err
	}
	if err := bpfx.LoadAndAssign("raft leader", spec, &l.objs, lopts); err != nil {
		return nil, err
	}
	if err := l.fillAuth(o.TxSeq == nil); err != nil {
		return nil, err
	}
	if l.mmap {
		if l.lmem, err = mapMemory(l.objs.LeaderLease); err != nil {
			return nil, err
		}
		if l.smem, err = mapMemory(l.objs.LeaderState); err != nil {
			return nil, err
		}
	}
	if o.Pacer.Netns >= 0 {
		l.nh, err = netlink.NewHandleAt(o.Pacer.Netns)
	} else {
		l.nh, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	l.initLease()
	if err := l.writeAll(); err != nil {
		return nil, err
	}
	l.resolveAll()
	if err := l.p.Start(l.objs.LeaderTick); err != nil {
		return nil, fmt.Errorf("start heartbeat pacer: %w", err)
	}
	l.hold = keepForExit("raft kernel heartbeats", o.Log, l.p.SlowFiles(), l.p.Namespace())
	l.stop = make(chan struct{})
	l.wg.Add(1)
	go l.refresher()
	o.Log.Info("raft: kernel heartbeats ready", "backend", l.p.Backend(), "interval", o.Interval, "lease", o.Lease,
		"renewal", l.RenewalMode(), "followers", len(o.Followers), "owner_check", HaveOwnerCheck())
	return l, nil
}

// initLease fills cur from the options: no lease, every follower inactive.
func (l *Leader) initLease() {
	o := l.opts
	src := o.Source.Addr().Unmap().As4()
	l.cur = leaderRaftLease{IntervalNs: uint64(o.Interval), Leader: o.Self, ClusterId: o.ClusterID,
		Saddr: *(*uint32)(unsafe.Pointer(&src[0])), Sport: bpfx.Htons(o.Source.Port()), Nfollowers: uint16(len(o.Followers)),
		OwnerTgid: ownerTgid()}
	for i, f := range o.Followers {
		l.slots[f.ID] = i
		l.cur.F[i].Id = f.ID
		a := f.Addr.Addr().Unmap()
		if a.Is4() {
			b := a.As4()
			l.cur.F[i].Daddr = *(*uint32)(unsafe.Pointer(&b[0]))
		}
		l.cur.F[i].Dport = bpfx.Htons(f.Addr.Port())
	}
}

// initPidNsIno is the inode of the initial pid namespace (PROC_PID_INIT_INO,
// include/linux/proc_ns.h): fixed, whatever /proc is mounted from.
const initPidNsIno = 0xeffffffc

// ownerTgid is this process's id as the initial pid namespace numbers it (bpf_task_from_pid
// looks it up there), or 0 - no owner check, the lease alone stops a dead leader's heartbeats -
// when the process runs in another pid namespace (a container), whose ids the kernel program
// cannot translate.
func ownerTgid() uint32 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil || st.Ino != initPidNsIno {
		return 0
	}
	return uint32(unix.Getpid())
}

// HaveOwnerCheck reports whether the kernel heartbeat sender can see its owner die (the task
// kfuncs bpf_task_from_pid and bpf_task_release, Linux 6.2) and this process runs in the
// initial pid namespace. Without it a killed leader's heartbeats stop when its lease runs out
// or its files close, whichever comes first.
func HaveOwnerCheck() bool {
	if ownerTgid() == 0 {
		return false
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	for _, name := range []string{"bpf_task_from_pid", "bpf_task_release"} {
		var fn *btf.Func
		if err := spec.TypeByName(name, &fn); err != nil {
			return false
		}
	}
	return true
}

// fillAuth writes the cluster id and key the heartbeats are signed with, and (own: the
// sequence is not shared) seeds the kernel channel's auth_seq.
func (l *Leader) fillAuth(own bool) error {
	seq := l.objs.RaftTxSeq
	if !own {
		// Fill seeds the sequence: give it a scratch map, keep the shared one's value.
		scratch, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
		if err != nil {
			return fmt.Errorf("raft auth: %w", err)
		}
		defer scratch.Close()
		seq = scratch
	}
	return wire.AuthMaps{Config: l.objs.RaftAuthCfg, Peers: l.objs.RaftPeers, TxSeq: seq}.Fill(l.opts.ClusterID, l.opts.Key, nil)
}

// RenewalMode is "mmap" (a renewal is a memory store) or "syscall" (a map update).
func (l *Leader) RenewalMode() string {
	if l.mmap {
		return "mmap"
	}
	return "syscall"
}

// Backend is the pacer backend the heartbeats ride.
func (l *Leader) Backend() string { return l.p.Backend() }

func mapMemory(m *ebpf.Map) ([]byte, error) {
	size := int(m.ValueSize()) * int(m.MaxEntries())
	pg := unix.Getpagesize()
	b, err := unix.Mmap(m.FD(), 0, (size+pg-1)/pg*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", m, err)
	}
	return b, nil
}

// writeAll writes the whole lease with expires_ns as it is in cur, expires last (mmap), or
// in one map update.
func (l *Leader) writeAll() error {
	if !l.mmap {
		return l.flush()
	}
	exp := l.cur.ExpiresNs
	l.store64(offExpires, 0)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&l.cur)), unsafe.Sizeof(l.cur))
	copy(l.lmem[8:len(b)], b[8:])
	l.store64(offExpires, exp)
	return nil
}

// flush writes cur with one map update (syscall mode).
func (l *Leader) flush() error {
	if l.mmap {
		return nil
	}
	if err := l.objs.LeaderLease.Update(uint32(0), &l.cur, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("renew heartbeat lease: %w", err)
	}
	return nil
}

func (l *Leader) store64(off uintptr, v uint64) {
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&l.lmem[off])), v)
}

func (l *Leader) store32(off uintptr, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&l.lmem[off])), v)
}

func slotOff(i int, field uintptr) uintptr { return offF + uintptr(i)*followerSize + field }

// setCommit, setExpires, setTerm: one field each (mmap: an atomic store; syscall: cur only,
// flushed by the caller).
func (l *Leader) setCommit(i int, v uint64) {
	l.cur.F[i].Commit = v
	if l.mmap {
		l.store64(slotOff(i, offFCommit), v)
	}
}

func (l *Leader) setExpires(v uint64) {
	l.cur.ExpiresNs = v
	if l.mmap {
		l.store64(offExpires, v)
	}
}

// SetLease changes Lease from the next renewal on (the node's adaptive bound); a lease
// shorter than two intervals is taken as two.
func (l *Leader) SetLease(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.opts.Lease = max(d, 2*l.opts.Interval)
}

// Lease is how long one renewal keeps the kernel sending now (Lease, or SetLease's).
func (l *Leader) Lease() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.opts.Lease
}

// Update is the node's hook, called by its Ready loop on every tick and whenever the
// leadership changes: lead and term are this node's, committed its commit index, match
// each follower's Progress.Match. As leader it renews the lease (now + Lease) and writes
// each follower's Commit = min(match, committed); otherwise it drops the lease at once.
func (l *Leader) Update(lead bool, term, committed uint64, match map[uint64]uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	now := uint64(pacer.Now())
	if !lead || term == 0 {
		if l.cur.ExpiresNs != 0 {
			l.setExpires(0)
			if err := l.flush(); err != nil {
				l.opts.Log.Warn("raft: drop heartbeat lease", "err", err)
			}
		}
		return
	}
	old := l.cur.ExpiresNs
	if term != l.cur.Term {
		// A new leadership: stop, change, publish (leader.h).
		l.setExpires(0)
		l.cur.Term = term
		l.cur.Generation++
		if l.mmap {
			l.store64(offTerm, term)
			l.store64(offGen, l.cur.Generation)
		}
		for i := range l.opts.Followers {
			l.setCommit(i, 0)
		}
		old = 0
	}
	for i, f := range l.opts.Followers {
		if c := min(match[f.ID], committed); c != l.cur.F[i].Commit {
			l.setCommit(i, c)
		}
	}
	l.setExpires(now + uint64(l.opts.Lease))
	if err := l.flush(); err != nil {
		l.opts.Log.Warn("raft: renew heartbeat lease", "err", err)
		return
	}
	// The sender stops when it finds the lease lapsed; a renewal after that (or the first)
	// starts it again. A sender that has not run for two intervals past its next round
	// lost its tick: start it too (Arm coalesces with a tick already armed).
	if old <= now+uint64(l.opts.Interval) || l.stuck(now) {
		if err := l.arm(time.Duration(now)); err != nil {
			l.opts.Log.Warn("raft: start kernel heartbeats", "err", err)
		}
	}
}

// stuck: the kernel's next round is overdue by two intervals (mmap mode only: reading the
// state costs a system call otherwise, and the pacer's watchdog covers lost ticks).
func (l *Leader) stuck(now uint64) bool {
	if !l.mmap {
		return false
	}
	next := atomic.LoadUint64((*uint64)(unsafe.Pointer(&l.smem[unsafe.Offsetof(leaderRaftLeaderState{}.NextNs)])))
	return next != 0 && now > next+2*uint64(l.opts.Interval)
}

// Suppress is the node's hook for each MsgHeartbeat etcd-raft hands out without a context:
// true when the kernel sends that heartbeat (the lease is fresh, in this term, the
// follower's route is resolved, and the kernel's rounds are on time), so user space does
// not send it too.
func (l *Leader) Suppress(to, term uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := uint64(pacer.Now())
	i, ok := l.slots[to]
	if !ok || l.done || l.cur.ExpiresNs <= now || l.cur.Term != term || l.cur.F[i].Active == 0 {
		return false
	}
	if l.overdue(now) {
		l.late.Add(1)
		return false
	}
	l.supp.Add(1)
	return true
}

// overdue: the kernel's next round is more than half an interval past its time (mmap mode
// only: reading the state costs a system call otherwise). Under CPU stress the pacer's tick
// came up to 9 ms late on the 2-vCPU test machine (softirq work waiting for a CPU), so a
// follower saw 11.7 ms without a heartbeat at a 3 ms interval: past a 10 ms election timeout
// plus the detector's 1 ms margin, and its detector started a pre-vote the other follower,
// which had seen the same gap, granted - with the leader alive (docs/raft.md section 12,
// "False elections with the kernel paths, session 7"). While the kernel is late, user space
// sends etcd-raft's heartbeats as it would without the kernel path: the followers get the
// earlier of the two schedules, and a duplicate is answered like any heartbeat.
func (l *Leader) overdue(now uint64) bool {
	if !l.mmap {
		return false
	}
	next := atomic.LoadUint64((*uint64)(unsafe.Pointer(&l.smem[unsafe.Offsetof(leaderRaftLeaderState{}.NextNs)])))
	return next != 0 && now > next+uint64(l.opts.Interval)/2
}

// LeaderStats are the sender's counters (struct raft_leader_stats, summed over CPUs), its
// state, and the heartbeats user space left to it.
type LeaderStats struct {
	Counters   leaderRaftLeaderStats
	State      leaderRaftLeaderState
	Suppressed uint64 // heartbeats etcd-raft produced that user space did not send
	Overdue    uint64 // heartbeats user space sent because the kernel's round was overdue
	Pacer      pacer.Stats
}

// Stats reads the counters.
func (l *Leader) Stats() (LeaderStats, error) {
	var s LeaderStats
	var err error
	if s.Counters, err = bpfx.SumPerCPU[leaderRaftLeaderStats](l.objs.LeaderCounters, uint32(0)); err != nil {
		return s, fmt.Errorf("read heartbeat counters: %w", err)
	}
	if err := l.objs.LeaderState.Lookup(uint32(0), &s.State); err != nil {
		return s, fmt.Errorf("read heartbeat state: %w", err)
	}
	s.Suppressed = l.supp.Load()
	s.Overdue = l.late.Load()
	if l.p == nil {
		return s, nil
	}
	if s.Pacer, err = l.p.Stats(); err != nil {
		return s, err
	}
	return s, nil
}

// Close drops the lease and removes the pacer and the programs.
func (l *Leader) Close() error {
	var errs []error
	if l.stop != nil {
		close(l.stop)
		l.wg.Wait()
		l.stop = nil
	}
	l.mu.Lock()
	l.done = true
	if l.lmem != nil {
		l.setExpires(0)
	}
	for _, b := range [][]byte{l.lmem, l.smem} {
		if b != nil {
			errs = append(errs, unix.Munmap(b))
		}
	}
	l.lmem, l.smem = nil, nil
	l.mu.Unlock()
	errs = append(errs, l.hold.Release()) // first: the pacer's closes below are then the last
	l.hold = nil
	if l.p != nil {
		errs = append(errs, l.p.Close())
		l.p = nil
	}
	errs = append(errs, l.objs.Close())
	if l.nh != nil {
		l.nh.Close()
		l.nh = nil
	}
	return errors.Join(errs...)
}
