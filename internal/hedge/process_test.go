package hedge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
)

func TestMain(m *testing.M) {
	code := bpftest.CheckFDLeaks(m)
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}

func kedgeBinary(t *testing.T) string { return bpftest.KedgeBinary(t) }

// kedgeProc is a kedge process running in a lab host.
type kedgeProc struct {
	cmd    *exec.Cmd
	out    bytes.Buffer // stdout and stderr (stderr only with startKedgeStdout); read only after done
	stdout bytes.Buffer // with startKedgeStdout: stdout; read only after done
	done   chan struct{}
	err    error // from Wait
}

// startKedge starts `kedge args...` in h. The test ends it (SIGKILL, by its pid) if it is
// still running at cleanup.
func startKedge(t *testing.T, h *lab.Host, args ...string) *kedgeProc {
	t.Helper()
	return newKedgeProc(t, h, false, args)
}

// startKedgeStdout is startKedge with stdout kept apart (p.stdout) from stderr (p.out).
func startKedgeStdout(t *testing.T, h *lab.Host, args ...string) *kedgeProc {
	t.Helper()
	return newKedgeProc(t, h, true, args)
}

func newKedgeProc(t *testing.T, h *lab.Host, splitStdout bool, args []string) *kedgeProc {
	t.Helper()
	p := &kedgeProc{cmd: h.Command(kedgeBinary(t), args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if splitStdout {
		p.cmd.Stdout = &p.stdout
	}
	p.start(t, h, args)
	return p
}

func (p *kedgeProc) start(t *testing.T, h *lab.Host, args []string) {
	t.Helper()
	if err := h.Start(p.cmd); err != nil {
		t.Fatalf("start kedge %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			t.Logf("kedge %s killed at cleanup; output:\n%s", strings.Join(args, " "), p.out.String())
		}
	})
}

func (p *kedgeProc) pid() int { return p.cmd.Process.Pid }

// stop sends sig and waits up to within for the exit; it returns the exit code.
func (p *kedgeProc) stop(t *testing.T, sig syscall.Signal, within time.Duration) int {
	t.Helper()
	if err := syscall.Kill(p.pid(), sig); err != nil {
		t.Fatalf("signal pid %d: %v", p.pid(), err)
	}
	select {
	case <-p.done:
	case <-time.After(within):
		_ = syscall.Kill(p.pid(), syscall.SIGKILL)
		<-p.done
		t.Fatalf("kedge pid %d did not exit within %v of %v; output:\n%s", p.pid(), within, sig, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// runKedge runs `kedge args...` in h to completion and returns its exit code and stdout;
// stderr goes to the test log on failure.
func runKedge(t *testing.T, h *lab.Host, args ...string) (int, string) {
	t.Helper()
	cmd := h.Command(kedgeBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := h.Start(cmd); err != nil {
		t.Fatalf("start kedge %s: %v", strings.Join(args, " "), err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("kedge %s: %v", strings.Join(args, " "), err)
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Logf("kedge %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String()
}

// waitHedgerUp waits for p's status file (written once the hedger is attached).
func waitHedgerUp(t *testing.T, p *kedgeProc, within time.Duration) Status {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		b, err := os.ReadFile(StatusPath(StatusDir, p.pid()))
		if err == nil {
			var st Status
			if err := json.Unmarshal(b, &st); err != nil {
				t.Fatalf("parse status file: %v", err)
			}
			return st
		}
		select {
		case <-p.done:
			t.Fatalf("kedge hedge run exited early (%v):\n%s", p.err, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(p.pid(), syscall.SIGKILL)
			<-p.done
			t.Fatalf("no status file from pid %d within %v; output:\n%s", p.pid(), within, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitUDPEcho waits until a UDP echo server answers at addr (probeEcho).
func waitUDPEcho(t *testing.T, h *lab.Host, addr netip.AddrPort, within time.Duration) {
	t.Helper()
	probeEcho(t, h, addr, within)
}

// scrape fetches http://addr/metrics from inside h.
func scrape(t *testing.T, h *lab.Host, addr string) string {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (c net.Conn, err error) {
		err = h.Do(func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, a)
			return err
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape metrics: %v %s", err, resp.Status)
	}
	return string(b)
}

// TestHedgeRealProcesses runs everything as separate, unmodified processes, as a user
// would: `kedge hedge run --config` in the client host, `kedge chaos serve` replicas in
// srv1 (stalling 10% of ids for 300 ms) and srv2, and `kedge chaos client` (a plain
// blocking UDP client: connected over IPv4, unconnected over IPv6). The hedger must rescue
// every stalled request, the clients must see one response per request, `kedge hedge
// stats` and the Prometheus endpoint must report it, and SIGTERM must leave nothing behind.
func TestHedgeRealProcesses(t *testing.T) {
	requireRoot(t)
	l := hedgeLab(t, "hp")
	client, srv1, srv2 := l.Host("client"), l.Host("srv1"), l.Host("srv2")
	port := uint16(9999)
	v4, v4alt := netip.AddrPortFrom(srv1.IPv4, port), netip.AddrPortFrom(srv2.IPv4, port)
	v6, v6alt := netip.AddrPortFrom(srv1.IPv6, port), netip.AddrPortFrom(srv2.IPv6, port)

	cfgPath := filepath.Join(t.TempDir(), "hedge.yaml")
	cfg := fmt.Sprintf(`interface: eth0
delay_line: {backend: conveyor}
services:
  - {name: v4, address: "%s", replicas: ["%s"], delay: 10ms, budget: {ratio: 1, burst: 100}}
  - {name: v6, address: "%s", replicas: ["%s"], delay: 10ms, budget: {ratio: 1, burst: 100}, store_limit: 0}
`, v4, v4alt, v6, v6alt) // v4 takes the stored path (default store_limit), v6 the clone path
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	const metricsAddr = "127.0.0.1:9464" // the client namespace's own loopback
	hedger := startKedge(t, client, "hedge", "run", "--config", cfgPath, "--metrics-addr", metricsAddr, "--duration", "2m")
	st := waitHedgerUp(t, hedger, 15*time.Second)

	const (
		stall      = 300 * time.Millisecond
		hedgeDelay = 10 * time.Millisecond // as in the config
	)
	serve := func(h *lab.Host, pct int, addrs ...netip.AddrPort) {
		list := make([]string, len(addrs))
		for i, a := range addrs {
			list[i] = a.String()
		}
		p := startKedge(t, h, "chaos", "serve", "--listen", strings.Join(list, ","), "--stall-pct", fmt.Sprint(pct),
			"--stall", stall.String(), "--fast", "1ms", "--duration", "2m")
		t.Cleanup(func() { p.stop(t, syscall.SIGTERM, 5*time.Second) })
		for _, a := range addrs {
			waitUDPEcho(t, h, a, 5*time.Second)
		}
	}
	serve(srv1, 10, v4) // replica 0 of its own server each: ids with id%100 < 10 stall
	serve(srv1, 10, v6)
	serve(srv2, 0, v4alt, v6alt)

	const n = 100
	dir := t.TempDir()
	waitedLong := map[string]int{} // requests the client waited about the hedge delay or more for
	for _, c := range []struct {
		name      string
		target    netip.AddrPort
		base      uint32
		connected bool
	}{{"v4", v4, 1000, true}, {"v6", v6, 2000, false}} {
		out := filepath.Join(dir, c.name+".json")
		args := []string{"chaos", "client", "--mode", "baseline", "--target", c.target.String(), "-n", fmt.Sprint(n),
			"--warmup", "0", "--base-id", fmt.Sprint(c.base), "--timeout", "1s", "--name", c.name, "--out", out}
		if c.connected {
			args = append(args, "--connected")
		}
		if code, stdout := runKedge(t, client, args...); code != 0 {
			t.Fatalf("chaos client %s: exit %d\n%s", c.name, code, stdout)
		}
		r, err := bench.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		s := r.Series[0]
		stalled, worst := 0, 0.0
		for i, id := range s.IDs {
			if time.Duration(s.LatenciesUS[i])*time.Microsecond >= hedgeDelay-time.Millisecond {
				waitedLong[c.name]++
			}
			if id%100 < 10 {
				stalled++
				worst = max(worst, s.LatenciesUS[i])
				if time.Duration(s.LatenciesUS[i])*time.Microsecond >= stall {
					t.Errorf("%s id %d: %.0f us - not rescued", c.name, id, s.LatenciesUS[i])
				}
			}
		}
		t.Logf("%s (connected=%v): %d requests, %d stalled, slowest stalled request %.1f ms, %d requests took >= 9 ms, timeouts %d, late duplicates %d",
			c.name, c.connected, s.Requests(), stalled, worst/1000, waitedLong[c.name], s.Timeouts, s.LateDuplicates)
		if s.Requests() != n || s.Timeouts != 0 || s.LateDuplicates != 0 || stalled != n/10 {
			t.Errorf("%s: %d requests, %d timeouts, %d late duplicates, %d stalled; want %d, 0, 0, %d",
				c.name, s.Requests(), s.Timeouts, s.LateDuplicates, stalled, n, n/10)
		}
	}

	// `kedge hedge stats -o json` (the status file, refreshed every second) until the
	// stalled originals' late responses have been dropped too.
	var got Status
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, out := runKedge(t, client, "hedge", "stats", "--pid", fmt.Sprint(hedger.pid()), "-o", "json")
		if code != 0 {
			t.Fatalf("kedge hedge stats: exit %d", code)
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("parse stats: %v\n%s", err, out)
		}
		ok := len(got.Snapshot.Services) == 2
		for _, s := range got.Snapshot.Services {
			ok = ok && s.Counters["requests"] == n && s.Counters["duplicates_dropped"] == s.Counters["hedges_sent"]
		}
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Every stalled request is hedged and won by its hedge. A request answered later than the
	// delay for another reason (scheduling on a loaded machine) is rightly hedged too, so
	// the exact counts allow a little slack; the identities between counters do not.
	metrics := scrape(t, client, metricsAddr)
	for _, s := range got.Snapshot.Services {
		c := s.Counters
		t.Logf("%s: %v precision %+v", s.Name, c, s.Precision)
		for _, w := range []struct {
			name string
			want uint64
		}{{"requests", n}, {"responses", n}, {"duplicates_dropped", c["hedges_sent"]},
			{"responses_rewritten", c["hedges_won"]}, {"budget_exhausted", 0}} {
			if c[w.name] != w.want {
				t.Errorf("%s: %s = %d, want %d", s.Name, w.name, c[w.name], w.want)
			}
		}
		// v4 on the stored path: nothing cloned, every hedge from a tick; v6 on the clone path.
		path := map[string]uint64{"stored": n, "stored_answered": n - c["hedges_sent"] - c["overdue_dropped"], "tick_hedges": c["hedges_sent"], "clones": 0}
		if s.Name == "v6" {
			path = map[string]uint64{"clones": n, "clones_answered": n - c["hedges_sent"] - c["overdue_dropped"], "stored": 0, "tick_hedges": 0}
		}
		for name, want := range path {
			if c[name] != want {
				t.Errorf("%s: %s = %d, want %d", s.Name, name, c[name], want)
			}
		}
		if c["hedges_won"] < n/10 {
			t.Errorf("%s: hedges_won %d; want every one of the %d stalled requests won by its hedge", s.Name, c["hedges_won"], n/10)
		}
		// Answered requests are never hedged: a hedge leaves only when no response has come
		// within the delay, so each one is a request the client waited at least that long for.
		if slow := waitedLong[s.Name]; c["hedges_sent"] > uint64(slow) {
			t.Errorf("%s: %d hedges sent, but the client waited longer than %v for only %d requests",
				s.Name, c["hedges_sent"], hedgeDelay-time.Millisecond, slow)
		}
		for _, m := range []string{
			fmt.Sprintf(`kedge_hedge_hedges_sent_total{service=%q} %d`, s.Name, c["hedges_sent"]),
			fmt.Sprintf(`kedge_hedge_requests_total{service=%q} %d`, s.Name, n),
			fmt.Sprintf(`kedge_hedge_stored_total{service=%q} %d`, s.Name, c["stored"]),
			fmt.Sprintf(`kedge_hedge_delay_seconds{service=%q} 0.01`, s.Name),
		} {
			if !strings.Contains(metrics, m) {
				t.Errorf("metrics lack %q", m)
			}
		}
	}
	if !strings.Contains(metrics, `kedge_hedge_info{backend="conveyor"} 1`) {
		t.Errorf("metrics lack kedge_hedge_info")
	}
	if got.Interface != "eth0" || got.ConfigPath != cfgPath || got.Snapshot.Backend != BackendConveyor ||
		got.Snapshot.Calibration.Fillers == 0 || got.DelayLineNetns != st.DelayLineNetns {
		t.Errorf("status %+v calibration %+v", got, got.Snapshot.Calibration)
	}
	if code, out := runKedge(t, client, "hedge", "status"); code != 0 || !strings.Contains(out, fmt.Sprint(hedger.pid())) ||
		!strings.Contains(out, "conveyor") {
		t.Errorf("kedge hedge status: exit %d\n%s", code, out)
	}

	if code := hedger.stop(t, syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("kedge hedge run exited %d after SIGTERM; output:\n%s", code, hedger.out.String())
	}
	assertHedgerGone(t, client, hedger.pid(), st.DelayLineNetns)
	assertNoPrograms(t, client)
}
