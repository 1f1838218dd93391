package pping

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// dirCache reads the direction cache (maps.h's pp_dc).
func dirCache(t *testing.T, m *Monitor) []ppingPpDcSlot {
	t.Helper()
	slots := make([]ppingPpDcSlot, hintSlots)
	if err := m.objs.PpDc.Get(slots); err != nil {
		t.Fatal(err)
	}
	return slots
}

// checkDirCache checks the direction cache against the flow table: a slot names a direction
// of a flow that exists, is open or waiting to open, is not local and does not time its
// packets in ns, with the TSval that direction's state has last; an empty slot holds no
// counts.
func checkDirCache(t *testing.T, m *Monitor) {
	t.Helper()
	for i, s := range dirCache(t, m) {
		dir := ppingPpTuple(s.Dir)
		if dir.Proto == 0 {
			if s.Pkts != 0 || s.Bytes != 0 {
				t.Errorf("direction cache slot %d: empty with %d packets, %d bytes", i, s.Pkts, s.Bytes)
			}
			continue
		}
		if hintSlot(&dir) != i {
			t.Errorf("direction cache slot %d holds %s, whose slot is %d", i, dir.flow(), hintSlot(&dir))
		}
		key, d := dir.canonical()
		var fs ppingPpFlowState
		if err := m.objs.Flows.Lookup(&key, &fs); err != nil {
			t.Errorf("direction cache slot %d: %s has no flow: %v", i, dir.flow(), err)
			continue
		}
		own := []ppingPpDirOwn{fs.Own0, fs.Own1}[d]
		if sh := fs.Shared[d]; !dirActive(&sh) || sh.Local != 0 || sh.NsSeen != 0 || uint32(own.LastId) != s.LastId {
			t.Errorf("direction cache slot %d: %s conn %d local %d ns_seen %d last id %d, slot's %d",
				i, dir.flow(), sh.Conn, sh.Local, sh.NsSeen, own.LastId, s.LastId)
		}
	}
}

// TestDirectionCache: data segments that repeat their direction's TSval with nothing to match
// are decided by the direction cache (fast path) exactly as the flow table decides them
// (general path): the same counters per packet, an RTT sample that reports every packet of
// the request direction (those counted in the cache too), a FIN that empties the slot, and a
// colliding direction that evicts the slot and folds its counts into its flow.
//
// Modes: "fast" decides on the headers (pp_fast_segment()), "aggregate" after the parse
// (pp_dc_hit(): aggregation counts every packet per subnet first), "general" never.
func TestDirectionCache(t *testing.T) {
	for _, mode := range []string{"fast", "aggregate", "general"} {
		general, aggregate := mode == "general", mode == "aggregate"
		for _, f := range []fam{v4, v6} {
			t.Run(mode+"/"+f.String(), func(t *testing.T) {
				m := loadFixture(t, func(c *Config) {
					c.noFastPath = general
					if aggregate {
						c.Aggregate = time.Second
					}
				})
				const size = 1400
				data := func(tsval int64) []byte { return f.tcp(false, flagData, tsval, 50, size) }
				notNew := c{"TsNotNew": 1, "MatchNone": 1}
				runSteps(t, m, []step{
					in(data(1000), c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}), // opens mid-flow
					in(data(1000), notNew),
					in(data(1001), c{"TsStored": 1, "MatchNone": 1}),
					in(data(1001), notNew),
					in(data(1001), notNew),
					eg(f.tcp(true, pktbuild.ACK, 50, 1001, 0), c{"FlowOpened": 1, "MatchRtt": 1}),
					in(data(1001), notNew),
				})
				// Events are per-sample mode's: with aggregation the sample goes to a histogram.
				if !aggregate {
					checkSampleCounts(t, drain(t, m), 5, 5*size, 1, 0)
				}
				cached := 0
				for _, s := range dirCache(t, m) {
					if dir := ppingPpTuple(s.Dir); dir.Proto != 0 {
						cached++
						if s.Pkts != 3 || s.LastId != 1001 {
							t.Errorf("slot of %s: %d packets, TSval %d; want 3 (the segments since its last full path), 1001", dir.flow(), s.Pkts, s.LastId)
						}
					}
				}
				if want := map[bool]int{false: 1, true: 0}[general]; cached != want {
					t.Errorf("%d directions cached, want %d", cached, want)
				}
				checkDirCache(t, m)

				// A direction colliding with B's evicts it: B's counts go to its flow.
				var bDir ppingPpTuple
				for _, s := range dirCache(t, m) {
					if s.Dir.Proto != 0 {
						bDir = ppingPpTuple(s.Dir)
					}
				}
				if !general {
					other := collidingPort(t, bDir)
					src, dst := f.addrs(false)
					seg := func(fromB bool, tsval uint32) []byte {
						h := pktbuild.TCP{Src: portB, Dst: other, Flags: flagData,
							Options: append(append(pktbuild.OptNOP(), pktbuild.OptNOP()...), pktbuild.OptTimestamp(tsval, 70)...)}
						b := pktbuild.New()
						if f.v6 {
							b = b.IPv6(pktbuild.IPv6{Src: src, Dst: dst})
						} else {
							b = b.IPv4(pktbuild.IPv4{Src: src, Dst: dst})
						}
						return b.TCP(h).Payload(make([]byte, size)).Build()
					}
					runSteps(t, m, []step{in(seg(true, 5000), c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1})})
					key, d := bDir.canonical()
					var fs ppingPpFlowState
					if err := m.objs.Flows.Lookup(&key, &fs); err != nil {
						t.Fatal(err)
					}
					if own := []ppingPpDirOwn{fs.Own0, fs.Own1}[d]; own.Pkts != 6 || own.Bytes != 6*size {
						t.Errorf("evicted direction: %d packets, %d bytes in its flow; want 6, %d", own.Pkts, own.Bytes, 6*size)
					}
					checkDirCache(t, m)
				}

				// B's FIN closes its direction and, A's never opened, deletes the flow: the
				// slot goes with it, and B's next segment starts a new flow.
				runSteps(t, m, []step{
					in(f.tcp(false, pktbuild.FIN|pktbuild.ACK, 1001, 50, 0),
						c{"MatchNone": 1, "FlowClosed": 1, "FlowDeleted": 1}),
					in(data(1001), c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}),
				})
				checkDirCache(t, m)
			})
		}
	}
}

// collidingPort returns a port p such that B:80 -> A:p hashes to dir's slot (dir is B:80 -> A:40000).
func collidingPort(t *testing.T, dir ppingPpTuple) uint16 {
	t.Helper()
	for p := uint16(1024); p < 65535; p++ {
		d := dir
		var be [2]byte
		binary.BigEndian.PutUint16(be[:], p)
		d.Dport = binary.LittleEndian.Uint16(be[:])
		if p != portA && hintSlot(&d) == hintSlot(&dir) {
			return p
		}
	}
	t.Fatal("no colliding port")
	return 0
}

// TestDirectionCacheGC: a direction whose segments the cache counted is alive for the
// collector by its slot's last segment, not by the older time in its flow state: kept while
// that segment is recent, deleted (and its slot emptied) once it is not - the same outcome
// as on the general path, where the flow state has every segment.
func TestDirectionCacheGC(t *testing.T) {
	const life = 150 * time.Millisecond
	for _, general := range []bool{false, true} {
		t.Run(map[bool]string{false: "fast", true: "general"}[general], func(t *testing.T) {
			m := loadFixture(t, func(c *Config) {
				c.noFastPath = general
				c.CleanupInterval = time.Second
				c.UnopenedLifetime, c.FlowLifetime = life, life
			})
			data := v4.tcp(false, flagData, 1000, 50, 1400)
			first := stepCase(m, 0, in(data, c{"FlowCreated": 1, "TsNotNew": 1, "MatchNone": 1}))
			again := stepCase(m, 1, in(data, c{"TsNotNew": 1, "MatchNone": 1}))
			again.Now = first.Now + uint64(100*time.Millisecond) // within the slot's PP_DC_TICKS
			bpftest.Runner{Counters: readCounters(m), Clock: m.objs.KedgeClockNs}.RunCase(t,
				bpftest.Case{Name: t.Name(), Steps: []bpftest.Case{first, again}})
			for i, want := range []int64{0, 1} { // 100 ms, then 200 ms after the second segment
				advance(t, m, 100*time.Millisecond)
				d, err := bpftest.Delta(readCounters(m), func() error { _, err := m.RunGC(); return err })
				if err != nil {
					t.Fatal(err)
				}
				if d := d.Diff(c{"3.GcFlowExpired": want}); d != "" {
					t.Errorf("GC %d: counter changes (got, want):\n%s", i, d)
				}
				if n := countFlows(t, m); n != int(1-want) {
					t.Errorf("GC %d: %d flows, want %d", i, n, 1-want)
				}
				checkDirCache(t, m)
			}
		})
	}
}

// checkSampleCounts checks the packet and byte counts of the one RTT event in evs.
func checkSampleCounts(t *testing.T, evs []Event, sentPkts, sentBytes, recPkts, recBytes uint64) {
	t.Helper()
	var rtt *RTTEvent
	for _, ev := range evs {
		if e, ok := ev.(*RTTEvent); ok {
			rtt = e
		}
	}
	if rtt == nil {
		t.Fatalf("no RTT event in %v", evs)
	}
	if rtt.SentPackets != sentPkts || rtt.SentBytes != sentBytes || rtt.RecPackets != recPkts || rtt.RecBytes != recBytes {
		t.Errorf("RTT event sent %d pkts %d bytes, received %d pkts %d bytes; want %d, %d, %d, %d",
			rtt.SentPackets, rtt.SentBytes, rtt.RecPackets, rtt.RecBytes, sentPkts, sentBytes, recPkts, recBytes)
	}
}
