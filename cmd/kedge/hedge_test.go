package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

func fakeHedgeStatus(pid int) hedge.Status {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	counters := map[string]uint64{}
	names := hedge.ServiceCounterNames()
	for i, c := range names {
		counters[c] = uint64(100 * (len(names) - i))
	}
	return hedge.Status{
		PID: pid, Started: start, ConfigPath: "/etc/kedge/hedge.yaml", Interface: "eth0",
		Netns: "kedge-lab-demo-client", DelayLineNetns: fmt.Sprintf("kedge-%d-hedge-dl", pid),
		Snapshot: &hedge.Snapshot{
			Time: start.Add(90 * time.Second), Backend: hedge.BackendConveyor, Period: 10 * time.Millisecond,
			Calibration: hedge.Calibration{Target: 10 * time.Millisecond, Mean: 10052851 * time.Nanosecond,
				Min: 9937604 * time.Nanosecond, Max: 10174077 * time.Nanosecond, Fillers: 83, Spread: 121120 * time.Nanosecond},
			Services: []hedge.ServiceStats{
				{Name: "kv", Address: "198.18.0.12:9999", Protocol: "memcached-udp", Hedgeable: `8:"get " | 8:"gets "`, Ejection: "after 3 unanswered or 10x slower, back-off 1s..30s",
					RequestID: "offset 0, 2 bytes, big-endian", Delay: "10ms", DelayNow: 10 * time.Millisecond, Tokens: 9.5,
					Counters: counters, LatencyP50: 1152 * time.Microsecond, LatencyP95: 1344 * time.Microsecond,
					LatencyP99:    9728 * time.Microsecond,
					Precision:     hedge.Precision{Samples: 6, P50: 54 * time.Microsecond, P99: 92 * time.Microsecond},
					ReplicaChoice: "p50", MaxHedges: 2, Replicas: []hedge.ReplicaStats{
						{Address: "198.18.0.12:9999", P50: 1100 * time.Microsecond},
						{Address: "198.18.0.13:9999", P50: 950 * time.Microsecond, Ejections: 1},
						{Address: "198.18.0.14:9999", Ejected: true, OutFor: 1500 * time.Millisecond, Ejections: 3, Unanswered: 2}}},
				{Name: "dns", Address: "[2001:db8::c]:53", RequestID: "offset 0, 2 bytes, big-endian", Delay: "p95 [1ms, 50ms]", DelayNow: 1984 * time.Microsecond,
					Tokens: 10, Counters: map[string]uint64{"requests": 7}, ReplicaChoice: "rr", MaxHedges: 1, Protocol: "generic", Hedgeable: "every request",
					Warning:  `service "dns": 40 requests, 0 matched responses, 40 responses from its addresses matched no request: ...`,
					Replicas: []hedge.ReplicaStats{{Address: "[2001:db8::c]:53"}}},
			},
			Global:    map[string]uint64{"malformed": 3, "malformed_responses": 2, "fragments": 0},
			DelayLine: map[string]uint64{"carried_in": 60, "carried_out": 60, "filler_passes": 4783, "period_sum_ns": 47155599835, "period_count": 4700, "period_min_ns": 8056463, "period_max_ns": 12060920},
		},
	}
}

var pidColumn = regexp.MustCompile(`PID +`)

// TestHedgeStatusAndStats: the tables of `status` and `stats` (golden), -o json round
// trips, and the choice among several running hedgers.
func TestHedgeStatusAndStats(t *testing.T) {
	dir := t.TempDir()
	me := fakeHedgeStatus(os.Getpid())
	if err := hedge.WriteStatus(dir, &me); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	var b strings.Builder
	for _, args := range [][]string{{"hedge", "status"}, {"hedge", "stats"}} {
		code, stdout, stderr := runCLI(t, "", append(args, "--run-dir", dir)...)
		if code != exitOK {
			t.Fatalf("kedge %v: exit %d: %s", args, code, stderr)
		}
		// The pid's width moves the first column: normalise it so the golden holds for any pid.
		out := pidColumn.ReplaceAllString(strings.ReplaceAll(stdout, pid, "PID"), "PID  ")
		fmt.Fprintf(&b, "$ kedge %s\n%s\n", strings.Join(args, " "), out)
	}
	checkGolden(t, "hedge-status.golden", b.String())

	code, stdout, _ := runCLI(t, "", "hedge", "stats", "--run-dir", dir, "-o", "json")
	var got hedge.Status
	if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil {
		t.Fatalf("stats -o json: exit %d, %v", code, err)
	}
	if !reflect.DeepEqual(got, me) {
		t.Errorf("stats -o json:\n%+v\nwant\n%+v", got, me)
	}

	// A second live hedger (our parent stands in for it): stats needs --pid.
	other := fakeHedgeStatus(os.Getppid())
	if err := hedge.WriteStatus(dir, &other); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, "", "hedge", "stats", "--run-dir", dir)
	if code != exitUsage || !strings.Contains(stderr, "2 hedgers are running") || !strings.Contains(stderr, "pick one with --pid") {
		t.Errorf("stats with two hedgers: exit %d: %s", code, stderr)
	}
	code, stdout, _ = runCLI(t, "", "hedge", "stats", "--run-dir", dir, "--pid", strconv.Itoa(os.Getppid()))
	if code != exitOK || !strings.Contains(stdout, fmt.Sprintf("hedger %d on eth0", os.Getppid())) {
		t.Errorf("stats --pid: exit %d:\n%s", code, stdout)
	}
	code, stdout, _ = runCLI(t, "", "hedge", "status", "--run-dir", dir, "-o", "json")
	var all []hedge.Status
	if err := json.Unmarshal([]byte(stdout), &all); code != exitOK || err != nil || len(all) != 2 {
		t.Errorf("status -o json: exit %d, %v, %d hedgers", code, err, len(all))
	}
	if code, _, stderr := runCLI(t, "", "hedge", "stats", "--run-dir", dir, "--pid", "999999999"); code != exitUsage ||
		!strings.Contains(stderr, "no hedger with pid 999999999 is running") {
		t.Errorf("stats --pid of nobody: exit %d: %s", code, stderr)
	}
	if code, stdout, _ := runCLI(t, "", "hedge", "status", "--run-dir", t.TempDir()); code != exitOK ||
		!strings.Contains(stdout, "no hedger running") {
		t.Errorf("status with none: exit %d: %s", code, stdout)
	}
}

// TestHedgeHelpHasExamples: every hedge command's --help shows examples.
func TestHedgeHelpHasExamples(t *testing.T) {
	for _, c := range []string{"run", "status", "stats"} {
		code, stdout, _ := runCLI(t, "", "hedge", c, "--help")
		if code != exitOK || !strings.Contains(stdout, "Examples:") {
			t.Errorf("kedge hedge %s --help: exit %d, no examples:\n%s", c, code, stdout)
		}
	}
}

// TestCleanupRemovesDeadHedgersStatusFiles: `kedge cleanup` removes the status file a killed
// `kedge hedge run` left (and reports it), never a live hedger's. It runs inside a
// namespace of its own, so the tc filter sweep looks at nothing but that namespace.
func TestCleanupRemovesDeadHedgersStatusFiles(t *testing.T) {
	requireRoot(t)
	ns, err := netnsx.New(netnsx.OwnedName("hclean"))
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	const deadPID = 99999999 // above any pid_max
	dir := t.TempDir()
	live, dead := hedge.StatusPath(dir, os.Getpid()), hedge.StatusPath(dir, deadPID)
	write := func(pid int) {
		t.Helper()
		if err := hedge.WriteStatus(dir, &hedge.Status{PID: pid}); err != nil {
			t.Fatal(err)
		}
	}
	cleanup := func(args ...string) (code int, stdout, stderr string) {
		t.Helper()
		_ = ns.Do(func() error {
			code, stdout, stderr = runCLI(t, "", append([]string{"cleanup", "--run-dir", dir}, args...)...)
			return nil
		})
		return code, stdout, stderr
	}

	write(os.Getpid())
	write(deadPID)
	code, stdout, stderr := cleanup("-o", "json")
	var res struct {
		StatusFiles []string `json:"status_files"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); code != exitOK || err != nil {
		t.Fatalf("cleanup -o json: exit %d, %v: %s%s", code, err, stdout, stderr)
	}
	if !slices.Contains(res.StatusFiles, dead) {
		t.Errorf("status_files = %v, want it to name %s", res.StatusFiles, dead)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("dead hedger's status file still present (stat: %v)", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live hedger's status file removed: %v", err)
	}

	write(deadPID)
	if code, stdout, stderr := cleanup(); code != exitOK || !strings.Contains(stdout, "removed status file "+dead+"\n") {
		t.Errorf("cleanup: exit %d, output %q %s; want it to report %s", code, stdout, stderr, dead)
	}
}
