package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/pping"
	"github.com/kedge-dev/kedge/internal/probe"
	"github.com/kedge-dev/kedge/pkg/kedge"
)

func TestMain(m *testing.M) {
	// pping's kernel RTT source attaches to the cgroup2 root by default: the CLI's tests must
	// never do that (pping then runs without it, saying why).
	os.Setenv(pping.ForbidRootCgroupEnv, "1")
	code := m.Run()
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}

// checkGolden compares got with testdata/name; KEDGE_UPDATE_GOLDEN=1 rewrites the file.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("KEDGE_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (KEDGE_UPDATE_GOLDEN=1 go test ./cmd/kedge writes it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (KEDGE_UPDATE_GOLDEN=1 to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// noIface is the interface the cases name: none has it, so a case whose flags a change
// lets through stops at the interface lookup (exit 2) and never attaches to the host.
const noIface = "kedge-no-if0"

// errorCases are bad invocations of every command, by golden file: the exit code each
// must give, and (in the golden file) the text it prints, which must say what to do
// instead. None of them gets as far as changing the system: they fail on flags, arguments,
// configs, names that do not exist or state that is not there. "$TMP" in an argument is
// a fresh empty directory. A capability adds its own golden file here.
var errorCases = map[string][]errorCase{
	"errors.golden": {
		{exitUsage, []string{"frobnicate"}},
		{exitUsage, []string{"prob"}},
		{exitUsage, []string{"help", "frobnicate"}},
		{exitUsage, []string{"help", "raft", "frobnicate"}},
		{exitUsage, []string{"--bogus"}},
		{exitUsage, []string{"probe", "-o", "yaml"}},
		{exitUsage, []string{"probe", "extra"}},
		{exitUsage, []string{"probe", "--bogus"}},
		{exitUsage, []string{"cleanup", "--quiet", "-o", "json"}},
		{exitUsage, []string{"cleanup", "now"}},
		{exitUsage, []string{"version", "now"}},
		{exitUsage, []string{"version", "-o", "yaml"}},
		{exitUsage, []string{"lab"}},
		{exitUsage, []string{"lab", "frobnicate"}},
		{exitUsage, []string{"lab", "up", "--fabric", "mesh"}},
		{exitUsage, []string{"lab", "up", "--name", "my-lab"}},
		{exitUsage, []string{"lab", "up", "--hosts", " , "}},
		{exitUsage, []string{"lab", "up", "--hosts", "a,fabric"}},
		{exitUsage, []string{"lab", "up", "--hosts", "a,b,a"}},
		{exitUsage, []string{"lab", "up", "--mtu", "20"}},
		{exitUsage, []string{"lab", "up", "--mtu", "lots"}},
		{exitUsage, []string{"lab", "down"}},
		{exitUsage, []string{"lab", "down", "a/b"}},
		{exitUsage, []string{"lab", "down", "kedgetestnosuchlab"}},
		{exitUsage, []string{"lab", "exec", "demo"}},
		{exitUsage, []string{"lab", "exec", "demo", "client", "--"}},
		{exitUsage, []string{"lab", "exec", "kedgetestnosuchlab", "client", "--", "true"}},
		{exitUsage, []string{"lab", "shell", "demo"}},
		{exitUsage, []string{"lab", "list", "-o", "yaml"}},
		{exitUsage, []string{"lab", "up", "--subnet", "10.0.0.0/8"}},
		{exitUsage, []string{"lab", "up", "--subnet6", "2001:db8::/64"}},
		{exitUsage, []string{"lab", "--prefix", "kedge-42-", "list"}},
		{exitUsage, []string{"status", "now"}},
		{exitUsage, []string{"status", "-o", "yaml"}},
		{exitUsage, []string{"demo", "--count", "0"}},
		{exitUsage, []string{"demo", "tour", "extra"}},
		{exitUsage, []string{"demo", "tour", "--out", ""}},
		{exitUsage, []string{"bench"}},
		{exitUsage, []string{"bench", "frobnicate"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "nope"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "thesis,"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "rate", "--levels", "0"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "rate", "--repeats", "0"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "rate", "--repeats", "31"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "rate", "--stall", "5ms"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "outage", "--concurrency", "0"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--delay", "2s"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "-n", "10", "--concurrency", "20"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--stall-pct", "101"}},
		{exitUsage, []string{"bench", "hedge", "--out", "$TMP", "--scenario", "gc", "--pause-coverage", "0.9"}},
		{exitUsage, []string{"bench", "pping", "--out", "$TMP", "--rounds", "0"}},
		{exitUsage, []string{"bench", "pping", "extra"}},
		{exitUsage, []string{"chaos"}},
		{exitUsage, []string{"chaos", "frobnicate"}},
		{exitUsage, []string{"chaos", "client", "--mode", "kernel", "--out", "x.json"}},
		{exitUsage, []string{"chaos", "client"}},
		{exitUsage, []string{"chaos", "client", "--alt", "127.0.0.1:1", "--out", "x.json"}},
		{exitUsage, []string{"chaos", "client", "--delay", "ten", "--out", "x.json"}},
		{exitUsage, []string{"chaos", "serve", "--listen", "127.0.0.1:0,127.0.0.1:0", "--stall-pct", "60"}},
		{exitUsage, []string{"chaos", "serve", "--listen", "127.0.0.1:0", "--outage-replica", "1"}},
		{exitUsage, []string{"chaos", "serve", "-o", "yaml"}},
		{exitUsage, []string{"chaos", "serve", "--duration", "-1s"}},
		{exitUsage, []string{"chaos", "report"}},
		{exitError, []string{"chaos", "report", "$TMP/missing.json"}},
	},
	"hedge-errors.golden": hedgeErrorCases(),
	"sg-errors.golden": {
		{exitUsage, []string{"sg"}},
		{exitUsage, []string{"sg", "frobnicate"}},
		{exitUsage, []string{"sg", "worker"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000+0"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:65535+2"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--type", "float"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--loss", "2"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--values", "1,x"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--dist", "normal"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--type", "float64", "--values", "1,inf"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--type", "float64", "--frac-bits", "40", "--values", "1e10"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--type", "float32", "--reduction", "max", "--frac-bits", "8"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--type", "int64", "--frac-bits", "8"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--type", "float64", "--frac-bits", "2000"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--netns", "kedge-test-no-such-namespace"}},
		{exitUsage, []string{"sg", "scatter", "--workers", "127.0.0.1:9000"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--reduction", "avg"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--reduction", "user"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--user-object", "topk.o"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--reduction", "user", "--user-object", "topk.o", "--type", "float64"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--reduction", "user", "--user-object", "topk.o", "--resend", "10ms"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--type", "uint8"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--type", "float64", "--reduction", "max", "--frac-bits", "8"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--type", "float64", "--frac-bits", "2000"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--reduction", "mean", "--multi-packet"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--count", "0"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "-o", "yaml"}},
		{exitUsage, []string{"sg", "scatter", "-i", "kedge-no-such-if0", "--workers", "127.0.0.1:9000"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--netns", "/proc/kedge-test-no-such-path/ns/net"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--elems", "300"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--wake-socket", "--busy-poll"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--poll-spin", "20ms"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--poll-spin", "50us", "--busy-poll"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--poll-spin", "50us", "--wake-socket"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000+2", "--replicas", "127.0.0.1:9100"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--replicas", "127.0.0.1:9100", "--replica-choice", "fastest"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000+2", "--replicas", "127.0.0.1:9000+2"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--replicas", "127.0.0.1:9100", "--replicas", "127.0.0.1:9200",
			"--replicas", "127.0.0.1:9300", "--replicas", "127.0.0.1:9400"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--resend", "200ms"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--resend", "10ms", "--multi-packet"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--resend", "10ms", "--max-resends", "17"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--resend", "10ms", "--resend-ratio", "-1"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--resend", "10ms", "--pacer-backend", "fq"}},
		{exitUsage, []string{"sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--resend", "10ms", "--resend-quantile", "1.5"}},
		{exitUsage, []string{"sg", "worker", "--listen", "127.0.0.1:9000", "--threads", "-1"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--worker-threads", "0"}},
		{exitUsage, []string{"sg", "stats", "-o", "yaml"}},
		{exitUsage, []string{"sg", "stats", "extra"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--fanouts", "0"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--fanouts", "2000"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--methods", "kedge,dpdk"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--outstanding", "0"}},
		{exitUsage, []string{"bench", "sg", "extra"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--scenario", "tails"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--scenario", "tail", "--modes", "straggle,jitter"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--scenario", "tail", "--resend", "300ms"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--scenario", "tail", "--straggle-min", "0s"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--scenario", "tail", "--max-hedges", "0"}},
		{exitUsage, []string{"bench", "sg", "--out", "$TMP", "--scenario", "loopback", "--steal-retries", "-1"}},
	},
	"raftlab-errors.golden": {
		{exitUsage, []string{"raft", "lab"}},
		{exitUsage, []string{"raft", "lab", "frobnicate"}},
		{exitUsage, []string{"raft", "lab", "up", "--nodes", "4"}},
		{exitUsage, []string{"raft", "lab", "down"}},
		{exitUsage, []string{"raft", "lab", "status"}},
		{exitUsage, []string{"raft", "lab", "fault"}},
		{exitUsage, []string{"raft", "lab", "fault", "kedgetestnosuchlab", "frobnicate"}},
		{exitUsage, []string{"raft", "lab", "fault", "kedgetestnosuchlab", "partition", "1"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--nodes", "4"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--scenarios", "nope"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--trials", "0"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--offload", "on,maybe"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--tp-rounds", "0"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--peer", "zookeeper"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--failover-client", "leader,psychic"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--tp-routing", "random"}},
		{exitUsage, []string{"raft", "lab", "fault", "kedgetestnosuchlab", "stall", "2", "--write-iops", "0"}},
		{exitUsage, []string{"bench", "raft", "--out", "$TMP", "--fe-phases", "stress-disk,quake"}},
	},
	"raft-errors.golden": {
		{exitUsage, []string{"raft"}},
		{exitUsage, []string{"raft", "frobnicate"}},
		{exitUsage, []string{"raft", "serve"}},
		{exitUsage, []string{"raft", "serve", "extra"}},
		{exitUsage, []string{"raft", "serve", "--config", "testdata/raft-missing.yaml"}},
		{exitUsage, []string{"raft", "serve", "--config", "testdata/raft-bad.yaml"}},
		{exitUsage, []string{"raft", "serve", "--config", "testdata/raft-cluster.yaml"}},
		{exitUsage, []string{"raft", "serve", "--config", "testdata/raft-cluster.yaml", "--id", "9"}},
		{exitUsage, []string{"raft", "serve", "--config", "testdata/raft-cluster.yaml", "--id", "1", "--duration", "-1s"}},
		{exitUsage, []string{"raft", "serve", "--config", "testdata/raft-cluster.yaml", "--id", "1", "--offload"}},
		{exitUsage, []string{"raft", "kv"}},
		{exitUsage, []string{"raft", "kv", "frobnicate"}},
		{exitUsage, []string{"raft", "kv", "get"}},
		{exitUsage, []string{"raft", "kv", "put", "a"}},
		{exitUsage, []string{"raft", "kv", "get", "a"}},
		{exitUsage, []string{"raft", "kv", "get", "a", "--endpoints", " , "}},
		{exitUsage, []string{"raft", "kv", "get", "a", "--endpoints", "127.0.0.1:1", "--config", "testdata/raft-cluster.yaml"}},
		{exitUsage, []string{"raft", "kv", "put", "a", "b", "--expect-absent", "--endpoints", "127.0.0.1:1"}},
		{exitUsage, []string{"raft", "kv", "get", "a", "--endpoints", "127.0.0.1:1", "-o", "yaml"}},
		{exitError, []string{"raft", "kv", "get", "a", "--endpoints", "127.0.0.1:1", "--timeout", "30ms"}}, // refused, retried until the timeout: within 30 ms, once (the first pause is 50 ms)
		{exitUsage, []string{"raft", "status", "extra"}},
		{exitError, []string{"raft", "status", "--endpoints", "127.0.0.1:1"}},
	},
	"agent-errors.golden": {
		{exitUsage, []string{"agent", "extra"}},
		{exitUsage, []string{"agent", "--config", "testdata/agent-missing.yaml"}},
		{exitUsage, []string{"agent", "--config", "testdata/agent-typo.yaml"}},
		{exitUsage, []string{"agent", "check"}},
		{exitUsage, []string{"agent", "check", "testdata/agent-missing.yaml"}},
		{exitUsage, []string{"agent", "check", "testdata/agent-typo.yaml"}},
		{exitUsage, []string{"agent", "check", "testdata/agent-empty.yaml"}},
		{exitUsage, []string{"agent", "check", "testdata/agent-bad.yaml"}},
		{exitUsage, []string{"agent", "check", "testdata/agent-dup.yaml"}},
		{exitUsage, []string{"agent", "check", "testdata/hedge-bad.yaml"}},
	},
	"pping-errors.golden": {
		{exitUsage, []string{"pping"}},
		{exitUsage, []string{"pping", "extra", "-i", noIface}},
		{exitUsage, []string{"pping", "-i", noIface, "-f", "yaml"}},
		{exitUsage, []string{"pping", "-i", noIface, "-F", "yaml"}},
		{exitUsage, []string{"pping", "-f", "-i", noIface}},
		{exitUsage, []string{"pping", "-i", noIface, "-x", "native"}},
		{exitUsage, []string{"pping", "-i", noIface, "-I", "xdp", "-x", "skb"}},
		{exitUsage, []string{"pping", "-i", noIface, "--aggregate-timeout", "-1"}},
		{exitUsage, []string{"pping", "-i", noIface, "-a", "5", "-4", "33"}},
		{exitUsage, []string{"pping", "-i", noIface, "-a", "5", "-6", "65"}},
		{exitUsage, []string{"pping", "-i", noIface, "--include-SYN=maybe"}},
		{exitUsage, []string{"pping", "-i", noIface, "-t", "avg"}},
		{exitUsage, []string{"pping", "-i", noIface, "-r", "-1"}},
		{exitUsage, []string{"pping", "-i", noIface, "-R", "20000"}},
		{exitUsage, []string{"pping", "-i", noIface, "--udp-service", "9999:0"}},
		{exitUsage, []string{"pping", "-i", noIface, "--udp-service", "9999:0:12"}},
		{exitUsage, []string{"pping", "-i", noIface, "-a", "5", "--aggregate-subnets-v6", "80"}},
		{exitUsage, []string{"pping", "-i", noIface, "--duration", "-1s"}},
		{exitUsage, []string{"pping", "-i", noIface, "--tc-mode", "xdp"}},
		{exitUsage, []string{"pping", "-i", noIface, "--ingress-hook", "tcx"}},
		{exitUsage, []string{"pping", "-i", noIface, "--metrics-addr", "9464"}},
		{exitUsage, []string{"pping", "-i", noIface, "--netns", "kedge-test-no-such-namespace"}},
		{exitUsage, []string{"pping", "-i", noIface, "--netns", "/proc/kedge-test-no-such-path/ns/net"}},
		{exitUsage, []string{"pping", "-i", "kedge-no-such-if0"}},
		{exitUsage, []string{"pping", "-i", noIface, "-w", "$TMP/no-such-dir/rtt.txt"}},
		{exitUsage, []string{"pping", "-i", "kedge-no-such-if0", "--netns", "/proc/self/ns/net"}},
	},
}

// errorCase is a command line and the exit code it must give.
type errorCase struct {
	code int
	args []string
}

func hedgeErrorCases() []errorCase {
	svc := []string{"hedge", "run", "--interface", noIface, "--service", "198.18.0.12:9999"}
	with := func(more ...string) []string { return append(svc[:6:6], more...) }
	return []errorCase{
		{exitUsage, []string{"hedge"}},
		{exitUsage, []string{"hedge", "frobnicate"}},
		{exitUsage, []string{"hedge", "run"}},
		{exitUsage, []string{"hedge", "run", "extra"}},
		{exitUsage, []string{"hedge", "run", "--config", "testdata/hedge-missing.yaml"}},
		{exitUsage, []string{"hedge", "run", "--config", "testdata/hedge-bad.yaml"}},
		{exitUsage, []string{"hedge", "run", "--config", "testdata/hedge-bad.yaml", "--service", "198.18.0.12:9999"}},
		{exitUsage, []string{"hedge", "run", "--service", "198.18.0.12:9999"}},
		{exitUsage, []string{"hedge", "run", "--interface", noIface, "--service", "198.18.0.12"}},
		{exitUsage, with("--id-length", "9")},
		{exitUsage, with("--id-length", "0")},
		{exitUsage, with("--delay", "0s")},
		{exitUsage, with("--id-order", "middle")},
		{exitUsage, with("--delay", "5ms", "--delay-quantile", "0.95")},
		{exitUsage, with("--delay-max", "10ms")},
		{exitUsage, with("--delay-quantile", "0.95", "--delay-min", "60ms")},
		{exitUsage, with("--delay-quantile", "1.5")},
		{exitUsage, with("--replica", "[2001:db8::d]:9999")},
		{exitUsage, with("--budget-ratio", "2")},
		{exitUsage, with("--replica-choice", "fastest")},
		{exitUsage, with("--max-hedges", "0")},
		{exitUsage, with("--max-hedges", "2", "--replica", "198.18.0.13:9999")},
		{exitUsage, with("--store-limit", "2001")},
		{exitUsage, with("--store-limit", "-1")},
		{exitUsage, with("--backend", "fq")},
		{exitUsage, with("--duration", "-1s")},
		{exitUsage, with("--metrics-addr", "9464")},
		{exitUsage, with("--netns", "kedge-test-no-such-namespace")},
		{exitUsage, with("--netns", "/proc/kedge-test-no-such-path/ns/net")},
		{exitUsage, []string{"hedge", "run", "--interface", "kedge-no-such-if0", "--service", "198.18.0.12:9999"}},
		{exitUsage, []string{"hedge", "status", "extra"}},
		{exitUsage, []string{"hedge", "stats", "-o", "yaml"}},
		{exitOK, []string{"hedge", "stats", "--run-dir", "$TMP"}},
		{exitUsage, []string{"hedge", "stats", "--run-dir", "$TMP", "--pid", "999999999"}},
	}
}

// TestErrorsGolden runs the built kedge binary, as a user would, with every case of
// errorCases: the exit code must be the case's, and stderr what the golden file holds.
func TestErrorsGolden(t *testing.T) {
	bin := bpftest.KedgeBinary(t)
	for golden, cases := range errorCases {
		t.Run(golden, func(t *testing.T) {
			var b strings.Builder
			for _, c := range cases {
				tmp := t.TempDir()
				args := make([]string, len(c.args))
				for i, a := range c.args {
					args[i] = strings.ReplaceAll(a, "$TMP", tmp)
				}
				cmd := exec.Command(bin, args...)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				var ee *exec.ExitError
				if err != nil && !errors.As(err, &ee) {
					t.Fatalf("run kedge %s: %v", strings.Join(args, " "), err)
				}
				code := cmd.ProcessState.ExitCode()
				if code != c.code {
					t.Errorf("kedge %s: exit %d, want %d\n%s", strings.Join(args, " "), code, c.code, stderr.String())
				}
				out := strings.ReplaceAll(stdout.String()+stderr.String(), tmp, "$TMP")
				fmt.Fprintf(&b, "$ kedge %s\nexit %d\n%s\n", strings.Join(c.args, " "), code, out)
			}
			checkGolden(t, golden, b.String())
		})
	}
}

// TestExitCode: the command's mapping on top of kedge.ExitCode (tested in pkg/kedge): an
// explicit code, cilium/ebpf's ErrNotSupported, and usagef.
func TestExitCode(t *testing.T) {
	feature := &kedge.FeatureError{Feature: "qdisc netem", Hint: "load sch_netem or use --backend conveyor"}
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"usage", usagef("--x: bad"), exitUsage},
		{"wrapped usage", fmt.Errorf("run: %w", usagef("--x: bad")), exitUsage},
		{"feature", fmt.Errorf("start hedger: %w", feature), exitUnsupported},
		{"cilium/ebpf not supported", fmt.Errorf("attach tcx: %w", ebpf.ErrNotSupported), exitUnsupported},
		{"explicit", exitCodeError{7, errors.New("child exited 7")}, 7},
		{"no interface, from deep down", fmt.Errorf("start hedger: find interface \"eth9\": %w", bpfx.ErrNoInterface), exitUsage},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("%s: exitCode(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestMissingKernelFeatureExits3: on a kernel without a qdisc a delay-line backend needs,
// asking for that backend is the kernel's shortcoming, not the user's: the error names the
// feature and what to do, and maps to exit 3. The hedger is started directly (not through
// 'kedge hedge run', which also sweeps dead runs' leftovers) in a lab namespace of its own.
func TestMissingKernelFeatureExits3(t *testing.T) {
	requireRoot(t)
	r, err := probe.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var backend, qdisc string
	switch {
	case !r.Has(probe.QdiscNetem):
		backend, qdisc = hedge.BackendNetem, "netem"
	case !r.Has(probe.QdiscFq):
		backend, qdisc = hedge.BackendEDT, "fq"
	default:
		t.Skip("this kernel has every delay-line qdisc (netem and fq): no missing feature to ask for")
	}
	l, err := lab.Up(lab.Spec{Name: "feat3", Fabric: lab.Bridge, Hosts: []string{"client", "srv"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	client, srv := l.Host("client"), l.Host("srv")
	cfg := &hedge.Config{Interface: client.Iface, Services: []hedge.ServiceConfig{{Name: "kv",
		Address: netip.AddrPortFrom(srv.IPv4, 9999).String(), Delay: hedge.DelaySpec{Fixed: 10 * time.Millisecond},
		Budget: hedge.BudgetSpec{Ratio: 0.05, Burst: 10}}}}
	h, err := hedge.Start(cfg, hedge.Options{Netns: client.Handle, Backend: backend})
	if err == nil {
		h.Close()
		t.Fatalf("backend %s started although 'kedge probe' finds no qdisc %s", backend, qdisc)
	}
	err = fmt.Errorf("start hedger: %w", err) // as 'kedge hedge run' reports it
	var fe *kedge.FeatureError
	if code := exitCode(err); code != exitUnsupported || !errors.As(err, &fe) || fe.Feature != "qdisc "+qdisc ||
		!strings.Contains(err.Error(), "use backend auto or conveyor") {
		t.Errorf("backend %s without qdisc %s: exit %d, %v; want exit 3 naming the qdisc and the way out", backend, qdisc, code, err)
	}
	t.Logf("kedge: %v", err)
}

// TestBenchWithoutRoot: a benchmark run by an unprivileged user stops before building
// anything, with exit 1 and the way out (the binary runs as nobody through setpriv).
func TestBenchWithoutRoot(t *testing.T) {
	requireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to run kedge as an unprivileged user")
	}
	dir, err := os.MkdirTemp("", "kedge-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := os.ReadFile(bpftest.KedgeBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "kedge")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hedge", "pping"} {
		cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "bench", name, "--out", filepath.Join(dir, "out"))
		cmd.Dir = dir
		out, _ := cmd.CombinedOutput()
		want := "kedge: kedge bench " + name + " needs root (it creates network namespaces and loads BPF programs): run it with sudo\n"
		if code := cmd.ProcessState.ExitCode(); code != exitError || string(out) != want {
			t.Errorf("kedge bench %s as nobody: exit %d, output %q; want exit 1 and %q", name, code, out, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Errorf("bench without root created its output directory (stat: %v)", err)
	}
}

// TestErrorCasesCoverEveryCommand: every command a user can type has at least one case in
// errorCases, so a new command cannot arrive without its errors pinned.
func TestErrorCasesCoverEveryCommand(t *testing.T) {
	root := newRootCmd()
	for _, fn := range subcmdFns {
		root.AddCommand(fn())
	}
	covered := func(path []string) bool {
		for _, cases := range errorCases {
			for _, c := range cases {
				if len(c.args) >= len(path) && slices.Equal(c.args[:len(path)], path) {
					return true
				}
			}
		}
		return false
	}
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			p := append(slices.Clone(path), sub.Name())
			if !covered(p) {
				t.Errorf("kedge %s has no case in errorCases (cmd/kedge/main_test.go)", strings.Join(p, " "))
			}
			walk(sub, p)
		}
	}
	walk(root, nil)
}
