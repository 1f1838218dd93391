package raftbench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// StallRecord is what a stress-disk run saw of a kedge cluster's disk: the saves that held a
// node's persist/apply loop longer than its alive bound (the nodes' election records' slow
// saves), the stalled node's apart from the others' (on one shared filesystem a stalled
// node's writes hold the journal the others' fsyncs wait for; on disks of their own, as the
// benchmark puts them since, they should not), and whether the
// stalled node stopped answering for itself within the alive bound: for each of its slow
// saves long enough to judge, the leader's last word from it (GET /v1/status, polled with
// the leader changes) against the save's start plus the alive bound.
type StallRecord struct {
	AliveBoundMs float64 `json:"alive_bound_ms"`
	// With the adaptive bound (no --offload-alive, --heartbeat-lease: AliveBoundMs is its
	// floor): AliveBoundMaxMs the largest in force at one of the stalled node's slow saves,
	// OtherBoundMaxMs the largest any other node's reached (its "bound" events).
	AliveBoundMaxMs float64 `json:"alive_bound_max_ms,omitempty"`
	OtherBoundMaxMs float64 `json:"other_bound_max_ms,omitempty"`
	SlowSaves       int     `json:"slow_saves"` // the stalled node's
	SaveP50Ms       float64 `json:"save_p50_ms"`
	SaveMaxMs       float64 `json:"save_max_ms"`
	// OtherSlowSaves, OtherSaveMaxMs: the other nodes' slow saves (their disks are not
	// throttled: what they show is the CPU stress, and the stalled node's hold on a shared
	// filesystem where there is one).
	OtherSlowSaves int     `json:"other_slow_saves"`
	OtherSaveMaxMs float64 `json:"other_save_max_ms"`
	// Judged: the stalled node's slow saves that lasted at least judgeMin past the alive
	// bound plus stallSlack and had a poll of the leader in that window. The leader's
	// record is an age taken at some point between the poll's request and its answer, so
	// the last word is known within that span (tens of ms on a machine under this stress):
	// Late counts the saves during which the leader had heard from the node after start +
	// bound + slack even at the earliest reading (the poll's request time), LateMaybe those
	// at the latest reading (its answer time). LastWordMaxMs, LastWordMaxLateMs: over the
	// judged saves, the latest last word at the earliest and the latest reading, ms after
	// the save began. The leader's record is its last word of any kind from the node: the
	// kernel's answers and also what the node's user space sent before its save began.
	Judged            int     `json:"judged"`
	Late              int     `json:"late"`
	LateMaybe         int     `json:"late_maybe"`
	LastWordMaxMs     float64 `json:"last_word_max_ms"`
	LastWordMaxLateMs float64 `json:"last_word_max_late_ms"`
}

// Adaptive reports whether the nodes ran the adaptive bound: it moved (a node's "bound"
// events, or a stalled save's bound above the floor). Without the kernel paths a slow save
// carries the floor and no node reports a move.
func (s *StallRecord) Adaptive() bool {
	return s.OtherBoundMaxMs > 0 || s.AliveBoundMaxMs > s.AliveBoundMs
}

// BoundText is the alive bound as the tables give it: fixed, or the adaptive bound's floor
// and the largest in force at a stalled save and on the other nodes.
func (s *StallRecord) BoundText() string {
	if !s.Adaptive() {
		return fmt.Sprintf("%.0f ms", s.AliveBoundMs)
	}
	return fmt.Sprintf("%.0f ms adaptive (at a stalled save up to %.0f ms, others' up to %.0f ms)", s.AliveBoundMs, s.AliveBoundMaxMs, s.OtherBoundMaxMs)
}

const (
	// stallSlack covers the leader's receipt of the node's last answer and the poll's
	// reading of it (an HTTP round trip through the lab's fabric), as in the lab's test of
	// the fault (TestStalledFollowerStopsAnswering).
	stallSlack = 30 * time.Millisecond
	// judgeMin: a save is judged when it outlasted its start + alive bound + slack by this.
	judgeMin = 20 * time.Millisecond
	// eventPoll: the nodes' election records hold their last 256 events; a stalled node adds
	// about three slow saves a second, so they are read this often.
	eventPoll = 2 * time.Second
)

// heardSample is the leader's record of the stalled node, polled: the poll's request and
// answer (CLOCK_MONOTONIC) and how long before, as the leader said, it last heard from it.
type heardSample struct{ req, resp, age time.Duration }

// stallWatch collects, during a stress-disk run of a kedge cluster, the leader's record of
// the stalled node and every node's slow saves.
type stallWatch struct {
	c       *raftlab.Cluster
	stalled int
	alive   time.Duration
	since   int64 // CLOCK_MONOTONIC ns: events before are not the run's

	mu      sync.Mutex
	samples []heardSample
	saves   map[int]map[int64]api.Event // node -> start -> slow save
	bounds  map[int]time.Duration       // node -> largest adaptive bound it reported
	last    map[int]int64               // node -> newest event read
	next    time.Time                   // the next read of the records
}

func newStallWatch(c *raftlab.Cluster, stalled int, alive time.Duration) *stallWatch {
	now := int64(offload.Monotonic())
	return &stallWatch{c: c, stalled: stalled, alive: alive, since: now, saves: map[int]map[int64]api.Event{},
		bounds: map[int]time.Duration{}, last: map[int]int64{}}
}

// sample records node id's status st, asked at req and answered at resp.
func (w *stallWatch) sample(id int, st raftlab.Status, req, resp time.Duration) {
	if st.State != "leader" || id == w.stalled {
		return
	}
	for _, p := range st.Peers {
		if int(p.ID) == w.stalled && p.LastHeardMs != nil {
			w.samples = append(w.samples, heardSample{req, resp, time.Duration(*p.LastHeardMs * float64(time.Millisecond))})
		}
	}
}

// readEvents reads every node's slow saves since the last read, at most every eventPoll
// (force: now); a node that does not answer is read at the next.
func (w *stallWatch) readEvents(ctx context.Context, force bool) {
	if !force && time.Now().Before(w.next) {
		return
	}
	w.next = time.Now().Add(eventPoll)
	cl := raftlab.NewClient(w.c.Client, time.Second)
	defer cl.Close()
	for _, n := range w.c.Nodes {
		since := max(w.last[n.ID], w.since)
		r, err := cl.Events(ctx, n.ClientAddr.String(), since)
		if err != nil {
			continue
		}
		w.mu.Lock()
		for _, e := range r.Events {
			w.last[n.ID] = max(w.last[n.ID], e.AtNs)
			if e.Kind == api.EventBound {
				w.bounds[n.ID] = max(w.bounds[n.ID], time.Duration(e.BoundNs))
			}
			if e.Kind != api.EventSlowSave {
				continue
			}
			if w.saves[n.ID] == nil {
				w.saves[n.ID] = map[int64]api.Event{}
			}
			w.saves[n.ID][e.AtNs] = e
		}
		w.mu.Unlock()
	}
}

// record judges the run.
func (w *stallWatch) record() *StallRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := &StallRecord{AliveBoundMs: ms(w.alive)}
	for id, b := range w.bounds {
		if id != w.stalled {
			r.OtherBoundMaxMs = max(r.OtherBoundMaxMs, ms(b))
		}
	}
	var took []float64
	for id, saves := range w.saves {
		for _, e := range saves {
			d := float64(e.SaveNs) / 1e6
			if id != w.stalled {
				r.OtherSlowSaves++
				r.OtherSaveMaxMs = max(r.OtherSaveMaxMs, d)
				continue
			}
			took = append(took, d)
			alive := w.alive
			if e.BoundNs > 0 { // the bound in force when the save began (adaptive)
				alive = time.Duration(e.BoundNs)
				r.AliveBoundMaxMs = max(r.AliveBoundMaxMs, ms(alive))
			}
			start, end := time.Duration(e.AtNs), time.Duration(e.AtNs+e.SaveNs)
			bound := start + alive + stallSlack
			if end-bound < judgeMin {
				continue
			}
			var early, late time.Duration // the last word, at the earliest and the latest reading
			for _, s := range w.samples {
				if s.req >= bound && s.resp <= end {
					early, late = max(early, s.req-s.age), max(late, s.resp-s.age)
				}
			}
			if late == 0 {
				continue // no poll of the leader in the window
			}
			r.Judged++
			r.LastWordMaxMs, r.LastWordMaxLateMs = max(r.LastWordMaxMs, ms(early-start)), max(r.LastWordMaxLateMs, ms(late-start))
			if early > bound {
				r.Late++
			}
			if late > bound {
				r.LateMaybe++
			}
		}
	}
	slices.Sort(took)
	r.SlowSaves = len(took)
	if len(took) > 0 {
		r.SaveP50Ms, r.SaveMaxMs = bench.Percentile(took, 50), took[len(took)-1]
	}
	return r
}

// WALFsyncRecord is what a stress-disk run saw of its nodes' WAL fsyncs, from their
// histograms (kedge_raft_wal_fsync_seconds, etcd's etcd_disk_wal_fsync_duration_seconds),
// read before and after the run: the stalled node's apart from the others'. Both systems
// have one, so it shows whether the stall stayed the stalled node's in each. A fsync's time
// is known to its bucket: the longest is its bucket's upper bound, "slow" is over the
// smallest bound of at least 100 ms (kedge's 102.4 ms, etcd's 128 ms).
type WALFsyncRecord struct {
	SlowOverMs   float64 `json:"slow_over_ms"`
	Fsyncs       int     `json:"fsyncs"`          // the stalled node's
	Slow         int     `json:"slow"`            // of those, over SlowOverMs
	MaxLeMs      float64 `json:"max_le_ms"`       // the longest, at most (or beyond, with MaxBeyond)
	OtherFsyncs  int     `json:"other_fsyncs"`    // the other nodes'
	OtherSlow    int     `json:"other_slow"`      // of those, over SlowOverMs
	OtherMaxLeMs float64 `json:"other_max_le_ms"` // the longest, at most (or beyond, with OtherMaxBeyond)
	// MaxBeyond, OtherMaxBeyond: the longest was beyond the histogram's last finite bound,
	// which MaxLeMs (OtherMaxLeMs) then holds (JSON has no infinity).
	MaxBeyond      bool `json:"max_beyond,omitempty"`
	OtherMaxBeyond bool `json:"other_max_beyond,omitempty"`
}

// fsyncHist is one node's cumulative WAL fsync histogram: upper bound (s) -> count.
type fsyncHist map[float64]float64

// walFsyncHists reads every node's WAL fsync histogram (a node that does not answer is
// left out).
func walFsyncHists(ctx context.Context, c *raftlab.Cluster) map[int]fsyncHist {
	name := "kedge_raft_wal_fsync_seconds_bucket{"
	if c.Spec.Etcd() {
		name = "etcd_disk_wal_fsync_duration_seconds_bucket{"
	}
	cl := raftlab.NewClient(c.Client, 2*time.Second)
	defer cl.Close()
	out := map[int]fsyncHist{}
	for _, n := range c.Nodes {
		m, err := metricsText(ctx, cl.HTTP, n.ClientAddr.String())
		if err != nil {
			continue
		}
		h := fsyncHist{}
		for _, l := range strings.Split(m, "\n") {
			// ..._bucket{le="0.128"} 42
			rest, ok := strings.CutPrefix(l, name)
			_, rest, ok2 := strings.Cut(rest, `le="`)
			le, val, ok3 := strings.Cut(rest, `"} `)
			if !ok || !ok2 || !ok3 {
				continue
			}
			b, err1 := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
			v, err2 := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err1 == nil && err2 == nil {
				h[b] = v
			}
		}
		if len(h) > 0 {
			out[n.ID] = h
		}
	}
	return out
}

func metricsText(ctx context.Context, hc *http.Client, addr string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metrics of %s: %s", addr, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// walFsyncRecord is the difference of two readings; nil when a node is missing from either.
func walFsyncRecord(before, after map[int]fsyncHist, stalled int) *WALFsyncRecord {
	if len(after) == 0 || len(before) != len(after) {
		return nil
	}
	r := &WALFsyncRecord{}
	for id, a := range after {
		b, ok := before[id]
		if !ok {
			return nil
		}
		bounds := slices.Sorted(maps.Keys(a))
		slowAt := math.Inf(1)
		for _, le := range bounds {
			if le >= 0.1 {
				slowAt = le
				break
			}
		}
		r.SlowOverMs = slowAt * 1000
		total := a[math.Inf(1)] - b[math.Inf(1)]
		slow := total - (a[slowAt] - b[slowAt])
		var maxLe, lastFinite float64
		prev := 0.0
		for _, le := range bounds {
			if n := a[le] - b[le]; n > prev { // a fsync in (previous bound, le]
				maxLe = le
			}
			prev = a[le] - b[le]
			if !math.IsInf(le, 1) {
				lastFinite = le
			}
		}
		beyond := math.IsInf(maxLe, 1)
		if beyond {
			maxLe = lastFinite
		}
		if id == stalled {
			r.Fsyncs, r.Slow, r.MaxLeMs, r.MaxBeyond = int(total), int(slow), maxLe*1000, beyond
		} else {
			r.OtherFsyncs += int(total)
			r.OtherSlow += int(slow)
			if beyond && !r.OtherMaxBeyond || beyond == r.OtherMaxBeyond && maxLe*1000 > r.OtherMaxLeMs {
				r.OtherMaxLeMs, r.OtherMaxBeyond = maxLe*1000, beyond
			}
		}
	}
	return r
}
