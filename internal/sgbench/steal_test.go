package sgbench

import (
	"strings"
	"testing"
	"time"
)

// TestStealFlag: each run carries the steal its window measured, and the text output of both
// scenarios names exactly the runs over StealFlagCPUs.
func TestStealFlag(t *testing.T) {
	w := &clientWindow{wall: 2 * time.Second, steal: 0.31}
	w.cr.Completed = 1000
	if row := loopRow(w, 2, "kedge", 4, 32); row.StealCPUs != 0.31 {
		t.Errorf("loop row steal %v, want 0.31", row.StealCPUs)
	}
	if m := stealMark(0.31); !strings.Contains(m, "OVER") {
		t.Errorf("mark of 0.31: %q, want flagged", m)
	}
	if m := stealMark(StealFlagCPUs); strings.Contains(m, "OVER") {
		t.Errorf("mark at the threshold: %q, want not flagged", m)
	}
	loop := &LoopResult{Rows: []LoopRow{
		{Round: 1, Method: "kedge", Fanout: 4, Outstanding: 32, StealCPUs: 0.02},
		{Round: 2, Method: "kedge-before", Fanout: 16, Outstanding: 1, StealCPUs: 0.45},
	}}
	var b strings.Builder
	WriteLoopTable(&b, loop)
	out := b.String()
	if !strings.Contains(out, "1 of 2 runs over 0.10 CPUs (largest 0.45)") ||
		!strings.Contains(out, "steal 0.45 CPUs: round 2 fan-out 16 outstanding 1 kedge-before") ||
		strings.Contains(out, "round 1 fan-out 4") {
		t.Errorf("loopback table:\n%s", out)
	}
	tail := &TailResult{Rows: []TailRow{
		{Mode: ModeStraggle, Round: 3, Fanout: 64, Method: "kedge", StealCPUs: 0.2},
		{Mode: ModeLoss, Round: 1, Fanout: 16, Method: "kedge", StealCPUs: 0.1},
		{Mode: ModeLoss, Round: 2, Fanout: 16, Method: "kedge", StealCPUs: 0},
	}}
	b.Reset()
	WriteTailTable(&b, tail)
	out = b.String()
	if !strings.Contains(out, "1 of 3 runs over 0.10 CPUs (largest 0.20)") ||
		!strings.Contains(out, "steal 0.20 CPUs: straggle round 3 fan-out 64 kedge") ||
		strings.Contains(out, "loss round") {
		t.Errorf("tail table:\n%s", out)
	}
}
