package sgbench

import (
	"io"
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

// TestRunPointSteal: a point runs again, every method, while one of its runs had steal over
// StealFlagCPUs and retries are left; the last try's rows are kept, the others set aside.
func TestRunPointSteal(t *testing.T) {
	methods := []string{"kedge", "kedge-before"}
	// steals[k] is the steal of the k-th run asked for.
	point := func(steals ...float64) func(string) (LoopRow, error) {
		k := 0
		return func(m string) (LoopRow, error) {
			if k >= len(steals) {
				t.Fatalf("run %d (%s): more runs than the test planned", k, m)
			}
			row := LoopRow{Method: m, StealCPUs: steals[k], Completed: int64(k)}
			k++
			return row, nil
		}
	}
	var log strings.Builder
	// The before arm stolen in the first try, both clean in the second.
	kept, set, err := runPoint(methods, 2, &log, point(0, 0.4, 0.02, StealFlagCPUs))
	if err != nil || len(kept) != 2 || len(set) != 2 || kept[0].Completed != 2 || kept[1].Completed != 3 ||
		set[1].StealCPUs != 0.4 || !strings.Contains(log.String(), "runs again (1 of 2)") {
		t.Fatalf("stolen once: kept %+v, set aside %+v, %v, log %q", kept, set, err, log.String())
	}
	// No retries: the stolen try is kept.
	if kept, set, _ := runPoint(methods, 0, io.Discard, point(0.5, 0)); len(kept) != 2 || len(set) != 0 || kept[0].StealCPUs != 0.5 {
		t.Fatalf("no retries: kept %+v, set aside %+v", kept, set)
	}
	// Stolen in every try: three tries, the last kept (and flagged by the table).
	if kept, set, _ := runPoint(methods, 2, io.Discard, point(0.3, 0, 0, 0.3, 0.2, 0.2)); len(kept) != 2 || len(set) != 4 || kept[0].Completed != 4 {
		t.Fatalf("always stolen: kept %+v, set aside %+v", kept, set)
	}
	// A clean first try runs once.
	if kept, set, _ := runPoint(methods, 2, io.Discard, point(0, 0)); len(kept) != 2 || len(set) != 0 {
		t.Fatalf("clean: kept %+v, set aside %+v", kept, set)
	}
	// The table says how many runs were set aside.
	var b strings.Builder
	WriteLoopTable(&b, &LoopResult{Rows: kept})
	if !strings.Contains(b.String(), "hypervisor steal: 0 of 2 runs") || strings.Contains(b.String(), "set aside") {
		t.Errorf("table without discarded runs:\n%s", b.String())
	}
	b.Reset()
	WriteLoopTable(&b, &LoopResult{Rows: kept, Discarded: make([]LoopRow, 4)})
	if !strings.Contains(b.String(), "4 runs set aside for steal") {
		t.Errorf("table with 4 discarded runs:\n%s", b.String())
	}
}
