package hedge

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// histSamples are the latencies (us) the histogram tests look at: every value below 2^16,
// each power of two up to 2^40 and its neighbours, a stride through [2^16, 2^27] and
// random points in it.
func histSamples() []uint64 {
	var v []uint64
	for us := uint64(0); us < 1<<16; us++ {
		v = append(v, us)
	}
	for k := 16; k <= 40; k++ {
		v = append(v, 1<<k-1, 1<<k, 1<<k+1)
	}
	for us := uint64(1 << 16); us <= 1<<27; us += 4099 {
		v = append(v, us)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		v = append(v, 1<<16+r.Uint64N(1<<27-1<<16))
	}
	return v
}

// TestBucketInvariants: buckets tile [0, 2^28) us without gaps, each value lies in its
// bucket's bounds, buckets are at most 1/16 wide above 32 us, and larger values clamp to the
// last bucket.
func TestBucketInvariants(t *testing.T) {
	prevHi := uint64(0)
	for b := 0; b < histBuckets; b++ {
		lo, hi := bucketBounds(b)
		if lo != prevHi || hi <= lo {
			t.Fatalf("bucket %d [%d, %d) does not follow the previous bucket's end %d", b, lo, hi, prevHi)
		}
		if got := bucketOf(lo); got != b {
			t.Errorf("bucketOf(lo %d of bucket %d) = %d", lo, b, got)
		}
		if got := bucketOf(hi - 1); got != b {
			t.Errorf("bucketOf(hi-1 %d of bucket %d) = %d", hi-1, b, got)
		}
		if sub := uint64(1) << histLayout.SubBits; b >= int(2*sub) && float64(hi-lo)/float64(lo) > 1.0/float64(sub) {
			t.Errorf("bucket %d [%d, %d) is wider than 1/%d", b, lo, hi, sub)
		}
		prevHi = hi
	}
	if _, hi := bucketBounds(histBuckets - 1); hi != 1<<28 {
		t.Errorf("last bucket ends at %d us, want 2^28", hi)
	}
	prev := 0
	for _, us := range histSamples() { // ascending within each part
		b := bucketOf(us)
		if us >= 1<<28 {
			if b != histBuckets-1 {
				t.Errorf("bucketOf(%d) = %d, want the last bucket", us, b)
			}
			continue
		}
		if lo, hi := bucketBounds(b); us < lo || us >= hi {
			t.Errorf("%d us in bucket %d [%d, %d)", us, b, lo, hi)
		}
		if us < 1<<16 && b < prev {
			t.Errorf("bucketOf not monotonic at %d", us)
		}
		prev = b
	}
}

func TestHistQuantile(t *testing.T) {
	hist := func(pairs ...uint64) []uint32 { // us, count, us, count, ...
		h := make([]uint32, histBuckets)
		for i := 0; i < len(pairs); i += 2 {
			h[bucketOf(pairs[i])] += uint32(pairs[i+1])
		}
		return h
	}
	upper := func(us uint64) time.Duration {
		_, hi := bucketBounds(bucketOf(us))
		return time.Duration(hi) * time.Microsecond
	}
	tests := []struct {
		name string
		h    []uint32
		q    float64
		want time.Duration
	}{
		{"empty", hist(), 0.5, 0},
		{"one sample", hist(1000, 1), 0.99, upper(1000)},
		{"p50 of 100 at 1ms and 100 at 8ms", hist(1000, 100, 8000, 100), 0.5, upper(1000)},
		{"p50 just past the first half", hist(1000, 100, 8000, 101), 0.5, upper(8000)},
		{"p95 with 5% slow", hist(1000, 95, 8000, 5), 0.95, upper(1000)},
		{"p95 with 6% slow", hist(1000, 94, 8000, 6), 0.95, upper(8000)},
		{"p99 with 1 in 100 slow", hist(50, 99, 400000, 1), 0.99, upper(50)},
		{"p100 is the largest", hist(50, 99, 400000, 1), 1, upper(400000)},
		{"linear region is exact", hist(7, 10), 0.5, 8 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := histQuantile(tt.h, tt.q); got != tt.want {
				t.Errorf("histQuantile(q=%g) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

func TestPrecision(t *testing.T) {
	late, early := make([]uint32, histBuckets), make([]uint32, histBuckets)
	if p := precision(late, early); p != (Precision{}) {
		t.Errorf("empty: %+v", p)
	}
	early[bucketOf(30)] = 1 // one hedge 30 us early
	late[bucketOf(50)] = 97 // most 50 us late
	late[bucketOf(2000)] = 2
	p := precision(late, early)
	want := Precision{Samples: 100, Min: -30 * time.Microsecond, P50: upperDur(50),
		P99: upperDur(2000), Max: upperDur(2000)}
	if p != want {
		t.Errorf("precision %+v, want %+v", p, want)
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

func upperDur(us uint64) time.Duration {
	_, hi := bucketBounds(bucketOf(us))
	return time.Duration(hi) * time.Microsecond
}

// TestCounterNames: counter names are the C field names, so stats, metrics and docs agree.
func TestCounterNames(t *testing.T) {
	m := counterMap(hedgeHedgeStats{HedgesSent: 3, DuplicatesDropped: 2, GcExpired: 1})
	fields := 0 // every exported field is a counter (bpf2go adds an unexported layout marker)
	for f := range reflect.TypeFor[hedgeHedgeStats]().Fields() {
		if f.IsExported() {
			fields++
		}
	}
	if m["hedges_sent"] != 3 || m["duplicates_dropped"] != 2 || m["gc_expired"] != 1 || len(m) != fields || fields < 24 {
		t.Errorf("counterMap = %v", m)
	}
	for _, name := range globalCounters {
		if _, ok := m[name]; !ok {
			t.Errorf("global counter %q is not a hedge_stats field", name)
		}
	}
	// Each failure has its own counter: a rewrite that failed is not a redirect that failed.
	for _, name := range []string{"short_responses", "malformed_responses", "hedge_rewrite_errors", "response_rewrite_errors", "redirect_errors"} {
		if _, ok := m[name]; !ok {
			t.Errorf("no counter %q", name)
		}
	}
	for name := range m {
		if counterHelp[name] == "" {
			t.Errorf("counter %q has no HELP text in counterHelp", name)
		}
	}
	for name := range counterHelp {
		if _, ok := m[name]; !ok {
			t.Errorf("counterHelp names %q, which is no hedge_stats field", name)
		}
	}
	var s hedgeHedgeStats
	for _, p := range []hedgeHedgeStats{{Requests: 1, Clones: 2}, {Requests: 10, Clones: 20}} {
		bpfx.AddCounters(&s, &p)
	}
	if s.Requests != 11 || s.Clones != 22 {
		t.Errorf("sumStats = %+v", s)
	}
}

// pacerCounters is Stats.Counters of a pacer: every counter named, set ones as given.
func pacerCounters(set map[string]uint64) map[string]uint64 {
	m := map[string]uint64{}
	for _, n := range pacer.CounterNames() {
		m[n] = set[n]
	}
	return m
}

func fakeSnapshot() *Snapshot {
	return &Snapshot{
		Time: time.Unix(1700000000, 0).UTC(), Backend: BackendConveyor, Period: 10 * time.Millisecond,
		Calibration: Calibration{Target: 10 * time.Millisecond, Mean: 10050 * time.Microsecond, Min: 9 * time.Millisecond,
			Max: 11 * time.Millisecond, Fillers: 83, Spread: 121 * time.Microsecond},
		Services: []ServiceStats{{
			Name: "kv", Address: "198.18.0.12:9999", Delay: "10ms", DelayNow: 10 * time.Millisecond, Tokens: 7.5, Window: 40,
			RequestID: "offset 0, 4 bytes, big-endian",
			Counters: pick(counterMap(hedgeHedgeStats{Requests: 100, HedgesSent: 4, BudgetExhausted: 1, ShortResponses: 3,
				HedgeRewriteErrors: 6, ResponseRewriteErrors: 7}), false),
			LatencyP50: time.Millisecond, LatencyP95: 2 * time.Millisecond, LatencyP99: 9 * time.Millisecond,
			Precision: Precision{Samples: 4, P50: 50 * time.Microsecond, P99: 90 * time.Microsecond},
		}},
		Global:    pick(counterMap(hedgeHedgeStats{Malformed: 2, MalformedResponses: 5}), true),
		DelayLine: pacerCounters(map[string]uint64{"carried_in": 104, "carried_out": 103, "period_sum_ns": 3_000_000_000, "period_count": 300, "period_min_ns": 9_000_000, "period_max_ns": 11_000_000}),
	}
}

func TestCollector(t *testing.T) {
	c := newCollector(func() (*Snapshot, error) { return fakeSnapshot(), nil })
	want := `
# HELP kedge_hedge_hedges_sent_total Hedges sent.
# TYPE kedge_hedge_hedges_sent_total counter
kedge_hedge_hedges_sent_total{service="kv"} 4
# HELP kedge_hedge_malformed_total Outgoing packets parse.h rejects, passed untouched.
# TYPE kedge_hedge_malformed_total counter
kedge_hedge_malformed_total 2
# HELP kedge_hedge_malformed_responses_total Incoming packets parse.h rejects, passed untouched.
# TYPE kedge_hedge_malformed_responses_total counter
kedge_hedge_malformed_responses_total 5
# HELP kedge_hedge_short_responses_total Responses from a service or replica address shorter than the request-id field, passed untouched.
# TYPE kedge_hedge_short_responses_total counter
kedge_hedge_short_responses_total{service="kv"} 3
# HELP kedge_hedge_redirect_errors_total Hedges or recirculating clones dropped: bpf_redirect_neigh or bpf_redirect failed.
# TYPE kedge_hedge_redirect_errors_total counter
kedge_hedge_redirect_errors_total{service="kv"} 0
# HELP kedge_hedge_hedge_rewrite_errors_total Hedges not sent: rewriting the destination failed.
# TYPE kedge_hedge_hedge_rewrite_errors_total counter
kedge_hedge_hedge_rewrite_errors_total{service="kv"} 6
# HELP kedge_hedge_response_rewrite_errors_total Responses passed without their source rewritten: the rewrite failed.
# TYPE kedge_hedge_response_rewrite_errors_total counter
kedge_hedge_response_rewrite_errors_total{service="kv"} 7
# HELP kedge_hedge_delay_seconds Current hedge delay.
# TYPE kedge_hedge_delay_seconds gauge
kedge_hedge_delay_seconds{service="kv"} 0.01
# HELP kedge_hedge_budget_tokens Free budget tokens: clones the splitter may send now (clones in the delay line hold theirs).
# TYPE kedge_hedge_budget_tokens gauge
kedge_hedge_budget_tokens{service="kv"} 7.5
# HELP kedge_hedge_latency_p95_seconds Request to first response, p95 over the adaptive-delay window (bucket upper edge).
# TYPE kedge_hedge_latency_p95_seconds gauge
kedge_hedge_latency_p95_seconds{service="kv"} 0.002
# HELP kedge_hedge_precision_p99_seconds Hedge send time minus intended send time, p99 (negative: early).
# TYPE kedge_hedge_precision_p99_seconds gauge
kedge_hedge_precision_p99_seconds{service="kv"} 9e-05
# HELP kedge_hedge_delay_line_carried_in_total Delay-line (pacer) counter carried_in (bpf/include/pacer.h struct pacer_stats).
# TYPE kedge_hedge_delay_line_carried_in_total counter
kedge_hedge_delay_line_carried_in_total 104
# HELP kedge_hedge_delay_line_period_seconds Conveyor filler round-trip times (rate(_sum)/rate(_count) is the mean period).
# TYPE kedge_hedge_delay_line_period_seconds summary
kedge_hedge_delay_line_period_seconds_sum 3
kedge_hedge_delay_line_period_seconds_count 300
# HELP kedge_hedge_delay_line_period_max_seconds Longest conveyor filler round trip since calibration.
# TYPE kedge_hedge_delay_line_period_max_seconds gauge
kedge_hedge_delay_line_period_max_seconds 0.011
# HELP kedge_hedge_delay_line_fillers Conveyor filler frames circulating.
# TYPE kedge_hedge_delay_line_fillers gauge
kedge_hedge_delay_line_fillers 83
# HELP kedge_hedge_info Always 1; the delay-line backend in use as a label.
# TYPE kedge_hedge_info gauge
kedge_hedge_info{backend="conveyor"} 1
`
	names := []string{"kedge_hedge_hedges_sent_total", "kedge_hedge_malformed_total", "kedge_hedge_malformed_responses_total",
		"kedge_hedge_short_responses_total", "kedge_hedge_redirect_errors_total", "kedge_hedge_hedge_rewrite_errors_total",
		"kedge_hedge_response_rewrite_errors_total", "kedge_hedge_delay_seconds",
		"kedge_hedge_budget_tokens", "kedge_hedge_latency_p95_seconds", "kedge_hedge_precision_p99_seconds", "kedge_hedge_delay_line_carried_in_total",
		"kedge_hedge_delay_line_period_seconds", "kedge_hedge_delay_line_period_max_seconds",
		"kedge_hedge_delay_line_fillers", "kedge_hedge_info"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// The full set registers without clashes and passes the linter.
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("gather: %v", err)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}

	failing := newCollector(func() (*Snapshot, error) { return nil, fmt.Errorf("read counters: boom") })
	freg := prometheus.NewRegistry()
	freg.MustRegister(failing)
	if _, err := freg.Gather(); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("a failing read must fail the scrape, got %v", err)
	}
}

// TestStatusFiles: status files are written atomically, read back, and those of dead pids
// (and their temporary files) are removed by the reader.
func TestStatusFiles(t *testing.T) {
	dir := t.TempDir()
	live := Status{PID: os.Getpid(), Started: time.Unix(1700000000, 0).UTC(), Interface: "eth0", Netns: "kedge-lab-demo-client",
		DelayLineNetns: "kedge-1-hedge-dl", Snapshot: fakeSnapshot()}
	if err := WriteStatus(dir, &live); err != nil {
		t.Fatal(err)
	}
	// A dead pid: one that exited before we look.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := live
	dead.PID = cmd.Process.Pid
	if err := WriteStatus(dir, &dead); err != nil {
		t.Fatal(err)
	}
	deadTmp := filepath.Join(dir, fmt.Sprintf(".hedge.%d.123.tmp", dead.PID))
	other := filepath.Join(dir, "README")
	for _, p := range []string{deadTmp, other} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// What kedge cleanup calls: only the dead pid's files go.
	removed, err := RemoveStaleStatuses(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{deadTmp, StatusPath(dir, dead.PID)}; !slices.Equal(removed, want) {
		t.Errorf("RemoveStaleStatuses removed %v, want %v", removed, want)
	}
	if err := WriteStatus(dir, &dead); err != nil { // killed again: ReadStatuses removes it too
		t.Fatal(err)
	}
	sts, err := ReadStatuses(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 1 || sts[0].PID != live.PID || sts[0].Snapshot.Services[0].Counters["hedges_sent"] != 4 ||
		sts[0].Snapshot.Calibration != live.Snapshot.Calibration {
		t.Errorf("read %+v", sts)
	}
	for _, p := range []string{StatusPath(dir, dead.PID), deadTmp} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s of a dead pid not removed (%v)", p, err)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file that is not a status file was touched: %v", err)
	}
	if sts, err := ReadStatuses(filepath.Join(dir, "none")); err != nil || sts != nil {
		t.Errorf("missing directory: %v %v", sts, err)
	}
	if removed, err := RemoveStaleStatuses(filepath.Join(dir, "none")); err != nil || removed != nil {
		t.Errorf("missing directory: removed %v, %v", removed, err)
	}
}

// TestPublishStatus: the publisher writes at once, rewrites, and removes the file when done.
func TestPublishStatus(t *testing.T) {
	dir := t.TempDir()
	n := 0
	h := &Hedger{log: testLogger(t)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	st := Status{PID: os.Getpid(), Interface: "eth0"}
	go func() {
		defer close(done)
		h.publishStatus(ctx, dir, st, 10*time.Millisecond, func() (*Snapshot, error) {
			n++
			s := fakeSnapshot()
			s.Services[0].Counters["requests"] = uint64(n)
			return s, nil
		})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sts, _ := ReadStatuses(dir)
		if len(sts) == 1 && sts[0].Snapshot.Services[0].Counters["requests"] >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status file not rewritten: %+v", sts)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if _, err := os.Stat(StatusPath(dir, st.PID)); !os.IsNotExist(err) {
		t.Errorf("status file left after the publisher stopped: %v", err)
	}
}

// TestSnapshotJSONKeys: every key of `kedge hedge stats -o json` (the status file) is
// snake_case, nested structs included.
func TestSnapshotJSONKeys(t *testing.T) {
	st := Status{PID: 1, Snapshot: fakeSnapshot()}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if !snake.MatchString(k) {
					t.Errorf("key %s.%s is not snake_case", path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
	for _, key := range []string{"target_ns", "mean_ns", "spread_ns", "fillers"} {
		if !strings.Contains(string(b), `"`+key+`"`) {
			t.Errorf("calibration key %q missing in %s", key, b)
		}
	}
}

// TestCountersOnce: a counter is either global or per service, never both, so neither the
// status file nor Prometheus shows an always-zero copy.
func TestCountersOnce(t *testing.T) {
	snap := fakeSnapshot()
	for name := range snap.Services[0].Counters {
		if _, dup := snap.Global[name]; dup {
			t.Errorf("counter %s is both global and per service", name)
		}
	}
	all := counterMap(hedgeHedgeStats{})
	if n := len(snap.Global) + len(snap.Services[0].Counters); n != len(all) {
		t.Errorf("%d counters split into global and per-service, want %d", n, len(all))
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newCollector(func() (*Snapshot, error) { return snap, nil }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		name := strings.TrimSuffix(strings.TrimPrefix(mf.GetName(), "kedge_hedge_"), "_total")
		if !slices.Contains(globalCounters, name) {
			continue
		}
		if len(mf.Metric) != 1 || len(mf.Metric[0].Label) != 0 {
			t.Errorf("%s: %d series, labels %v; want one series without labels", mf.GetName(), len(mf.Metric), mf.Metric[0].Label)
		}
	}
}

// TestCounterNamesExist: every struct hedge_stats counter the package reads by name (the
// budget warnings) is a field of the struct bpf2go generated from bpf/include/hedge.h, as
// counterMap names it: a renamed C field fails here, not as a silent zero.
func TestCounterNamesExist(t *testing.T) {
	names := counterMap(hedgeHedgeStats{})
	for _, n := range countersByName {
		if _, ok := names[n]; !ok {
			t.Errorf("counter %q is not a field of struct hedge_stats (bpf/include/hedge.h)", n)
		}
	}
}
