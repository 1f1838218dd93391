package pping

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Garbage collection is driven by user space, every cleanup interval: it reads the flow and
// identifier tables in batches and picks what expired. Two programs, run through
// BPF_PROG_TEST_RUN with the keys as the test packet, delete: pping_gc_expire the
// identifiers (and decrements their direction's outstanding count and hint slot),
// pping_gc_flows the flows it finds still expired (and takes their unopened directions off
// the hint slots): in the kernel, where those counts change atomically beside the packet
// programs' (user space could only delete, and the counts would drift).
// Timed-out flows are reported as closing events.
// No tracing program is involved (map iterators are BPF_PROG_TYPE_TRACING, which a
// locked-down kernel may refuse), and the packet path pays nothing. docs/pping.md
// ("Garbage collection") has the rules.

// gcBatch is how many entries one batch lookup returns.
const gcBatch = 256

// PP_GC_BATCH and PP_GC_FLOW_BATCH: identifiers per run of pping_gc_expire, flows per run
// of pping_gc_flows.
const (
	gcExpireBatch = int(ppingPpConstsPP_GC_BATCH)
	gcFlowBatch   = int(ppingPpConstsPP_GC_FLOW_BATCH)
)

// now is the programs' clock: CLOCK_MONOTONIC (bpf_ktime_get_ns), or the fixtures' fixed
// clock (bpf/include/clock.h) when the object was loaded with one; and the jiffies at it.
func (m *Monitor) now() (ns, jiffies uint64, err error) {
	if m.clockFixed {
		if err := m.objs.KedgeClockNs.Get(&ns); err != nil {
			return 0, 0, fmt.Errorf("read the fixed clock: %w", err)
		}
		return ns, ns / uint64(m.jiffies.tick), nil
	}
	ns = monoNs()
	return ns, m.jiffies.jiffies(ns), nil
}

// RunGC removes the identifiers and flows that expired and returns a closing event
// (reason "flow timeout", source "garbage collection") for every open direction of a
// removed flow. A no-op when the cleanup interval is 0.
func (m *Monitor) RunGC() ([]*FlowEvent, error) {
	if m.cfg.CleanupInterval <= 0 {
		return nil, nil
	}
	now, nowJ, err := m.now()
	if err != nil {
		return nil, err
	}
	flows := map[ppingPpTuple]ppingPpFlowState{}
	if err := batchRead(m.objs.Flows, func(k ppingPpTuple, v ppingPpFlowState) { flows[k] = v }); err != nil {
		return nil, fmt.Errorf("run flow GC: %w", err)
	}
	// Identifiers first: their lifetime depends on their flow's smoothed RTT.
	var stale []ppingPpPktId
	err = batchRead(m.objs.PktTs, func(id ppingPpPktId, stored uint64) {
		if m.tsExpired(&id, stored, now, flows) {
			stale = append(stale, id)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("run timestamp GC: %w", err)
	}
	if err := m.expire(stale); err != nil {
		return nil, fmt.Errorf("run timestamp GC: %w", err)
	}
	// Flows: the candidates by this snapshot; pping_gc_flows checks each again and deletes.
	var cands []ppingPpTuple
	for key, fs := range flows {
		if _, _, ok := m.flowExpired(&key, &fs, nowJ); ok {
			cands = append(cands, key)
		}
	}
	var evs []*FlowEvent
	at := m.clock.wall(now)
	for len(cands) > 0 {
		batch := cands[:min(len(cands), gcFlowBatch)]
		cands = cands[len(batch):]
		buf, err := binary.Append(nil, binary.LittleEndian, batch)
		if err != nil {
			return evs, err
		}
		deleted, err := m.objs.PpingGcFlows.Run(&ebpf.RunOptions{Data: buf})
		if err != nil {
			return evs, fmt.Errorf("run flow GC: pping_gc_flows: %w", err)
		}
		for i, key := range batch {
			if deleted&(1<<i) == 0 {
				continue
			}
			fs := flows[key]
			notify0, notify1, _ := m.flowExpired(&key, &fs, nowJ)
			if m.cfg.Aggregate > 0 {
				continue // events are per-sample mode's
			}
			// dir[0] runs key.saddr -> key.daddr; its replies come from key.daddr.
			if notify0 {
				rev := key.reverse()
				evs = append(evs, &FlowEvent{Time: at, Flow: rev.flow(), Type: FlowClosing, Reason: ReasonTimeout, Source: SourceGC})
			}
			if notify1 {
				evs = append(evs, &FlowEvent{Time: at, Flow: key.flow(), Type: FlowClosing, Reason: ReasonTimeout, Source: SourceGC})
			}
		}
	}
	return evs, nil
}

// tsExpired applies the identifier lifetime: clamp(8 x the direction's smoothed RTT,
// min, max), so a short-RTT flow's lost replies are forgotten quickly and a long-RTT flow
// keeps its identifiers long enough to be matched. Only the collector applies it.
func (m *Monitor) tsExpired(id *ppingPpPktId, stored, now uint64, flows map[ppingPpTuple]ppingPpFlowState) bool {
	stored &^= tsPureACK
	if now <= stored {
		return false
	}
	var srtt uint64
	key, dir := id.Flow.canonical()
	if fs, ok := flows[key]; ok {
		srtt = fs.Shared[dir].Srtt
	}
	return now-stored > m.cfg.tsLifetime(srtt)
}

// tsLifetime is clamp(tsRTTMult x srtt, TSMinLifetime, TSMaxLifetime) in ns.
func (c Config) tsLifetime(srtt uint64) uint64 {
	life := uint64(c.TSMaxLifetime)
	if srtt > 0 && srtt*tsRTTMult < life {
		life = srtt * tsRTTMult
	}
	return max(life, uint64(c.TSMinLifetime))
}

// tsRTTMult: an unmatched identifier lives this many smoothed RTTs (clamped);
// tsPureACK is PP_TS_PURE_ACK (pping.h), bit 0 of a stored time.
const (
	tsRTTMult = 8
	tsPureACK = 1
)

// flowExpired says whether a flow may be deleted (every direction closed, never opened or
// idle too long) and which of its directions were open and timed out. now is in jiffies.
func (m *Monitor) flowExpired(key *ppingPpTuple, fs *ppingPpFlowState, now uint64) (notify0, notify1, ok bool) {
	exp0 := m.dirExpired(&fs.Shared[0], &fs.Own0, key.Proto, now)
	exp1 := m.dirExpired(&fs.Shared[1], &fs.Own1, key.Proto, now)
	if (dirActive(&fs.Shared[0]) && !exp0) || (dirActive(&fs.Shared[1]) && !exp1) {
		return false, false, false
	}
	return exp0 && fs.Shared[0].Conn == connOpen, exp1 && fs.Shared[1].Conn == connOpen, true
}

// enum pp_conn_state
const (
	connEmpty    = 0
	connWaitOpen = 1
	connOpen     = 2
	connClosed   = 3
)

func dirActive(d *ppingPpDirShared) bool { return d.Conn == connWaitOpen || d.Conn == connOpen }

// dirExpired: an unanswered direction after the unopened lifetime, an idle ICMP/UDP one
// after the datagram lifetime, any idle one after the flow lifetime. The programs keep the
// last packet's time in jiffies; now is in jiffies too. pping_gc_flows (pp_dir_expired in
// pping.bpf.c) checks the same rule again before it deletes, with the last segment the
// direction cache counted (maps.h's pp_dc), which this snapshot of the flow state lacks: a
// candidate from here may still be alive there, never the other way round.
func (m *Monitor) dirExpired(d *ppingPpDirShared, o *ppingPpDirOwn, proto uint8, now uint64) bool {
	if !dirActive(d) || now < o.LastSeen {
		return false
	}
	age := time.Duration(now-o.LastSeen) * m.jiffies.tick
	c := &m.cfg
	switch {
	case d.Conn == connWaitOpen && age > c.UnopenedLifetime:
		return true
	case proto != unix.IPPROTO_TCP && age > c.DgramLifetime:
		return true
	}
	return age > c.FlowLifetime
}

// canonical returns the flows map's key of t's flow and the index of t's direction in it
// (pp_src_sorts_first in ident.h: the endpoint whose address words, then port, compare
// lower as the kernel loads them, little-endian, comes first).
func (t ppingPpTuple) canonical() (ppingPpTuple, int) {
	if t.srcSortsFirst() {
		return t, 0
	}
	return t.reverse(), 1
}

func (t *ppingPpTuple) srcSortsFirst() bool {
	s, d := t.Saddr.In6U.U6Addr8, t.Daddr.In6U.U6Addr8
	for i := 0; i < 16; i += 4 {
		a, b := binary.LittleEndian.Uint32(s[i:]), binary.LittleEndian.Uint32(d[i:])
		if a != b {
			return a < b
		}
	}
	return t.Sport <= t.Dport
}

func (t ppingPpTuple) reverse() ppingPpTuple {
	r := t
	r.Saddr, r.Daddr = t.Daddr, t.Saddr
	r.Sport, r.Dport = t.Dport, t.Sport
	return r
}

// batchRead calls fn for every entry of a hash map, reading it in batches
// (BPF_MAP_LOOKUP_BATCH, 5.6) or, where the kernel lacks those, one key at a time.
func batchRead[K comparable, V any](mp *ebpf.Map, fn func(K, V)) error {
	keys, vals := make([]K, gcBatch), make([]V, gcBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := mp.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(keys[i], vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case errors.Is(err, ebpf.ErrNotSupported):
			var k K
			var v V
			it := mp.Iterate()
			for it.Next(&k, &v) {
				fn(k, v)
			}
			return it.Err()
		case err != nil:
			return err
		}
	}
}

// expire hands ids to pping_gc_expire, PP_GC_BATCH at a time.
func (m *Monitor) expire(ids []ppingPpPktId) error {
	for len(ids) > 0 {
		n := min(len(ids), gcExpireBatch)
		buf, err := binary.Append(nil, binary.LittleEndian, ids[:n])
		if err != nil {
			return err
		}
		if _, err := m.objs.PpingGcExpire.Run(&ebpf.RunOptions{Data: buf}); err != nil {
			return fmt.Errorf("run pping_gc_expire: %w", err)
		}
		ids = ids[n:]
	}
	return nil
}
