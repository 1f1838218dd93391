package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
)

// TestNetnsResolver: --netns takes a name under /run/netns or a path, and both name the
// same namespace; an interface is looked up in it.
func TestNetnsResolver(t *testing.T) {
	requireRoot(t)
	ns, err := netnsx.New(netnsx.OwnedName("clins"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	inode := func(h netns.NsHandle) uint64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Fstat(int(h), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	want := inode(ns.Handle)
	for _, arg := range []string{ns.Name, filepath.Join(netnsx.Dir, ns.Name)} {
		h, err := openNetns(arg)
		if err != nil {
			t.Fatalf("openNetns(%q): %v", arg, err)
		}
		if got := inode(h); got != want {
			t.Errorf("openNetns(%q) opened inode %d, want %d", arg, got, want)
		}
		if idx, err := findInterface(h, arg, "lo"); err != nil || idx != 1 {
			t.Errorf("findInterface(lo) in %s = %d, %v; want 1", arg, idx, err)
		}
		if _, err := findInterface(h, arg, "eth0"); exitCode(err) != exitUsage ||
			!strings.Contains(err.Error(), "in network namespace "+arg) {
			t.Errorf("findInterface(eth0) in %s = %v (exit %d), want a usage error naming the namespace", arg, err, exitCode(err))
		}
		h.Close()
	}
	if h, err := openNetns(""); err != nil || h != netns.None() {
		t.Errorf(`openNetns("") = %v, %v; want the current namespace (None)`, h, err)
	}
}

// TestFlagValues: -o and --duration are checked when parsed.
func TestFlagValues(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		output string
		d      time.Duration
		bad    string
	}{
		{nil, outputText, 0, ""},
		{[]string{"-o", "json", "--duration", "2s"}, outputJSON, 2 * time.Second, ""},
		{[]string{"-o", "table"}, outputText, 0, ""},
		{[]string{"--output=text"}, outputText, 0, ""},
		{[]string{"-o", "yaml"}, "", 0, `unknown output format "yaml": use text or json`},
		{[]string{"--duration", "-5s"}, "", 0, "-5s is negative"},
		{[]string{"--duration", "soon"}, "", 0, `invalid duration "soon"`},
	} {
		var output string
		var d time.Duration
		cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
		addOutputFlag(cmd, &output)
		addDurationFlag(cmd, &d, "stop")
		cmd.SetArgs(tc.args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		switch {
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%v: err %v, want %q", tc.args, err, tc.bad)
		case tc.bad == "" && (err != nil || output != tc.output || d != tc.d):
			t.Errorf("%v: output %q, duration %v, err %v; want %q, %v", tc.args, output, d, err, tc.output, tc.d)
		}
	}
}

// TestMetricsServer serves a collector and the process's metrics, and stops on Close.
func TestMetricsServer(t *testing.T) {
	if m, err := listenMetrics(""); m != nil || err != nil {
		t.Fatalf(`listenMetrics("") = %v, %v; want nothing`, m, err)
	}
	m, err := listenMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kedge_test_total", Help: "test"})
	c.Add(3)
	m.Serve(nil, c)
	url := "http://" + m.Addr().String() + "/metrics"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"kedge_test_total 3", "go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(url); err == nil {
		t.Errorf("metrics still served after Close")
	}
}

// TestUntilDone: --duration ends the context; 0 leaves it to signals (or the parent).
func TestUntilDone(t *testing.T) {
	ctx, cancel := untilDone(context.Background(), 50*time.Millisecond)
	defer cancel()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("--duration 50ms did not end the context")
	}
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel = untilDone(parent, 0)
	defer cancel()
	if ctx.Err() != nil {
		t.Fatal("ended before anything happened")
	}
	stop()
	<-ctx.Done()
}
