package hedge

import (
	"strings"
	"testing"
	"time"
)

func watchSnap(at time.Duration, delay time.Duration, c map[string]uint64) *Snapshot {
	return &Snapshot{Time: time.Unix(1700000000, 0).Add(at), Services: []ServiceStats{{Name: "dns", DelayNow: delay, Counters: c}}}
}

// TestBudgetWatch: the warnings of fault 4 (issue 10) - a burst too small for requests/s x
// delay, said once as soon as the rate is known; stalled requests refused by the budget,
// said when above refusedShare and at most once a minute; silence otherwise.
func TestBudgetWatch(t *testing.T) {
	svc := []ServiceConfig{{Name: "dns", Budget: BudgetSpec{Mode: BudgetBucket, Ratio: 0.05, Burst: 10}}}
	d := 5 * time.Millisecond
	type step struct {
		at       time.Duration
		counters map[string]uint64
		want     []string // substrings, one per warning; nil: no warning
	}
	tests := []struct {
		name  string
		delay time.Duration
		steps []step
		mode  string // "": bucket
	}{
		{"4k requests/s x 5 ms = 20 tokens held > burst 10: said once", d, []step{
			{0, map[string]uint64{"requests": 0}, nil},
			{2 * time.Second, map[string]uint64{"requests": 8000}, []string{`service "dns": at 4000 requests/s each 5ms delay keeps about 20 requests waiting`, "raise budget.burst (--budget-burst) above 20"}},
			{4 * time.Second, map[string]uint64{"requests": 16000}, nil},
		}, ""},
		{"window mode: R x D is never said (the allowance grows with the requests)", d, []step{
			{0, map[string]uint64{"requests": 0}, nil},
			{2 * time.Second, map[string]uint64{"requests": 8000}, nil},
		}, BudgetWindow},
		{"100 requests/s x 5 ms: covered, quiet", d, []step{
			{0, map[string]uint64{}, nil},
			{2 * time.Second, map[string]uint64{"requests": 200, "hedges_sent": 10}, nil},
		}, ""},
		{"stalled requests refused: warned, then rate-limited, then again after a minute", d, []step{
			{0, map[string]uint64{"requests": 0}, nil},
			{2 * time.Second, map[string]uint64{"requests": 200, "hedges_sent": 10, "unhedged_late": 30, "budget_exhausted": 150},
				[]string{"30 of 40 stalled requests (answered after the 5ms delay) were not hedged for lack of budget", "budget_exhausted +150", "--budget-burst, now 10", "--budget-ratio, now 0.05"}},
			{4 * time.Second, map[string]uint64{"requests": 400, "hedges_sent": 20, "unhedged_late": 60}, nil},
			{64 * time.Second, map[string]uint64{"requests": 600, "hedges_sent": 30, "unhedged_late": 90}, []string{"in the last 1m0s, 30 of 40 stalled requests"}},
		}, ""},
		{"window mode: stalled requests refused - the advice is the ratio", d, []step{
			{0, map[string]uint64{"requests": 0}, nil},
			{2 * time.Second, map[string]uint64{"requests": 200, "hedges_sent": 10, "unhedged_late": 30, "budget_exhausted": 150},
				[]string{"30 of 40 stalled requests", "raise budget.ratio (--budget-ratio, now 0.05) above the share of requests that stall"}},
		}, BudgetWindow},
		{"refusals at or below the share: quiet", d, []step{
			{0, map[string]uint64{}, nil},
			{2 * time.Second, map[string]uint64{"requests": 200, "hedges_sent": 90, "unhedged_late": 10}, nil},
		}, ""},
		{"too few stalls to judge: quiet", d, []step{
			{0, map[string]uint64{}, nil},
			{2 * time.Second, map[string]uint64{"requests": 200, "hedges_sent": 1, "unhedged_late": 8}, nil},
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := svc
			if tt.mode != "" {
				svc = []ServiceConfig{{Name: "dns", Budget: BudgetSpec{Mode: tt.mode, Ratio: 0.05, Burst: 10}}}
			}
			w := newBudgetWatch(svc)
			for _, s := range tt.steps {
				got := w.check(watchSnap(s.at, tt.delay, s.counters))
				if len(s.want) == 0 {
					if len(got) != 0 {
						t.Errorf("at %v: warnings %q, want none", s.at, got)
					}
					continue
				}
				if len(got) != 1 {
					t.Fatalf("at %v: warnings %q, want one", s.at, got)
				}
				for _, w := range s.want {
					if !strings.Contains(got[0], w) {
						t.Errorf("at %v: warning %q\nwant it to contain %q", s.at, got[0], w)
					}
				}
			}
		})
	}
}

// TestIDMismatch: the verdict on a stretch between two snapshots - silence with too few
// requests or too few responses at all, cleared when responses match, a warning naming the
// id spec when hedgeable requests get no matched response but their service's addresses
// send unmatched ones.
func TestIDMismatch(t *testing.T) {
	prev := ServiceStats{Name: "dns", Counters: map[string]uint64{"requests": 100, "responses": 90, "unmatched_responses": 5, "not_hedgeable": 3}}
	for _, tc := range []struct {
		name                                    string
		requests, notHedgeable, resp, unmatched uint64
		warn, judged                            bool
	}{
		{"too few requests", 9, 0, 0, 20, false, true},
		{"too few once the not hedgeable are taken out", 30, 21, 0, 40, false, true},
		{"responses match", 40, 0, 4, 80, false, false},
		{"wrong id: no match, unmatched responses", 40, 0, 3, 40, true, true},
		{"exactly half as many unmatched", 40, 0, 0, 20, true, true},
		{"silence: too few responses at all (a dead service)", 40, 0, 0, 19, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := ServiceStats{Name: "dns", RequestID: "offset 0, 4 bytes, big-endian", Counters: map[string]uint64{
				"requests": 100 + tc.requests, "not_hedgeable": 3 + tc.notHedgeable,
				"responses": 90 + tc.resp, "unmatched_responses": 5 + tc.unmatched}}
			msg, judged := idMismatch(cur, prev)
			if (msg != "") != tc.warn || judged != tc.judged {
				t.Fatalf("warning %q, judged %v; want warning %v, judged %v", msg, judged, tc.warn, tc.judged)
			}
			if tc.warn && (!strings.Contains(msg, "offset 0, 4 bytes") || !strings.Contains(msg, "protocol: dns")) {
				t.Errorf("warning %q names neither the id spec nor the presets", msg)
			}
		})
	}
}
