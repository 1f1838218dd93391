package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/pping"
	"github.com/kedge-dev/kedge/internal/probe"
)

func TestMain(m *testing.M) {
	// pping units attach the kernel RTT source to the cgroup2 root by default: no test here
	// may (the units then run without it, saying why).
	os.Setenv(pping.ForbidRootCgroupEnv, "1")
	os.Exit(m.Run())
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates namespaces and loads BPF programs")
	}
}

// echo answers UDP datagrams on addr inside host by echoing them, after stall when the
// 4-byte big-endian id at the start is a multiple of 10, at once otherwise.
func echo(t *testing.T, host *lab.Host, addr netip.AddrPort, stall time.Duration) {
	t.Helper()
	var conn *net.UDPConn
	if err := host.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		for {
			buf := make([]byte, 1500)
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			reply := func() { _, _ = conn.WriteToUDPAddrPort(buf[:n], from) }
			if stall > 0 && n >= 4 && binary.BigEndian.Uint32(buf)%10 == 0 {
				time.AfterFunc(stall, reply)
			} else {
				reply()
			}
		}
	}()
}

// traffic sends requests with ids from base, one after the other, to addr from host until
// stop is closed or n were answered; it counts answers and datagrams beyond one per request.
type traffic struct {
	answered, extra, lost atomic.Int64
	done                  chan struct{}
	// extras names each extra datagram: the id it carried, the request then awaited and
	// when it came (read after done is closed), for a failure to point at the reload
	// in the log around it.
	extras []string
}

// answerWait is how long sendTraffic waits for a request's answer before counting it lost
// (and its late answer extra): 1 s, and 10 s in an emulated matrix guest, where the 6.1 guest
// on a busy host once answered one request of 5176 after more than a second.
var answerWait = func() time.Duration {
	if bpftest.InGuest() {
		return 10 * time.Second
	}
	return time.Second
}()

func sendTraffic(t *testing.T, host *lab.Host, addr netip.AddrPort, base uint32, n int, stop <-chan struct{}) *traffic {
	t.Helper()
	var conn *net.UDPConn
	if err := host.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	tr := &traffic{done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		defer conn.Close()
		buf := make([]byte, 1500)
		req := make([]byte, 32)
		for i := range n {
			select {
			case <-stop:
				return
			default:
			}
			id := base + uint32(i)
			binary.BigEndian.PutUint32(req, id)
			if _, err := conn.Write(req); err != nil {
				tr.lost.Add(1)
				continue
			}
			deadline := time.Now().Add(answerWait)
			for {
				_ = conn.SetReadDeadline(deadline)
				m, err := conn.Read(buf)
				if err != nil {
					tr.lost.Add(1)
					break
				}
				if m >= 4 && binary.BigEndian.Uint32(buf) == id {
					tr.answered.Add(1)
					break
				}
				tr.extra.Add(1)
				if m >= 4 {
					tr.extras = append(tr.extras, fmt.Sprintf("id %d while awaiting %d at %s",
						binary.BigEndian.Uint32(buf), id, time.Now().UTC().Format("15:04:05.000")))
				}
			}
		}
	}()
	return tr
}

// scrape returns the agent's metrics families.
func scrape(t *testing.T, addr string) map[string]*familyValues {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	out := map[string]*familyValues{}
	for name, mf := range mfs {
		fv := &familyValues{}
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			fv.series = append(fv.series, series{labels, v})
		}
		out[name] = fv
	}
	return out
}

type series struct {
	labels map[string]string
	value  float64
}

type familyValues struct{ series []series }

// get returns the value of the series with these labels (among others), and whether there is one.
func (f *familyValues) get(kv ...string) (float64, bool) {
	if f == nil {
		return 0, false
	}
next:
	for _, s := range f.series {
		for i := 0; i+1 < len(kv); i += 2 {
			if s.labels[kv[i]] != kv[i+1] {
				continue next
			}
		}
		return s.value, true
	}
	return 0, false
}

func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("get %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond every 50 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// requireHedger skips where the hedger cannot run (before Linux 5.17: the 5.10 matrix guest);
// there the agent reports its units unattached with the kernel it needs.
func requireHedger(t *testing.T) {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if ok, parsed := probe.KernelAtLeast(rel, hedge.MinKernelMajor, hedge.MinKernelMinor); parsed && !ok {
		t.Skipf("the hedger needs Linux %d.%d or later (BPF atomics, bpf_timer, bpf_loop); this kernel is %s",
			hedge.MinKernelMajor, hedge.MinKernelMinor, rel)
	}
}

// TestAgentReload runs the agent on a lab's client host and changes its config under
// traffic: a service added, changed and removed in place (the untouched service's traffic
// is hedged throughout and its counters only grow), a config with a typo rejected (counted,
// the running one kept), a monitor removed (its metrics gone), and readiness following a
// hedger whose interface comes, goes and comes back.
func TestAgentReload(t *testing.T) {
	requireRoot(t)
	requireHedger(t)
	l, err := lab.Up(lab.Spec{Name: "agent", Fabric: lab.Bridge, Hosts: []string{"client", "srv1", "srv2"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	client, srv1, srv2 := l.Host("client"), l.Host("srv1"), l.Host("srv2")
	addr := func(h *lab.Host, port uint16) netip.AddrPort { return netip.AddrPortFrom(h.IPv4, port) }
	for _, port := range []uint16{9001, 9002} {
		echo(t, srv1, addr(srv1, port), 300*time.Millisecond)
		echo(t, srv2, addr(srv2, port), 0)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "kedge.yaml")
	svc := func(name string, port uint16, delay string) string {
		return fmt.Sprintf("      - {name: %s, address: %q, replicas: [%q], delay: %s, budget: {ratio: 1, burst: 100}}\n",
			name, addr(srv1, port), addr(srv2, port), delay)
	}
	write := func(hedgeSvcs string, extra string) {
		t.Helper()
		doc := fmt.Sprintf("listen: 127.0.0.1:0\nretry: 200ms\nhedge:\n  - netns: %s\n    interface: eth0\n    services:\n%s%s",
			client.Name, hedgeSvcs, extra)
		if err := os.WriteFile(path+".new", []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil { // as editors and ConfigMaps do
			t.Fatal(err)
		}
	}
	pping := fmt.Sprintf("pping:\n  - {netns: %s, interface: eth0, aggregate: 200ms, udp_services: [\"9001:0:4\"]}\n", client.Name)
	withPping := ppingLoads(t)
	if !withPping {
		pping = ""
	}
	write(svc("a", 9001, "10ms"), pping)
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	hup := make(chan os.Signal, 1)
	listening := make(chan net.Addr, 2)
	ran := make(chan error, 1)
	statusDir := t.TempDir()
	rec := &logRecorder{t: t}
	log := slog.New(slog.NewTextHandler(rec, nil))
	go func() {
		ran <- Run(ctx, Options{Path: path, Config: cfg, Log: log, Reload: hup, Poll: 100 * time.Millisecond,
			Listening: func(a net.Addr) { listening <- a }, StatusDir: statusDir})
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-ran; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	base := (<-listening).String()
	ready := func() bool { code, _ := httpStatus(t, "http://"+base+"/readyz"); return code == http.StatusOK }
	// Ready means a hedger and its pacer loaded: in an emulated matrix guest a load took 8 to
	// 24 s (6.12, 6.1 with the host busy).
	loadWait := 20 * time.Second
	if bpftest.InGuest() {
		loadWait = 2 * time.Minute
	}
	waitFor(t, loadWait, "the agent to be ready", ready)
	if code, body := httpStatus(t, "http://"+base+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz %d %s", code, body)
	}

	// Service a's traffic runs throughout.
	stopTraffic := make(chan struct{})
	tr := sendTraffic(t, client, addr(srv1, 9001), 1, 100000, stopTraffic)
	count := func(m map[string]*familyValues, counter, service string) float64 {
		v, _ := m["kedge_hedge_"+counter+"_total"].get("service", service, "netns", client.Name, "interface", "eth0")
		return v
	}
	waitFor(t, 10*time.Second, "a's first hedges", func() bool { return count(scrape(t, base), "hedges_sent", "a") >= 3 })
	// The status file points other commands at this agent and lists every unit attached:
	// the hedger, and the monitor where pping loads.
	units := 1
	if withPping {
		units = 2
	}
	waitFor(t, 10*time.Second, "the agent's status file", func() bool {
		sts, _ := ReadStatuses(statusDir)
		if len(sts) != 1 || sts[0].Listen != base || len(sts[0].Units) != units {
			return false
		}
		for _, u := range sts[0].Units {
			if !u.Attached {
				return false
			}
		}
		return true
	})
	aBefore := count(scrape(t, base), "requests", "a")

	// Add b (SIGHUP): hedged at once, a untouched. The file's poll may see the change before
	// the signal is taken (a 6.1 matrix guest did): then both reload, and the count says so.
	mark := rec.lines()
	write(svc("a", 9001, "10ms")+svc("b", 9002, "10ms"), pping)
	hup <- syscall.SIGHUP
	waitFor(t, 10*time.Second, "the SIGHUP reload", func() bool { return rec.count(mark, `msg="config applied" why=SIGHUP`) == 1 })
	reloads := 2 + float64(rec.count(mark, `msg="config applied" why="the file changed"`))
	waitFor(t, 10*time.Second, "service b", func() bool { _, ok := scrape(t, base)["kedge_hedge_requests_total"].get("service", "b"); return ok })
	tb := sendTraffic(t, client, addr(srv1, 9002), 1, 40, nil)
	<-tb.done
	m := scrape(t, base)
	if tb.answered.Load() != 40 || count(m, "requests", "b") != 40 || count(m, "hedges_sent", "b") < 4 {
		t.Errorf("b: %d answered, requests %v, hedges_sent %v; want 40, 40, >= 4", tb.answered.Load(), count(m, "requests", "b"), count(m, "hedges_sent", "b"))
	}
	if v, _ := m["kedge_agent_config_reloads_total"].get("result", "success"); v != reloads {
		t.Errorf("reloads success = %v, want %v (start + SIGHUP, + the poll if it saw the file first)", v, reloads)
	}

	// A typo (the file changes: no signal needed): rejected, counted, the running config stays.
	write(svc("a", 9001, "10ms")+strings.Replace(svc("b", 9002, "10ms"), "address", "adress", 1), pping)
	waitFor(t, 10*time.Second, "the rejected reload", func() bool {
		v, _ := scrape(t, base)["kedge_agent_config_reloads_total"].get("result", "failure")
		return v == 1
	})
	if v, _ := scrape(t, base)["kedge_agent_config_last_reload_successful"].get(); v != 0 {
		t.Errorf("last_reload_successful = %v after a rejected config, want 0", v)
	}
	tb = sendTraffic(t, client, addr(srv1, 9002), 100, 20, nil)
	<-tb.done
	if got := count(scrape(t, base), "requests", "b"); got != 60 || tb.answered.Load() != 20 {
		t.Errorf("b after the rejected config: requests %v answered %d, want 60 and 20 (still hedged)", got, tb.answered.Load())
	}

	// Change b's delay, drop the monitor: b keeps its counters, pping's metrics go.
	if _, ok := scrape(t, base)["kedge_pping_counter_total"].get("netns", client.Name); withPping && !ok {
		t.Errorf("no pping metrics before the monitor's removal")
	}
	withMonitor := scrape(t, base) // for the dashboard check: pping's metrics are gone below
	write(svc("a", 9001, "10ms")+svc("b", 9002, "20ms"), "")
	waitFor(t, 10*time.Second, "b's new delay", func() bool {
		v, _ := scrape(t, base)["kedge_hedge_delay_seconds"].get("service", "b")
		return v == 0.02
	})
	if got := count(scrape(t, base), "requests", "b"); got != 60 {
		t.Errorf("b after its change: requests %v, want 60 (kept)", got)
	}
	// The hedgers change before the monitor goes (it stops once its reader has returned).
	waitFor(t, 10*time.Second, "pping's metrics to go with the monitor", func() bool {
		_, ok := scrape(t, base)["kedge_pping_counter_total"]
		return !ok
	})

	// A hedger on an interface that does not exist yet: not ready until it does, and again
	// not ready once it is gone.
	extra := "  - netns: " + client.Name + "\n    interface: kx0\n    services:\n" +
		"      - {name: x, address: \"" + addr(srv1, 9009).String() + "\"}\n"
	write(svc("a", 9001, "10ms")+svc("b", 9002, "20ms")+extra, "")
	waitFor(t, 10*time.Second, "not ready", func() bool { return !ready() })
	_, body := httpStatus(t, "http://"+base+"/readyz")
	if !strings.Contains(body, "kx0") {
		t.Errorf("readyz does not name the missing interface: %s", body)
	}
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kx0"}, PeerName: "kx1"} // no dummy module here
	nh, err := netlink.NewHandleAt(client.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	if err := nh.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkSetUp(dummy); err != nil {
		t.Fatal(err)
	}
	waitFor(t, loadWait, "ready with kx0", ready)
	if err := nh.LinkDel(dummy); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "not ready without kx0", func() bool { return !ready() })
	if v, _ := scrape(t, base)["kedge_agent_unit_attached"].get("interface", "kx0"); v != 0 {
		t.Errorf("kedge_agent_unit_attached{interface=kx0} = %v, want 0", v)
	}

	served := scrape(t, base)
	for name, f := range withMonitor {
		if _, ok := served[name]; !ok {
			served[name] = f // pping's, served while the monitor ran
		}
	}
	t.Run("dashboard", func(t *testing.T) { checkDashboard(t, served, withPping) })

	// Remove a; b stays as it is.
	close(stopTraffic)
	<-tr.done
	aTotal := count(scrape(t, base), "requests", "a")
	write(svc("b", 9002, "20ms"), "")
	waitFor(t, 10*time.Second, "a's removal", func() bool { _, ok := scrape(t, base)["kedge_hedge_requests_total"].get("service", "a"); return !ok })
	if got := count(scrape(t, base), "requests", "b"); got != 60 {
		t.Errorf("b after a's removal: requests %v, want 60", got)
	}
	if int64(aTotal) != tr.answered.Load()+tr.lost.Load() || aTotal <= aBefore || tr.lost.Load() != 0 || tr.extra.Load() != 0 {
		t.Errorf("a: requests %v (first look %v), %d answered, %d lost, %d extra datagrams: want every request counted and answered once across the reloads",
			aTotal, aBefore, tr.answered.Load(), tr.lost.Load(), tr.extra.Load())
		for _, e := range tr.extras {
			t.Logf("extra datagram: %s", e)
		}
	}
	t.Logf("a: %d requests answered across 5 reloads", tr.answered.Load())
	stop()
	if sts, _ := ReadStatuses(statusDir); len(sts) != 0 {
		t.Errorf("the agent's status file outlives it: %+v", sts)
	}
}

// checkDashboard checks that every kedge metric deploy/grafana/kedge.json queries is one the
// agent serves (pping's only when a monitor could run here).
func checkDashboard(t *testing.T, served map[string]*familyValues, withPping bool) {
	t.Helper()
	if bpftest.InGuest() {
		t.Skip("reads the repository's deploy/grafana/kedge.json, which matrix guests do not have (runs on the host)")
	}
	b, err := os.ReadFile("../../deploy/grafana/kedge.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	nameRE := regexp.MustCompile(`kedge_[a-z0-9_]+`)
	alternatives := regexp.MustCompile(`kedge_hedge_\(([a-z0-9_|]+)\)_total`)
	checked := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			names := nameRE.FindAllString(tg.Expr, -1)
			if m := alternatives.FindStringSubmatch(tg.Expr); m != nil {
				for _, n := range strings.Split(m[1], "|") {
					names = append(names, "kedge_hedge_"+n+"_total")
				}
			}
			for _, n := range names {
				if strings.HasSuffix(n, "_") || (!withPping && strings.HasPrefix(n, "kedge_pping_")) {
					continue // the prefix of a regex alternation, or pping's metrics where it cannot load
				}
				n = strings.TrimSuffix(n, "_bucket")
				if _, ok := served[n]; !ok {
					t.Errorf("dashboard panel %q queries %s, which the agent does not serve", p.Title, n)
				}
				checked++
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d metric names checked in the dashboard", checked)
	}
}

// ppingLoads reports whether this machine lets pping's programs load. Some sandboxes
// refuse its map-iterator (tracing) programs with EPERM before the verifier runs; the
// agent test then runs without a monitor, and says so.
func ppingLoads(t *testing.T) bool {
	t.Helper()
	m, err := pping.Load(pping.DefaultConfig())
	if errors.Is(err, unix.EPERM) {
		t.Logf("pping's programs cannot be loaded here (%v): the test runs without a monitor", err)
		return false
	}
	if err != nil {
		t.Fatalf("load pping: %v", err)
	}
	m.Close()
	return true
}

type testWriter struct{ t *testing.T }

// logRecorder is a testWriter that also keeps the lines, for tests that ask what the agent
// logged.
type logRecorder struct {
	t    *testing.T
	mu   sync.Mutex
	done []string
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.t.Helper()
	line := strings.TrimRight(string(p), "\n")
	r.mu.Lock()
	r.done = append(r.done, line)
	r.mu.Unlock()
	r.t.Log(line)
	return len(p), nil
}

// lines is how many lines were written so far: a mark for count.
func (r *logRecorder) lines() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.done)
}

// count is how many lines since mark contain sub.
func (r *logRecorder) count(mark int, sub string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.done[mark:] {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
