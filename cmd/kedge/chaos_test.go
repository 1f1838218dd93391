package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
)

// runChaos runs `kedge args...` in-process (runCLI) and returns the exit code and stdout.
func runChaos(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, out, _ := runCLI(t, "", args...)
	return code, out
}

// TestChaosClientAndReport runs both Go clients through the CLI against an in-process server
// and merges their results with `kedge chaos report`.
func TestChaosClientAndReport(t *testing.T) {
	cfg := chaos.Config{StallPct: 10, Stall: 100 * time.Millisecond, Fast: time.Millisecond, TTL: 10 * time.Second}
	srv, err := chaos.Listen(cfg, []string{"127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	target := srv.Addrs()[0].String()

	dir := t.TempDir()
	base, app := filepath.Join(dir, "base.json"), filepath.Join(dir, "app.json")
	common := []string{"--target", target, "-n", "30", "--warmup", "2", "--timeout", "1s"}
	if code, out := runChaos(t, append([]string{"chaos", "client", "--mode", "baseline", "--connected", "--out", base}, common...)...); code != exitOK {
		t.Fatalf("baseline client: exit %d\n%s", code, out)
	}
	if code, out := runChaos(t, append([]string{"chaos", "client", "--mode", "apphedge", "--base-id", "1000",
		"--delay", "15ms", "--out", app}, common...)...); code != exitOK {
		t.Fatalf("apphedge client: exit %d\n%s", code, out)
	}
	r, err := bench.ReadFile(app)
	if err != nil {
		t.Fatal(err)
	}
	if s := r.Series[0]; s.Name != "app-hedged (Go)" || s.Backend != "same" || s.HedgesSent == nil || r.Parameters["delay_ms"] != 15.0 {
		t.Errorf("apphedge result %+v, parameters %v", s, r.Parameters)
	}

	charts := filepath.Join(dir, "charts")
	code, out := runChaos(t, "chaos", "report", base, app, "--stall-pct", "10", "--delay", "15ms", "--charts", charts)
	if code != exitOK {
		t.Fatalf("report: exit %d\n%s", code, out)
	}
	for _, want := range []string{"| baseline ", "| app-hedged (Go) ", "P99 reduction", "hedge excess over 15ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"cdf.png", "cdf.svg", "tail.png", "tail.svg"} {
		if _, err := os.Stat(filepath.Join(charts, f)); err != nil {
			t.Error(err)
		}
	}
	// The same file twice: series names collide.
	if code, _ := runChaos(t, "chaos", "report", base, base); code != exitUsage {
		t.Errorf("report of duplicate series: exit %d, want %d", code, exitUsage)
	}
}
