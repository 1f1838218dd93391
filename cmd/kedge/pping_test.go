package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/pping"
)

func TestPpingHelpHasExamples(t *testing.T) {
	cmd := newPpingCmd()
	if cmd.Example == "" || !strings.Contains(cmd.Long, "Exit codes") {
		t.Errorf("kedge pping --help lacks examples or exit codes")
	}
}

// readLines returns the JSON objects in a jsonl file (missing file: none).
func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	// The monitor may be writing while we read: only newline-terminated lines are complete.
	lines := strings.Split(string(b), "\n")
	var out []map[string]any
	for _, line := range lines[:len(lines)-1] {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: not JSON lines: %q: %v", path, line, err)
		}
		out = append(out, m)
	}
	return out
}

func hasICMP(objs []map[string]any) bool {
	for _, o := range objs {
		if o["protocol"] == "ICMP" && o["rtt"] != nil {
			return true
		}
	}
	return false
}

// TestPpingCLI runs kedge pping in a lab host while that host pings its peer: JSON lines in
// a file, the file reopened on SIGHUP (logrotate's way), counters on exit, and the
// aggregated output.
func TestPpingCLI(t *testing.T) {
	requireRoot(t)
	l, err := lab.Up(lab.Spec{Name: "ppcli", Fabric: lab.Bridge, Hosts: []string{"client", "server"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	client, server := l.Host("client"), l.Host("server")
	ping := func() {
		if _, err := client.Run("busybox", "ping", "-c", "1", "-W", "1", server.IPv4.String()); err != nil {
			t.Errorf("ping: %v", err)
		}
	}
	// pingUntil pings until cond holds; the deadline bounds it.
	pingUntil := func(what string, cond func() bool) {
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			ping()
		}
	}

	t.Run("jsonl to a file, reopened on SIGHUP", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rtt.jsonl")
		type result struct {
			code           int
			stdout, stderr string
		}
		done := make(chan result, 1)
		// Ended by SIGTERM once both files have a sample; --duration only bounds a run that
		// hangs (a fixed 6 s once had to hold two pingUntil steps of up to 5 s each).
		go func() {
			code, stdout, stderr := runCLI(t, "", "pping", "-i", "eth0", "--netns", client.Name, "-f", "jsonl",
				"-r", "0", "-w", path, "--duration", "1m", "--counters")
			done <- result{code, stdout, stderr}
		}()
		pingUntil("a sample in "+path, func() bool { return hasICMP(readLines(t, path)) })
		if err := os.Rename(path, path+".1"); err != nil {
			t.Fatal(err)
		}
		// The command handles SIGHUP from the moment it writes samples.
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		pingUntil("a sample in the reopened "+path, func() bool { return hasICMP(readLines(t, path)) })
		// Its samples are written after it handles SIGTERM (as Ctrl-C): it ends with exit 0.
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.code != exitOK {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if !strings.Contains(r.stderr, "match_rtt") || !strings.Contains(r.stderr, "HOOK") {
			t.Errorf("--counters printed no counter table:\n%s", r.stderr)
		}
		// What is left out by default, and the flag that includes it, is said at start.
		for _, want := range []string{"kedge pping: eth0 (", "timing TCP, ICMP, DNS", "(-l: include it)", "(-s: from the SYN)", "--host-acks=false"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("start notice lacks %q:\n%s", want, r.stderr)
			}
		}
		if !hasICMP(readLines(t, path+".1")) {
			t.Errorf("rotated file has no sample")
		}
	})

	t.Run("aggregate", func(t *testing.T) {
		done := make(chan string, 1)
		go func() {
			code, stdout, stderr := runCLI(t, "", "pping", "-i", "eth0", "--netns", client.Name, "-a", "1", "--duration", "2500ms")
			if code != exitOK {
				t.Errorf("exit %d: %s", code, stderr)
			}
			done <- stdout
		}()
		var out string
		for out == "" {
			select {
			case out = <-done:
			default:
				ping()
			}
		}
		// ePPing's line with the side of the interface: packets arriving and leaving, then
		// the RTTs (all of this lab's hosts are in 198.18.0.0/24): the client's requests
		// leave (tx) for the remote side, the server's replies arrive (rx) with the RTTs, and
		// either side's multicast (IGMP) may add a few.
		line := regexp.MustCompile(`: 198\.18\.0\.0/24 remote -> rxpkts=(\d+), rxbytes=\d+, txpkts=(\d+), txbytes=\d+, rtt-count=(\d+), min=`)
		m := line.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("aggregated output has no %q line:\n%s", line, out)
		}
		rx, _ := strconv.Atoi(m[1])
		tx, _ := strconv.Atoi(m[2])
		if rx < 2 || tx < 2 || m[3] == "0" {
			t.Errorf("aggregated line %q: want rxpkts and txpkts >= 2 and RTTs", m[0])
		}
	})
}

// TestPpingEPPingFlags: ePPing's option names give the same configuration as kedge's.
func TestPpingEPPingFlags(t *testing.T) {
	parse := func(args ...string) (pping.Config, pping.Format) {
		t.Helper()
		var f ppingFlags
		cmd := ppingCommand(&f)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatalf("parse %q: %v", args, err)
		}
		cfg, format, err := f.config()
		if err != nil {
			t.Fatalf("config of %q: %v", args, err)
		}
		return cfg, format
	}
	for _, tc := range [][2][]string{
		{{"-i", "eth0", "-F", "json"}, {"--interface", "eth0", "--format", "json"}},
		{{"-i", "eth0", "-f", "json"}, {"-i", "eth0", "--format", "json"}}, // kedge's old shorthand
		{{"-i", "eth0", "-a", "5", "-4", "16", "-6", "32"}, {"-i", "eth0", "--aggregate", "5", "--aggregate-subnets-v4", "16", "--aggregate-subnets-v6", "32"}},
		{{"-i", "eth0", "-I", "xdp", "-x", "native"}, {"-i", "eth0", "--ingress-hook", "xdp", "--xdp-mode", "native"}},
		{{"-i", "eth0", "--include-SYN"}, {"-i", "eth0", "-s"}},
		{{"-i", "eth0", "-a", "1", "--aggregate-timeout", "10"}, {"-i", "eth0", "--aggregate", "1", "--aggregate-timeout", "10"}},
	} {
		c1, f1 := parse(tc[0]...)
		c2, f2 := parse(tc[1]...)
		if !reflect.DeepEqual(c1, c2) || f1 != f2 {
			t.Errorf("%q and %q differ:\n%+v %v\n%+v %v", tc[0], tc[1], c1, f1, c2, f2)
		}
	}
	cfg, format := parse("-i", "eth0", "-F", "json", "-4", "16", "-I", "xdp", "-x", "generic", "--aggregate-timeout", "10", "--include-SYN")
	if format != pping.JSON || cfg.AggPrefixV4 != 16 || cfg.XDPMode != bpfx.XDPGeneric || cfg.AggTimeout != 10*time.Second || !cfg.IncludeSYN {
		t.Errorf("ePPing flags gave %+v, format %v", cfg, format)
	}
	if def, _ := parse("-i", "eth0"); !def.HostACKs || def.AggTimeout != 30*time.Second {
		t.Errorf("defaults: host ACKs %v, aggregate timeout %v", def.HostACKs, def.AggTimeout)
	}
}
