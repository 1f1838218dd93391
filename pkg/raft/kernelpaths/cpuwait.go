package kernelpaths

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/prometheus/client_golang/prometheus"
)

// The adaptive bound: with neither Config.AliveBound nor Config.HeartbeatLease set, both
// follow how long the node's threads waited for a CPU. A node whose loop is held by the
// scheduler (spinners, other work on the machine: after its fsync completed it waits,
// runnable, for a CPU) is healthy, and its kernel keeps speaking for it through that wait;
// a node whose loop is held by its disk (asleep in the fsync, not waiting for a CPU) gains
// nothing, and its kernel stops answering for it one floor after its loop's last pass.
// The estimator reads, per interval, the longest wait of any one thread of the process
// (the loop's own thread is one of them; Go moves the loop between threads, so it is not
// told apart). An interval in which a thread waited half of it or more is starvation: the
// bound goes to its ceiling at once, before the loop's first long stall, not after it.
// Otherwise the bound is floor + waitGain x the longest wait. Either holds for the rest of
// the window (two buckets of waitBucket). The rule "a node stuck on its disk stops
// answering for itself within the alive bound" holds with a bound between floor and ceil,
// and on a machine without CPU contention it is the floor (docs/raft.md section 14).
const (
	waitGain   = 4
	waitBucket = 30 * time.Second
	// waitSample: the threads' waits are read at most this often (each read is a pread
	// per thread of /proc/self/task/*/schedstat).
	waitSample = 20 * time.Millisecond
	// MaxAdaptiveBound is the adaptive bound's ceiling (at least the floor): the longest a
	// node whose loop stalls keeps its kernel answering for it, or heartbeating as leader.
	MaxAdaptiveBound = time.Second
)

// adaptiveBound is the estimator: fed (interval, CPU wait in it) pairs, it gives the bound.
type adaptiveBound struct {
	floor, ceil time.Duration
	cur, prev   time.Duration // longest wait of the current and the previous bucket
	rotateAt    time.Duration // when cur becomes prev (Monotonic)
}

func newAdaptiveBound(floor time.Duration) *adaptiveBound {
	return &adaptiveBound{floor: floor, ceil: max(floor, MaxAdaptiveBound)}
}

// observe records that during the interval dt ending at now one of the node's threads
// waited wait for a CPU, the longest of them.
func (a *adaptiveBound) observe(now, dt, wait time.Duration) {
	for now >= a.rotateAt {
		if a.rotateAt == 0 {
			a.rotateAt = now
		}
		a.prev, a.cur = a.cur, 0
		a.rotateAt += waitBucket
	}
	w := min(wait, dt)
	if dt >= waitSample && 2*w >= dt {
		w = a.ceil // starved: the ceiling for the window
	}
	a.cur = max(a.cur, w)
}

// bound is the alive bound and lease now.
func (a *adaptiveBound) bound() time.Duration {
	return min(a.ceil, a.floor+waitGain*max(a.cur, a.prev))
}

// cpuWait reads how long this process's threads waited for a CPU (schedstat's run delay),
// per thread, and gives the longest any one thread waited since the last read.
type cpuWait struct {
	files  map[int]*os.File      // tid -> its schedstat, kept open
	last   map[int]time.Duration // tid -> run delay at the last read
	listAt time.Duration         // when the threads were last listed
	buf    []byte
}

func newCPUWait() *cpuWait {
	return &cpuWait{files: map[int]*os.File{}, last: map[int]time.Duration{}, buf: make([]byte, 128)}
}

// read returns the longest wait of one thread since the last read (a thread seen for the
// first time has none). The thread list is read again at most every second.
func (c *cpuWait) read(now time.Duration) (time.Duration, error) {
	if c.listAt == 0 || now-c.listAt >= time.Second {
		if err := c.list(); err != nil {
			return 0, err
		}
		c.listAt = now
	}
	var longest time.Duration
	for tid, f := range c.files {
		n, err := f.ReadAt(c.buf, 0)
		if n == 0 && err != nil {
			f.Close() // the thread exited
			delete(c.files, tid)
			delete(c.last, tid)
			continue
		}
		d, ok := runDelay(c.buf[:n])
		if !ok {
			continue
		}
		if prev, seen := c.last[tid]; seen && d > prev {
			longest = max(longest, d-prev)
		}
		c.last[tid] = d
	}
	return longest, nil
}

func (c *cpuWait) list() error {
	d, err := os.Open("/proc/self/task")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		tid, err := strconv.Atoi(name)
		if err != nil || c.files[tid] != nil {
			continue
		}
		f, err := os.Open("/proc/self/task/" + name + "/schedstat")
		if err != nil {
			continue // exited meanwhile
		}
		c.files[tid] = f
	}
	return nil
}

func (c *cpuWait) close() {
	for tid, f := range c.files {
		f.Close()
		delete(c.files, tid)
	}
}

// runDelay parses schedstat ("on-cpu-ns run-delay-ns timeslices").
func runDelay(b []byte) (time.Duration, bool) {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(f[1]), 10, 64)
	return time.Duration(v), err == nil
}

// adapt is called from the persist/apply loop (Tick and Advanced): it reads the threads'
// CPU wait at most every waitSample and moves the kernel's alive bound and heartbeat lease
// with the estimator. A no-op when both bounds are set (or the kernel paths are off).
func (o *Offload) adapt() {
	a := o.adaptive
	if a == nil {
		return
	}
	now := offload.Monotonic()
	dt := now - o.waitAt
	if o.waitAt != 0 && dt < waitSample {
		return
	}
	wait, err := o.waits.read(now)
	if err != nil {
		o.log.Warn("raft: read the threads' CPU wait: the kernel paths' bounds stay at their floor", "err", err)
		o.adaptive = nil
		o.setBound(a.floor)
		return
	}
	if o.waitAt != 0 {
		a.observe(now, dt, wait)
	}
	o.waitAt = now
	if b := a.bound(); b != time.Duration(o.bound.Load()) {
		o.setBound(b)
	}
}

// setBound hands the kernel paths a new adaptive bound: the follower program's alive bound
// (unless Config.AliveBound) and the leader's lease (unless Config.HeartbeatLease); the
// change is recorded when it moves by a tenth or more.
func (o *Offload) setBound(b time.Duration) {
	old := time.Duration(o.bound.Swap(int64(b)))
	if f := o.fol; f != nil && o.cfg.AliveBound == 0 {
		f.aliveFor = b
		f.k.SetAliveFor(b)
		if b > old {
			o.offloadAliveNow() // a longer bound holds at once
		}
	}
	if l := o.hbLease; l != nil && o.cfg.HeartbeatLease == 0 {
		l.SetLease(b)
	}
	if d := b - old; d >= old/10 || -d >= old/10 {
		o.event(Event{AtNs: int64(offload.Monotonic()), Kind: EventBound, Term: o.termDurable, BoundNs: int64(b)})
	}
}

// registerBounds exports Bounds as two gauges (0: that path is off), so an operator sees
// the bound in force move with the machine's CPU contention.
func (o *Offload) registerBounds() {
	gauge := func(name, help string, f func() time.Duration) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kedge", Subsystem: "raft", Name: name, Help: help},
			func() float64 { return f().Seconds() })
	}
	o.reg.MustRegister(
		gauge("kernel_alive_bound_seconds", "How long the follower program answers for this node after its loop's last refresh (fixed or adaptive; 0: path off).",
			func() time.Duration { a, _ := o.Bounds(); return a }),
		gauge("kernel_heartbeat_lease_seconds", "How long one renewal keeps the kernel heartbeating for this node as leader (fixed or adaptive; 0: path off).",
			func() time.Duration { _, l := o.Bounds(); return l }))
}
