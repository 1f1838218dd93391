package agent

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRunIdleReload runs the agent on a config that declares nothing (the packaged default):
// it is ready and healthy at once; a reload that changes listen moves the endpoint; a config
// that does not validate is counted and ignored, on SIGHUP as on a change of the file.
func TestRunIdleReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kedge.yaml")
	write := func(doc string) {
		t.Helper()
		// Written aside and renamed, so the agent's poller never reads a half-written file.
		if err := os.WriteFile(path+".new", []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	write("listen: 127.0.0.1:0\nhedge: []\n")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hup := make(chan os.Signal, 1)
	listening := make(chan net.Addr, 2)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Path: path, Config: cfg, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
			Reload: hup, Poll: 50 * time.Millisecond, Listening: func(a net.Addr) { listening <- a }})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	first := (<-listening).String()
	waitFor(t, 5*time.Second, "an idle agent to be ready", func() bool {
		code, _ := httpStatus(t, "http://"+first+"/readyz")
		return code == http.StatusOK
	})
	if code, _ := httpStatus(t, "http://"+first+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz: %d", code)
	}

	// A bad config: the file poller rejects it once; SIGHUP re-reads the same file and rejects it
	// again (the poller does not, the file is unchanged). The endpoint stays.
	failures := func() float64 {
		v, _ := scrape(t, first)["kedge_agent_config_reloads_total"].get("result", "failure")
		return v
	}
	write("listen: 127.0.0.1:0\nhedge: []\nretyr: 1s\n")
	waitFor(t, 5*time.Second, "the file change to be rejected", func() bool { return failures() == 1 })
	hup <- syscall.SIGHUP
	waitFor(t, 5*time.Second, "the SIGHUP to be rejected", func() bool { return failures() == 2 })
	if code, _ := httpStatus(t, "http://"+first+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz after a rejected reload: %d", code)
	}
	// A valid change of listen: the endpoint moves.
	write("listen: localhost:0\nhedge: []\n")
	var second string
	select {
	case a := <-listening:
		second = a.String()
	case <-time.After(5 * time.Second):
		t.Fatal("listen changed, but the agent did not move")
	}
	// The new listener serves before the reload that opened it is counted: wait for the count.
	successes := func() float64 {
		v, _ := scrape(t, second)["kedge_agent_config_reloads_total"].get("result", "success")
		return v
	}
	waitFor(t, 5*time.Second, "the listen change to be counted", func() bool { return successes() >= 2 })
	m := scrape(t, second)
	if ok, _ := m["kedge_agent_config_reloads_total"].get("result", "success"); ok != 2 {
		t.Errorf("reloads success %v, want 2 (start, listen change)", ok)
	}
	if v, _ := m["kedge_agent_config_last_reload_successful"].get(); v != 1 {
		t.Errorf("last_reload_successful %v, want 1", v)
	}
	if _, err := http.Get("http://" + first + "/healthz"); err == nil {
		t.Errorf("the old address %s still answers", first)
	}
}
