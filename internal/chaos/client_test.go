package chaos

import (
	"context"
	"encoding/binary"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
)

// testFaults is the thesis's fault model with a stall long enough (1 s) that a hedged answer
// (tens of ms) and a stalled one cannot be confused even on a heavily loaded CI machine.
// Tests start their ids at testBase(k) so that each run meets a couple of stalled ids only
// (ids ending in 00 and 01), keeping the baseline runs short.
var testFaults = Config{StallPct: 2, Stall: time.Second, Fast: time.Millisecond, TTL: 30 * time.Second}

// testTimeout is the client timeout with testFaults: well above the stall.
const testTimeout = 3 * time.Second

// testBase is the first id of the k-th test run: k*10000+88, so that 2 warm-up ids come
// before the stalled ids ...00 and ...01.
func testBase(k int) uint32 { return uint32(k)*10000 + 88 }

func TestRunClient(t *testing.T) {
	skipInEmulatedGuest(t)
	srv := startServer(t, testFaults, 2)
	addrs := srv.Addrs()
	target, alt := addrs[0].String(), addrs[1].String()
	tests := []struct {
		name        string
		mode        Mode
		connected   bool
		alt         string
		concurrency int
		wantHedged  bool
	}{
		{"baseline unconnected", ModeBaseline, false, "", 1, false},
		{"baseline connected", ModeBaseline, true, "", 1, false},
		{"apphedge same replica", ModeAppHedge, false, "", 1, true},
		{"apphedge same replica connected", ModeAppHedge, true, "", 1, true},
		{"apphedge alt replica", ModeAppHedge, false, alt, 1, true},
		{"apphedge alt replica connected", ModeAppHedge, true, alt, 1, true},
		{"apphedge three loops", ModeAppHedge, false, "", 3, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // distinct id ranges: runs do not see each other's ids
			cfg := ClientConfig{Target: target, Alt: tt.alt, Connected: tt.connected, N: 40, Warmup: 2,
				BaseID: testBase(i), Timeout: testTimeout, Delay: 20 * time.Millisecond, Concurrency: tt.concurrency}
			res, err := RunClient(context.Background(), tt.mode, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Samples) != cfg.N {
				t.Fatalf("%d samples, want %d", len(res.Samples), cfg.N)
			}
			if res.Timeouts() != 0 {
				t.Fatalf("%d timeouts", res.Timeouts())
			}
			seen := map[uint32]bool{}
			stalled := 0
			for _, s := range res.Samples {
				if seen[s.ID] {
					t.Fatalf("id %d measured twice", s.ID)
				}
				seen[s.ID] = true
				if !Stalls(0, s.ID, testFaults.StallPct) {
					continue
				}
				stalled++
				switch {
				case !tt.wantHedged && s.Latency < testFaults.Stall:
					t.Errorf("id %d answered in %v, before the stall", s.ID, s.Latency)
				case tt.wantHedged && (s.Latency < cfg.Delay || s.Latency >= testFaults.Stall):
					t.Errorf("id %d answered in %v, want between the hedge delay and the stall", s.ID, s.Latency)
				}
			}
			if stalled == 0 {
				t.Fatal("no stalled id among the measured ones: the test proves nothing")
			}
			if tt.wantHedged && res.HedgesSent < stalled {
				t.Errorf("%d hedges for %d stalled ids", res.HedgesSent, stalled)
			}
			if !tt.wantHedged && res.HedgesSent != 0 {
				t.Errorf("baseline sent %d hedges", res.HedgesSent)
			}
			s := res.Series("x", "go-"+string(tt.mode), "", tt.wantHedged)
			if err := s.Validate(); err != nil {
				t.Error(err)
			}
			if (s.HedgesSent != nil) != tt.wantHedged {
				t.Errorf("series hedges_sent %v, want known: %v", s.HedgesSent, tt.wantHedged)
			}
		})
	}
}

func TestRunClientTimeout(t *testing.T) {
	srv := startServer(t, testFaults, 1)
	if err := srv.SetOutage(0, true); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{ModeBaseline, ModeAppHedge} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := ClientConfig{Target: srv.Addrs()[0].String(), N: 3, Timeout: 40 * time.Millisecond, Delay: 10 * time.Millisecond}
			res, err := RunClient(context.Background(), mode, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Timeouts() != 3 {
				t.Fatalf("%d timeouts, want 3", res.Timeouts())
			}
			for _, s := range res.Samples {
				if s.Latency < cfg.Timeout {
					t.Errorf("timed-out request recorded at %v, want >= %v", s.Latency, cfg.Timeout)
				}
			}
			if mode == ModeAppHedge && res.HedgesSent != 3 {
				t.Errorf("%d hedges, want 3", res.HedgesSent)
			}
		})
	}
}

func TestRunClientCancel(t *testing.T) {
	srv := startServer(t, testFaults, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := RunClient(ctx, ModeBaseline, ClientConfig{Target: srv.Addrs()[0].String(), N: 10, Timeout: time.Second})
	if err == nil {
		t.Fatal("cancelled run: no error")
	}
}

func TestClientConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mode Mode
		mod  func(*ClientConfig)
		ok   bool
	}{
		{"default baseline", ModeBaseline, func(*ClientConfig) {}, true},
		{"default apphedge", ModeAppHedge, func(*ClientConfig) {}, true},
		{"unknown mode", "kernel", func(*ClientConfig) {}, false},
		{"no target", ModeBaseline, func(c *ClientConfig) { c.Target = "" }, false},
		{"zero n", ModeBaseline, func(c *ClientConfig) { c.N = 0 }, false},
		{"negative warmup", ModeBaseline, func(c *ClientConfig) { c.Warmup = -1 }, false},
		{"concurrency above n", ModeBaseline, func(c *ClientConfig) { c.Concurrency = 5001 }, false},
		{"delay not below timeout", ModeAppHedge, func(c *ClientConfig) { c.Delay = c.Timeout }, false},
		{"zero delay", ModeAppHedge, func(c *ClientConfig) { c.Delay = 0 }, false},
		{"baseline with alt", ModeBaseline, func(c *ClientConfig) { c.Alt = "127.0.0.1:2" }, false},
		{"short payload", ModeBaseline, func(c *ClientConfig) { c.PayloadLen = 3 }, false},
		{"last id is 2^32-1", ModeBaseline, func(c *ClientConfig) { c.BaseID = 1<<32 - 5200 }, true},
		{"ids overflow", ModeBaseline, func(c *ClientConfig) { c.BaseID = 1<<32 - 5199 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultClientConfig("127.0.0.1:1")
			tt.mod(&c)
			if err := c.Validate(tt.mode); (err == nil) != tt.ok {
				t.Errorf("Validate = %v, want ok %v", err, tt.ok)
			}
		})
	}
}

func TestLoopIDRanges(t *testing.T) {
	tests := []struct {
		total, c int
		span     uint64
		shares   []int
	}{
		{5200, 1, 5200, []int{5200}},
		{5200, 3, 1800, []int{1734, 1733, 1733}},
		{10, 4, 100, []int{3, 3, 2, 2}},
	}
	for _, tt := range tests {
		if got := loopSpan(tt.total, tt.c); got != tt.span {
			t.Errorf("loopSpan(%d, %d) = %d, want %d", tt.total, tt.c, got, tt.span)
		}
		sum := 0
		for k, want := range tt.shares {
			got := share(tt.total, tt.c, k)
			sum += got
			if got != want {
				t.Errorf("share(%d, %d, %d) = %d, want %d", tt.total, tt.c, k, got, want)
			}
		}
		if sum != tt.total {
			t.Errorf("shares of %d over %d add up to %d", tt.total, tt.c, sum)
		}
	}
}

// TestPythonClient runs clients/apphedge.py against the server and checks that its result
// file follows the bench schema and that it rescued the stalled ids.
func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: the Python client is not tested")
	}
	srv := startServer(t, testFaults, 2)
	addrs := srv.Addrs()
	tests := []struct {
		name string
		args []string
	}{
		{"apphedge same replica", []string{"--mode", "apphedge"}},
		{"apphedge alt replica connected", []string{"--mode", "apphedge", "--alt", addrs[1].String(), "--connected", "--concurrency", "2"}},
		{"baseline", []string{"--mode", "baseline", "--name", "py-base"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "py.json")
			args := append([]string{"../../clients/apphedge.py", "--target", addrs[0].String(), "-n", "40", "--warmup", "2",
				"--delay", "20ms", "--timeout", testTimeout.String(), "--base-id", strconv.Itoa(int(testBase(100 + i))), "--out", out}, tt.args...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, py, args...)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("apphedge.py: %v\n%s", err, b)
			}
			r, err := bench.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Series) != 1 || r.Series[0].Requests() != 40 || r.Series[0].Timeouts != 0 {
				t.Fatalf("series %+v", r.Series)
			}
			s := r.Series[0]
			hedging := tt.args[1] == "apphedge"
			if (s.HedgesSent != nil) != hedging {
				t.Errorf("hedges_sent %v for mode %s", s.HedgesSent, tt.args[1])
			}
			for j, id := range s.IDs {
				if !Stalls(0, id, testFaults.StallPct) {
					continue
				}
				lat := time.Duration(s.LatenciesUS[j] * 1e3)
				if hedging != (lat < testFaults.Stall) {
					t.Errorf("stalled id %d answered in %v (hedging %v)", id, lat, hedging)
				}
			}
		})
	}
}

// scriptedLoop answers the ids in ok, each at once.
type scriptedLoop struct {
	ok map[uint32]bool
	lateLog
}

func (l *scriptedLoop) start() error { return nil }
func (l *scriptedLoop) do(_ []byte, id uint32) (time.Duration, bool, error) {
	return time.Millisecond, l.ok[id], nil
}
func (l *scriptedLoop) hedges() int  { return 0 }
func (l *scriptedLoop) reset()       { l.lateLog = lateLog{} }
func (l *scriptedLoop) close() error { return nil }

// TestDuplicatesOfAnsweredOnly: of the responses to other requests than the awaited one,
// only those whose request was answered count as duplicates (warm-up requests included);
// one for a timed-out request is late, one without an id or of another loop's range is
// neither.
func TestDuplicatesOfAnsweredOnly(t *testing.T) {
	const first = 1000
	l := &scriptedLoop{ok: map[uint32]bool{first: true, first + 2: true, first + 3: true}}
	id := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	// The responses arrive while the last request is awaited, after the warm-up (2).
	res, err := runLoop(context.Background(), &strayAfterWarmup{scriptedLoop: l, at: first + 3, strays: [][]byte{
		id(first),     // warm-up request, answered: a duplicate
		id(first + 1), // warm-up request, timed out: late
		id(first + 2), // answered: a duplicate
		id(first + 4), // timed out: late
		id(99),        // not this loop's: late
		{1, 2},        // no id: late
	}}, first, 2, 3, 8)
	if err != nil {
		t.Fatal(err)
	}
	if res.LateDuplicates != 6 || res.Duplicates != 2 {
		t.Errorf("late %d, duplicates %d; want 6 late, 2 of them duplicates", res.LateDuplicates, res.Duplicates)
	}
	if s := (ClientResult{Duplicates: 2}).Series("x", "go-baseline", "", false); s.Duplicates != 2 {
		t.Errorf("series duplicates %d, want 2", s.Duplicates)
	}
}

// strayAfterWarmup delivers strays while request at is awaited.
type strayAfterWarmup struct {
	*scriptedLoop
	at     uint32
	strays [][]byte
}

func (l *strayAfterWarmup) do(pkt []byte, id uint32) (time.Duration, bool, error) {
	if id == l.at {
		for _, b := range l.strays {
			l.stray(b)
		}
	}
	return l.scriptedLoop.do(pkt, id)
}
