package main

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/runstate"
	isg "github.com/kedge-dev/kedge/internal/sg"
	"github.com/kedge-dev/kedge/pkg/sg"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSgCollector(t *testing.T) {
	c := newSgCollector(func() (sg.Stats, error) {
		return sg.Stats{Requests: 7, Completed: 5, Timeouts: 1, Duplicates: 2, Late: 3, Malformed: 4, SlotBusy: 6, Continued: 9, ResendLateNs: 2500000}, nil
	}, func() int { return 2 }, func() (sg.ResendState, error) {
		return sg.ResendState{Delay: 1500 * time.Microsecond, Estimate: 1500 * time.Microsecond, Budget: 31.5}, nil
	})
	want := `
# HELP kedge_sg_completed_total sg data-plane counter completed (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_completed_total counter
kedge_sg_completed_total 5
# HELP kedge_sg_continued_total sg data-plane counter continued (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_continued_total counter
kedge_sg_continued_total 9
# HELP kedge_sg_duplicates_total sg data-plane counter duplicates (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_duplicates_total counter
kedge_sg_duplicates_total 2
# HELP kedge_sg_late_total sg data-plane counter late (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_late_total counter
kedge_sg_late_total 3
# HELP kedge_sg_malformed_total sg data-plane counter malformed (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_malformed_total counter
kedge_sg_malformed_total 4
# HELP kedge_sg_requests_in_flight Requests whose slot is in use (Scatter called, result not read yet).
# TYPE kedge_sg_requests_in_flight gauge
kedge_sg_requests_in_flight 2
# HELP kedge_sg_requests_total sg data-plane counter requests (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_requests_total counter
kedge_sg_requests_total 7
# HELP kedge_sg_resend_budget_copies Re-sent copies the budget would pay for now.
# TYPE kedge_sg_resend_budget_copies gauge
kedge_sg_resend_budget_copies 31.5
# HELP kedge_sg_resend_delay_seconds The delay a round of re-sends is due after: the estimate clamped to [resend-min, resend], or resend (docs/sg.md).
# TYPE kedge_sg_resend_delay_seconds gauge
kedge_sg_resend_delay_seconds 0.0015
# HELP kedge_sg_resend_late_seconds_total sg data-plane counter resend_late_ns (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_resend_late_seconds_total counter
kedge_sg_resend_late_seconds_total 0.0025
# HELP kedge_sg_slot_busy_total sg data-plane counter slot_busy (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_slot_busy_total counter
kedge_sg_slot_busy_total 6
# HELP kedge_sg_timeouts_total sg data-plane counter timeouts (bpf/include/sg.h struct sg_stats, docs/sg.md).
# TYPE kedge_sg_timeouts_total counter
kedge_sg_timeouts_total 1
`
	names := []string{"kedge_sg_completed_total", "kedge_sg_continued_total", "kedge_sg_duplicates_total", "kedge_sg_late_total",
		"kedge_sg_malformed_total", "kedge_sg_requests_in_flight", "kedge_sg_requests_total", "kedge_sg_resend_budget_copies",
		"kedge_sg_resend_delay_seconds", "kedge_sg_resend_late_seconds_total", "kedge_sg_slot_busy_total", "kedge_sg_timeouts_total"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != len(c.counters)+4 {
		t.Errorf("%d metrics, want %d", n, len(c.counters)+4)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}
	failing := newSgCollector(func() (sg.Stats, error) { return sg.Stats{}, errors.New("map gone") }, func() int { return 0 },
		func() (sg.ResendState, error) { return sg.ResendState{}, errors.New("budget gone") })
	if err := testutil.CollectAndCompare(failing, strings.NewReader("")); err == nil || !strings.Contains(err.Error(), "map gone") {
		t.Errorf("a failing read: %v, want its error", err)
	}
}

// TestSgStatsTable: `kedge sg stats` shows a running coordinator's counters, continued
// (batches handed on) among them, and -o json carries every counter.
func TestSgStatsTable(t *testing.T) {
	dir := t.TempDir()
	me, err := runstate.Self()
	if err != nil {
		t.Fatal(err)
	}
	counters, _ := json.Marshal(sg.Stats{Requests: 20, Continued: 300, Completed: 19, Timeouts: 1, Replies: 20480, Duplicates: 2})
	if err := runstate.WriteStatus(dir, isg.Capability, me.ID, &isg.Status{Owner: me.ID, PID: os.Getpid(),
		Interface: "eth0", Workers: 1024, Stats: counters}); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "", "sg", "stats", "--run-dir", dir)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("want a header and one row:\n%s", stdout)
	}
	head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	got := map[string]string{}
	for i, h := range head {
		if i < len(row) {
			got[h] = row[i]
		}
	}
	for col, want := range map[string]string{"WORKERS": "1024", "REQUESTS": "20", "CONTINUED": "300", "COMPLETED": "19", "TIMEOUTS": "1", "REPLIES": "20480", "DUPLICATES": "2"} {
		if got[col] != want {
			t.Errorf("column %s = %q, want %s:\n%s", col, got[col], want, stdout)
		}
	}
	code, stdout, _ = runCLI(t, "", "sg", "stats", "--run-dir", dir, "-o", "json")
	var entries []struct {
		Stats sg.Stats `json:"stats"`
	}
	if err := json.Unmarshal([]byte(stdout), &entries); code != exitOK || err != nil || len(entries) != 1 || entries[0].Stats.Continued != 300 {
		t.Errorf("-o json: exit %d, %v: %s", code, err, stdout)
	}
}

// TestPollSpinFlag: --poll-spin as Config.PollSpin. 0 must turn polling off, not pick
// pkg/sg's default (Config.PollSpin 0), and the default is the library's.
func TestPollSpinFlag(t *testing.T) {
	for _, c := range []struct {
		args    []string
		want    time.Duration
		wantErr string
	}{
		{nil, sg.DefaultPollSpin, ""},
		{[]string{"--poll-spin", "0"}, -1, ""},
		{[]string{"--poll-spin", "-5us"}, -1, ""},
		{[]string{"--poll-spin", "50us"}, 50 * time.Microsecond, ""},
		{[]string{"--poll-spin", "0", "--busy-poll"}, -1, ""},
		{[]string{"--poll-spin", "50us", "--busy-poll"}, 0, "--busy-poll"},
		{[]string{"--poll-spin", "11ms"}, 0, "want at most 10ms"},
	} {
		cmd := newSgScatterCmd()
		if err := cmd.Flags().Parse(c.args); err != nil {
			t.Fatal(err)
		}
		d, _ := cmd.Flags().GetDuration("poll-spin")
		busy, _ := cmd.Flags().GetBool("busy-poll")
		got, err := pollSpinFlag(cmd, d, busy, false)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v: error %v, want one containing %q", c.args, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: PollSpin %v (error %v), want %v", c.args, got, err, c.want)
		}
	}
}
