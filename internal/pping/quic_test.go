package pping

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The QUIC lab test runs a real QUIC client and server: aioquic (PyPI, pinned in
// scripts/deps.sh) from testdata/quic_peer.py, in a virtual environment scripts/deps.sh
// makes. KEDGE_QUIC_PYTHON names another interpreter that has aioquic.
const quicPythonEnv = "KEDGE_QUIC_PYTHON"

// quicSlack is how far the median spin-bit sample may exceed the shaped RTT.
const quicSlack = 10 * time.Millisecond

// quicPython returns a Python that imports aioquic, or skips the test saying how to get one.
func quicPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv(quicPythonEnv)
	if py == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Skipf("no QUIC implementation: %v (scripts/deps.sh installs aioquic)", err)
		}
		py = filepath.Join(cache, "kedge", "quic-venv", "bin", "python3")
	}
	if out, err := exec.Command(py, "-c", "import aioquic").CombinedOutput(); err != nil {
		t.Skipf("no QUIC implementation: %s cannot import aioquic (%v: %s); `make deps` (scripts/deps.sh) installs it, or set %s",
			py, err, strings.TrimSpace(string(out)), quicPythonEnv)
	}
	return py
}

// TestNetnsQUIC: a 2 MB download over QUIC (aioquic, port 443) through the shaped lab, the
// monitor on the client's interface. With the spin bit on, the samples are the RTT to the
// server (its reflections of the client's edges; the client's own turnaround is local, -l)
// and carry the server's 8-byte connection id. With both endpoints disabling the spin bit
// (a fixed value, RFC 9000 section 17.4) there is no sample, and every short-header packet
// is counted as idle.
func TestNetnsQUIC(t *testing.T) {
	py := quicPython(t)
	script, err := filepath.Abs(filepath.Join("testdata", "quic_peer.py"))
	if err != nil {
		t.Fatal(err)
	}
	l := newShapedLab(t)
	for _, tc := range []struct {
		name   string
		noSpin bool
	}{{"spin", false}, {"spin-disabled", true}} {
		t.Run(tc.name, func(t *testing.T) {
			m, col := monitorOn(t, l.client, func(c *Config) { c.RateLimit = 0 })
			args := func(a ...string) []string {
				a = append([]string{script}, a...)
				if tc.noSpin {
					a = append(a, "--no-spin")
				}
				return a
			}
			srv := l.server.Command(py, args("serve", l.server.IPv4.String(), "443")...)
			out, err := srv.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			srv.Stderr = os.Stderr
			if err := l.server.Start(srv); err != nil {
				t.Fatalf("start QUIC server: %v", err)
			}
			t.Cleanup(func() {
				_ = srv.Process.Kill()
				_ = srv.Wait()
			})
			if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "listening" {
				t.Fatalf("QUIC server: %q, %v", line, err)
			}
			probe := startPathProbe(t, l, probePort)
			got, err := l.client.Run(py, args("get", l.server.IPv4.String(), "443", "2000000")...)
			path := probe.Stop()
			if err != nil {
				t.Fatalf("QUIC client: %v", err)
			}
			if !strings.HasPrefix(got, "done 2000000 bytes") {
				t.Fatalf("QUIC client: %q", got)
			}
			all := waitAllRead(t, m, col)
			var c Counters
			for _, h := range []Hook{HookIngress, HookEgress} {
				c.QuicShort += all[h].QuicShort
				c.QuicLong += all[h].QuicLong
				c.QuicEdge += all[h].QuicEdge
				c.QuicEdgeRejected += all[h].QuicEdgeRejected
				c.QuicSpinIdle += all[h].QuicSpinIdle
				c.QuicCidChanged += all[h].QuicCidChanged
			}
			samples := col.rtts(func(e *RTTEvent) bool { return e.Flow.IDType == IDQUICSpin })
			t.Logf("%s; packets: long %d (ingress %d) short %d idle %d, edges %d rejected %d, id changes %d; %d samples",
				strings.TrimSpace(got), c.QuicLong, all[HookIngress].QuicLong, c.QuicShort, c.QuicSpinIdle, c.QuicEdge, c.QuicEdgeRejected, c.QuicCidChanged, len(samples))
			if c.QuicLong == 0 || c.QuicShort < 100 {
				t.Fatalf("%d long and %d short header packets, want the handshake and the transfer", c.QuicLong, c.QuicShort)
			}
			if tc.noSpin {
				if len(samples) != 0 || c.QuicEdge != 0 || c.QuicSpinIdle != c.QuicShort {
					t.Errorf("spin bit disabled: %d samples, %d edges, %d of %d short headers idle; want none, none, all",
						len(samples), c.QuicEdge, c.QuicSpinIdle, c.QuicShort)
				}
				return
			}
			// A spin-bit sample is the path's RTT plus the time the server takes to send its
			// next packet, a Python event loop's on a busy machine: up to quicSlack above the
			// shaped RTT, or above what the path probe measured during the transfer when the
			// machine's load made that higher (pathProbe).
			logPath(t, "quic", path)
			checkShaped(t, "quic", samples, 0, quicSlack, pathRef(path))
			server := l.server.IPv4
			for i, e := range samples {
				if e.Flow.Src.Addr() != server || e.Flow.Src.Port() != 443 || len(e.ConnID) != 8 || e.MatchOnEgress {
					t.Errorf("sample %d of %d: %s conn %x egress %v: want the server's reply at ingress, with its 8-byte connection id", i, len(samples), e.Flow, e.ConnID, e.MatchOnEgress)
					break
				}
			}
		})
	}
}
