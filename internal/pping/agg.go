package pping

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/hist"
)

// HistLayout is the kernel histogram's layout (PP_HIST_* in bpf/include/pping.h, hist.h):
// RTTs in ns, 8 buckets per power of two, linear below 256 ns, open above 2^36 ns (68.7 s).
// The bucket count comes from the generated struct.
var HistLayout = hist.Layout{SubBits: uint(histSubBits), MinShift: uint(histMinShift), Buckets: HistBins}

const (
	histSubBits  = int(ppingPpConstsPP_HIST_SUB_BITS)
	histMinShift = int(ppingPpConstsPP_HIST_MIN_SHIFT)
	histMaxShift = int(ppingPpConstsPP_HIST_MAX_SHIFT) // the last bucket starts here
	// HistBins is the number of histogram buckets (PP_HIST_BINS).
	HistBins = len(ppingPpAggStats{}.Bins)
)

// Histogram is a merged per-subnet RTT histogram. Times are in nanoseconds.
type Histogram struct {
	Count, Sum, Min, Max uint64
	Bins                 [HistBins]uint64
}

// add merges one CPU's kernel value.
func (s *SubnetStats) add(k *ppingPpAggStats) {
	o := SubnetStats{Rx: k.Rx, Tx: k.Tx, Histogram: Histogram{Count: k.Count, Sum: k.SumNs, Min: k.MinNs, Max: k.MaxNs}}
	for i, n := range k.Bins {
		o.Bins[i] = uint64(n)
	}
	s.Merge(&o)
}

// Merge adds o into h.
func (h *Histogram) Merge(o *Histogram) {
	if o.Count == 0 {
		return
	}
	h.Count += o.Count
	h.Sum += o.Sum
	if h.Min == 0 || o.Min < h.Min {
		h.Min = o.Min
	}
	h.Max = max(h.Max, o.Max)
	for i, n := range o.Bins {
		h.Bins[i] += n
	}
}

// Mean is exact (the kernel keeps the sum).
func (h *Histogram) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return time.Duration(h.Sum / h.Count)
}

// Quantile estimates the q-quantile (0..1) by linear interpolation inside its bucket,
// clamped to the exact min and max; the error is below one bucket width (12.5 %).
func (h *Histogram) Quantile(q float64) time.Duration {
	return time.Duration(hist.Quantile(HistLayout, h.Bins[:], q, h.Min, h.Max))
}

// Traffic is one subnet's traffic in one direction (struct pp_traffic, ePPing's
// traffic_counters): measured TCP (timestamp option), other TCP, and every other IP packet;
// bytes are whole frames.
type Traffic = ppingPpTraffic

// Packets is the packet count over all kinds of traffic.
func (t *Traffic) Packets() uint64 { return t.TcpTsPkts + t.TcpNotsPkts + t.OtherPkts }

// Bytes is the byte count over all kinds of traffic.
func (t *Traffic) Bytes() uint64 { return t.TcpTsBytes + t.TcpNotsBytes + t.OtherBytes }

func (t *Traffic) add(o *Traffic) { bpfx.AddCounters(t, o) }

// Side is which side of the monitored interface a subnet is on (enum pp_agg_side): a packet
// arriving on the interface comes from the remote side and goes to the local one; a packet
// leaving goes the other way.
type Side uint8

const (
	SideRemote Side = iota
	SideLocal
)

func (s Side) String() string {
	if s == SideLocal {
		return "local"
	}
	return "remote"
}

// SubnetStats is one subnet's traffic and RTT histogram on one side of the interface for
// one interval. Rx counts the packets with an endpoint in the subnet that arrived on the
// interface, Tx those that left through it: every packet is counted under its remote
// endpoint's subnet (Side remote) and its local endpoint's (Side local), so the two
// directions of a flow stay apart even when both ends are in one subnet. The RTT histogram
// holds the samples whose reply came from the subnet (--aggregate-reverse: went to it), on
// the side it came from. Other marks the catch-all entry for subnets that did not fit the
// map and for unmeasurable traffic of subnets without an entry.
type SubnetStats struct {
	Prefix netip.Prefix
	Side   Side
	Other  bool
	Rx, Tx Traffic
	Histogram
}

// Merge adds o's traffic and histogram into s.
func (s *SubnetStats) Merge(o *SubnetStats) {
	s.Rx.add(&o.Rx)
	s.Tx.add(&o.Tx)
	s.Histogram.Merge(&o.Histogram)
}

func (s *SubnetStats) empty() bool {
	return s.Count == 0 && s.Rx.Packets() == 0 && s.Tx.Packets() == 0
}

// AggReport is what one aggregation interval produced.
type AggReport struct {
	Time    time.Time
	Subnets []SubnetStats
}

func (m *Monitor) aggMaps(buf int) (v4, v6 *ebpf.Map) {
	if buf == 0 {
		return m.objs.Agg40, m.objs.Agg60
	}
	return m.objs.Agg41, m.objs.Agg61
}

// initAggregation creates the "other" entries of both sides in both buffers (the kernel
// folds subnets into them when a map is full, and cannot create them itself then).
func (m *Monitor) initAggregation() error {
	zero := make([]ppingPpAggStats, ebpf.MustPossibleCPU())
	for buf := range 2 {
		v4, v6 := m.aggMaps(buf)
		for _, side := range []Side{SideRemote, SideLocal} {
			if err := v4.Put(ppingPpAggKey4{Prefix: otherV4, Side: uint8(side)}, zero); err != nil {
				return fmt.Errorf("create IPv4 'other' aggregation entry: %w", err)
			}
			if err := v6.Put(ppingPpAggKey6{Prefix: otherV6, Side: uint8(side)}, zero); err != nil {
				return fmt.Errorf("create IPv6 'other' aggregation entry: %w", err)
			}
		}
	}
	return m.objs.AggActive.Put(uint32(0), uint32(0))
}

// PP_AGG_OTHER_V4 / _V6
const (
	otherV4 = 0xffffffff
	otherV6 = 0xffffffffffffffff
)

// membarrierCmdGlobal is MEMBARRIER_CMD_GLOBAL: returns after an RCU grace period, so every
// BPF program that read the old agg_active value has finished.
const membarrierCmdGlobal = 1

func waitForPrograms() {
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdGlobal, 0, 0); errno != 0 {
		// nohz_full kernels refuse MEMBARRIER_CMD_GLOBAL. A TC program runs for
		// microseconds; 10 ms covers it with a wide margin.
		time.Sleep(10 * time.Millisecond)
	}
}

// CollectAggregate flips the active buffer, waits until no program writes the old one,
// reads and clears it, and returns its subnets (sorted, "other" last).
func (m *Monitor) CollectAggregate() (*AggReport, error) {
	if m.cfg.Aggregate == 0 {
		return nil, errors.New("collect aggregate: the monitor was loaded without aggregation")
	}
	m.aggMu.Lock()
	defer m.aggMu.Unlock()
	prev := m.aggPrev
	if err := m.objs.AggActive.Put(uint32(0), uint32(1-prev)); err != nil {
		return nil, fmt.Errorf("flip aggregation buffer: %w", err)
	}
	m.aggPrev = 1 - prev
	waitForPrograms()
	rep := &AggReport{Time: time.Now()}
	v4, v6 := m.aggMaps(prev)
	err := drainAgg(v4, func(k ppingPpAggKey4) (netip.Prefix, Side, bool) {
		a := binary.LittleEndian.AppendUint32(nil, k.Prefix) // the key holds network order
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(a)), m.cfg.AggPrefixV4), Side(k.Side), k.Prefix == otherV4
	}, rep)
	if err != nil {
		return nil, err
	}
	err = drainAgg(v6, func(k ppingPpAggKey6) (netip.Prefix, Side, bool) {
		var a [16]byte
		binary.LittleEndian.PutUint64(a[:], k.Prefix)
		return netip.PrefixFrom(netip.AddrFrom16(a), m.cfg.AggPrefixV6), Side(k.Side), k.Prefix == otherV6
	}, rep)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(rep.Subnets, func(a, b SubnetStats) int {
		if a.Other != b.Other {
			if a.Other {
				return 1
			}
			return -1
		}
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return int(a.Side) - int(b.Side)
	})
	return rep, nil
}

// drainAgg reads every subnet with traffic or RTTs of one buffer map, deletes them and zeroes
// the "other" entries. decode turns a key into its prefix, side and whether it is "other".
func drainAgg[K comparable](m *ebpf.Map, decode func(K) (netip.Prefix, Side, bool), rep *AggReport) error {
	var key K
	var percpu []ppingPpAggStats
	var stale, others []K
	it := m.Iterate()
	for it.Next(&key, &percpu) {
		prefix, side, other := decode(key)
		s := SubnetStats{Prefix: prefix, Side: side, Other: other}
		for i := range percpu {
			s.add(&percpu[i])
		}
		if other {
			others = append(others, key)
		} else {
			stale = append(stale, key)
		}
		if !s.empty() {
			rep.Subnets = append(rep.Subnets, s)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read aggregation map %s: %w", m, err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear aggregation entry: %w", err)
		}
	}
	for _, k := range others {
		if err := m.Put(&k, make([]ppingPpAggStats, ebpf.MustPossibleCPU())); err != nil {
			return fmt.Errorf("reset aggregation 'other' entry: %w", err)
		}
	}
	return nil
}
