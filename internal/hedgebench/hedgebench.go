// Package hedgebench runs the Deterministic Chaos benchmark (thesis chapter 4, Table 4.2)
// in a kedge lab: the chaos server and every client are real processes in their own
// network namespaces, and the kernel-hedged client is the baseline client's code run while
// kedge's hedger is attached to the client's interface.
package hedgebench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/lab"
)

// Scenarios.
const (
	Thesis   = "thesis"   // Table 4.2: one server, hedge to the same address
	Pressure = "pressure" // the same under CPU pressure (spinning processes on every core)
	GC       = "gc"       // the clients stop the world (SIGSTOP pauses), the server stalls as in thesis
	Adaptive = "adaptive" // kernel hedging with a p95 delay instead of a fixed 10 ms
	Outage   = "outage"   // two replicas, the addressed one down: the budget holds extra load
	Rate     = "rate"     // concurrent clients at a high rate: fast-path cost and throughput (RunRate)
)

// Scenarios lists every scenario in the order `--scenario all` runs them.
var Scenarios = []string{Thesis, Pressure, GC, Adaptive, Outage, Rate, Memcached}

// Options configure a run. Zero values take the thesis's Table 4.1 parameters.
type Options struct {
	Scenario string
	N        int           // measured requests per client (5000; outage 1000)
	Warmup   int           // discarded first (200; outage 20)
	Delay    time.Duration // hedge threshold (10 ms)
	Timeout  time.Duration // client timeout (1 s; outage 100 ms)
	// Concurrency is the number of sequential loops per client (1; outage 4).
	Concurrency int
	// Server is the chaos server's stall model (2% x 400 ms, 2 ms fast path, TTL 1 s;
	// outage: no stalls). Server.Stall == 0 selects the scenario's default.
	Server chaos.Config
	// Pauses are the gc scenario's client pauses (DefaultPauses when zero).
	Pauses   PauseSpec
	Backend  string // delay-line backend (auto)
	Exe      string // the kedge binary (default: this executable)
	Python   string // python3
	PyClient string // clients/apphedge.py (default: found next to the checkout)
	OutDir   string // result.json and charts
	Log      *slog.Logger
}

// ParamError is a parameter out of range: the caller's mistake, reported before anything
// is set up.
type ParamError struct{ Err error }

func (e *ParamError) Error() string { return e.Err.Error() }
func (e *ParamError) Unwrap() error { return e.Err }

func paramErrorf(format string, args ...any) error {
	return &ParamError{fmt.Errorf(format, args...)}
}

// CheckScenario returns an error naming the valid scenarios when s is not one of them.
func CheckScenario(s string) error {
	if !slices.Contains(Scenarios, s) {
		return paramErrorf("unknown scenario %q: use one of %s, or all", s, strings.Join(Scenarios, ", "))
	}
	return nil
}

// Defaults returns the parameters scenario runs with when Options leaves them zero.
func Defaults(scenario string) Options {
	o := Options{Scenario: scenario, N: 5000, Warmup: 200, Delay: 10 * time.Millisecond,
		Timeout: time.Second, Concurrency: 1, Server: chaos.DefaultConfig()}
	if scenario == Outage {
		// Every request to the downed replica waits for a hedge or the timeout: a short
		// timeout and a few loops keep the run near a minute. No stalls, so that every
		// failure is the outage's.
		o.N, o.Warmup, o.Timeout, o.Concurrency = 1000, 20, 100*time.Millisecond, 4
		o.Server.StallPct = 0
	}
	return o
}

func (o *Options) defaults() error {
	if o.Scenario == "" {
		o.Scenario = Thesis
	}
	if err := CheckScenario(o.Scenario); err != nil {
		return err
	}
	if o.Scenario == Rate || o.Scenario == Memcached {
		return fmt.Errorf("scenario %s has its own driver: use RunRate or RunMemcached", o.Scenario)
	}
	d := Defaults(o.Scenario)
	if o.N == 0 {
		o.N = d.N
	}
	if o.Warmup == 0 {
		o.Warmup = d.Warmup
	}
	if o.Delay == 0 {
		o.Delay = d.Delay
	}
	if o.Timeout == 0 {
		o.Timeout = d.Timeout
	}
	if o.Concurrency == 0 {
		o.Concurrency = d.Concurrency
	}
	if o.Server.Stall == 0 {
		o.Server = d.Server
	}
	if o.Scenario == GC {
		if o.Pauses == (PauseSpec{}) {
			o.Pauses = DefaultPauses()
		}
		if err := o.Pauses.Validate(); err != nil {
			return err
		}
	}
	switch {
	case o.N < 1 || o.Warmup < 0:
		return paramErrorf("%d requests, %d warm-up: need at least 1 request", o.N, o.Warmup)
	case o.Concurrency < 1 || o.Concurrency > o.N:
		return paramErrorf("concurrency %d out of range 1-%d (the number of requests)", o.Concurrency, o.N)
	case o.Delay <= 0 || o.Delay >= o.Timeout:
		return paramErrorf("hedge delay %v must be positive and below the timeout %v", o.Delay, o.Timeout)
	}
	replicas := 1
	if o.Scenario == Outage {
		replicas = 2
	}
	if err := o.Server.Validate(replicas); err != nil {
		return &ParamError{fmt.Errorf("chaos server: %w", err)}
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find kedge executable: %w", err)
		}
		o.Exe = exe
	}
	if o.Python == "" {
		o.Python = "python3"
	}
	if o.PyClient == "" {
		o.PyClient = findPyClient(o.Exe)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join("results", "hedge", o.Scenario)
	}
	return os.MkdirAll(o.OutDir, 0o755)
}

// findPyClient looks for clients/apphedge.py in the working directory and next to the binary.
func findPyClient(exe string) string { return findClient("apphedge.py", exe) }

// findClient looks for the file name under clients/ in the working directory and next to
// the binary exe (this executable when exe is empty).
func findClient(name string, exe ...string) string {
	if len(exe) == 0 {
		self, _ := os.Executable()
		exe = []string{self}
	}
	for _, c := range []string{filepath.Join("clients", name), filepath.Join(filepath.Dir(exe[0]), "..", "clients", name)} {
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	return ""
}

const svcPort = 9999

// benchLab brings up the benchmark's lab: a client and a server host on a bridge, and
// two service addresses on the server (ports 9999 and 9998).
func benchLab() (l *lab.Lab, client, srv *lab.Host, a, b netip.AddrPort, err error) {
	if l, err = lab.Up(lab.Spec{Name: "bench", Fabric: lab.Bridge, Hosts: []string{"client", "srv1"}}); err != nil {
		return
	}
	client, srv = l.Host("client"), l.Host("srv1")
	return l, client, srv, netip.AddrPortFrom(srv.IPv4, svcPort), netip.AddrPortFrom(srv.IPv4, svcPort-1), nil
}

// Run runs one scenario and returns the merged result (also written to OutDir).
func Run(ctx context.Context, o Options) (bench.Result, error) {
	var res bench.Result
	if err := o.defaults(); err != nil {
		return res, err
	}
	// The second address is the second replica of the outage scenario: the hedger
	// rewrites the destination port as it would an address.
	l, client, srv, target, alt, err := benchLab()
	if err != nil {
		return res, err
	}
	defer l.Close()
	listen, extra := []netip.AddrPort{target}, []string(nil)
	if o.Scenario == Outage {
		listen, extra = append(listen, alt), []string{"--outage-replica", "0"}
	}

	stopSrv, err := startServer(o, srv, listen, extra...)
	if err != nil {
		return res, err
	}
	defer stopSrv()
	// The last replica is up in every scenario (in outage, replica 0 answers nothing).
	if err := waitReady(ctx, client, listen[len(listen)-1]); err != nil {
		return res, err
	}
	if o.Scenario == Pressure {
		stop, err := bench.Spin(runtime.NumCPU())
		if err != nil {
			return res, err
		}
		defer stop()
	}

	type run struct {
		name, file string
		args       []string
		python     bool
		hedged     *hedge.Config
	}
	common := func(base uint32) []string {
		return []string{"--target", target.String(), "-n", fmt.Sprint(o.N), "--warmup", fmt.Sprint(o.Warmup),
			"--timeout", o.Timeout.String(), "--base-id", fmt.Sprint(base), "--scenario", o.Scenario,
			"--concurrency", fmt.Sprint(o.Concurrency)}
	}
	var appAlt []string
	if o.Scenario == Outage {
		appAlt = []string{"--alt", alt.String()}
	}
	runs := []run{
		{name: "baseline", file: "baseline.json", args: append([]string{"chaos", "client", "--mode", "baseline", "--name", "baseline"}, common(1_000_000)...)},
		{name: "app-hedged (Python)", file: "apphedge-py.json", python: true, args: append(append([]string{"--mode", "apphedge", "--delay", o.Delay.String(), "--name", "app-hedged (Python)"}, appAlt...), common(2_000_000)...)},
		{name: "app-hedged (Go)", file: "apphedge-go.json", args: append(append([]string{"chaos", "client", "--mode", "apphedge", "--delay", o.Delay.String(), "--name", "app-hedged (Go)"}, appAlt...), common(3_000_000)...)},
	}
	kernelRun := func(name, file string, base uint32, budget hedge.BudgetSpec) run {
		svc := hedge.ServiceConfig{Name: "chaos", Address: target.String(),
			Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: budget}
		if o.Scenario == Outage {
			svc.Replicas = []string{alt.String()}
		}
		cfg := &hedge.Config{Interface: client.Iface, DelayLine: hedge.DelayLineConfig{Backend: o.Backend},
			Services: []hedge.ServiceConfig{svc}}
		if o.Scenario == Adaptive {
			cfg.Services[0].Delay = hedge.DelaySpec{Quantile: 0.95, Min: 3 * time.Millisecond, Max: 50 * time.Millisecond, MinSamples: 100}
			cfg.Tick = hedge.Duration(time.Second)
		}
		return run{name: name, file: file, hedged: cfg,
			args: append([]string{"chaos", "client", "--mode", "baseline", "--connected", "--name", name}, common(base)...)}
	}
	defaultBudget := hedge.BudgetSpec{Ratio: 0.05, Burst: 10}
	if o.Scenario == Outage {
		// The default budget, and a tenfold one: what the budget trades for availability.
		runs = append(runs,
			kernelRun("kernel-hedged (budget 5%)", "kernel.json", 4_000_000, defaultBudget),
			kernelRun("kernel-hedged (budget 50%)", "kernel-b50.json", 5_000_000, hedge.BudgetSpec{Ratio: 0.5, Burst: 10}))
	} else {
		runs = append(runs, kernelRun("kernel-hedged", "kernel.json", 4_000_000, defaultBudget))
	}
	if o.PyClient == "" {
		o.Log.Warn("clients/apphedge.py not found: skipping the Python app-hedged client (run from the repository root)")
	}

	var sched []Pause
	pauses := map[string]PauseRecord{}
	if o.Scenario == GC {
		sched = o.Pauses.Schedule(scheduleHorizon)
	}
	var parts []bench.Result
	for _, r := range runs {
		if r.python && o.PyClient == "" {
			continue
		}
		path := filepath.Join(o.OutDir, r.file)
		args := append(append([]string{}, r.args...), "--out", path)
		name := o.Exe
		if r.python {
			name, args = o.Python, append([]string{o.PyClient}, args...)
		}
		var h *hedge.Hedger
		if r.hedged != nil {
			if h, err = hedge.Start(r.hedged, hedge.Options{Netns: client.Handle, Backend: o.Backend, Log: o.Log}); err != nil {
				return res, fmt.Errorf("start kernel hedger: %w", err)
			}
		}
		o.Log.Info("running client", "series", r.name, "n", o.N)
		if o.Scenario == GC {
			var rec PauseRecord
			rec, err = runPaused(ctx, client, sched, name, args...)
			pauses[r.name] = rec
			if err == nil && len(rec.Applied) == 0 {
				o.Log.Warn("no pause applied to a client: its run ended before the schedule's first pause", "series", r.name, "elapsed", rec.Elapsed)
			}
		} else {
			err = bench.RunProcess(ctx, client, io.Discard, name, args...)
		}
		var snap *hedge.Snapshot
		if h != nil {
			snap, _ = h.Stats()
			err = errors.Join(err, h.Close())
		}
		if err != nil {
			return res, fmt.Errorf("client %s: %w", r.name, err)
		}
		part, err := bench.ReadFile(path)
		if err != nil {
			return res, err
		}
		if snap != nil && len(part.Series) == 1 {
			// The hedger also saw the warm-up requests: count the measured share of hedges.
			c := snap.Services[0].Counters
			sent := int(c["hedges_sent"])
			if c["requests"] > 0 {
				sent = int(float64(c["hedges_sent"])*float64(o.N)/float64(c["requests"]) + 0.5)
			}
			part.Series[0].HedgesSent = &sent
			part.Series[0].Backend = "kernel (" + snap.Backend + ")"
			// bench.Merge prefixes each series' own parameters with its name.
			part.Parameters = mergeParams(part.Parameters, kernelParams(snap))
		}
		parts = append(parts, part)
	}
	if res, err = bench.Merge(parts...); err != nil {
		return res, err
	}
	res.Scenario = o.Scenario
	res.Parameters = mergeParams(res.Parameters, map[string]any{
		"n": o.N, "warmup": o.Warmup, "hedge_delay_ms": ms(o.Delay), "timeout_ms": ms(o.Timeout),
		"stall_pct": o.Server.StallPct, "stall_ms": ms(o.Server.Stall), "fast_ms": ms(o.Server.Fast),
		"ttl_ms": ms(o.Server.TTL), "cpu_pressure": o.Scenario == Pressure, "concurrency": o.Concurrency,
	})
	if o.Scenario == GC {
		applied := 0
		for _, rec := range pauses {
			applied += len(rec.Applied)
		}
		if applied == 0 {
			return res, errNoPauses
		}
		res.Parameters = mergeParams(res.Parameters, pauseParams(o.Pauses, sched, pauses))
	}
	if o.Scenario == Outage {
		res.Parameters["replicas"] = []string{target.String(), alt.String()}
		res.Parameters["outage_replica"] = target.String()
	}
	if err := res.WriteFile(filepath.Join(o.OutDir, "result.json")); err != nil {
		return res, err
	}
	return res, bench.WriteCharts(o.OutDir, res, 0.95, o.Delay)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mergeParams(a, b map[string]any) map[string]any {
	if a == nil {
		a = map[string]any{}
	}
	for k, v := range b {
		a[k] = v
	}
	return a
}

// kernelParams records a kernel-hedged run's hedger state.
func kernelParams(s *hedge.Snapshot) map[string]any {
	p := s.Services[0].Precision
	return map[string]any{
		"kernel.backend": s.Backend, "kernel.period_ms": ms(s.Period),
		"kernel.conveyor_mean_ms": ms(s.Calibration.Mean), "kernel.conveyor_spread_us": float64(s.Calibration.Spread) / 1e3,
		"kernel.precision_p50_us": float64(p.P50) / 1e3, "kernel.precision_p99_us": float64(p.P99) / 1e3,
		"kernel.precision_max_us": float64(p.Max) / 1e3, "kernel.delay_final_ms": ms(s.Services[0].DelayNow),
		"kernel.counters": s.Services[0].Counters,
	}
}

// startServer starts `kedge chaos serve` in h with one replica per address in at (replica
// i on at[i]), the stall model of o.Server and any extra flags.
func startServer(o Options, h *lab.Host, at []netip.AddrPort, extra ...string) (func(), error) {
	stop, err := bench.StartProcess(h, o.Exe, append(serverArgs(at, o.Server), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("start chaos server: %w", err)
	}
	return stop, nil
}

// serverArgs are the arguments of `kedge chaos serve` on the addresses at with stall model c.
func serverArgs(at []netip.AddrPort, c chaos.Config) []string {
	addrs := make([]string, len(at))
	for i, a := range at {
		addrs[i] = a.String()
	}
	return []string{"chaos", "serve", "--listen", strings.Join(addrs, ","),
		"--stall-pct", fmt.Sprint(c.StallPct), "--stall", c.Stall.String(),
		"--fast", c.Fast.String(), "--ttl", c.TTL.String()}
}

// waitReady polls the server from the client namespace with an id that never stalls
// (id % 100 == 50) and is outside every client's range.
func waitReady(ctx context.Context, h *lab.Host, to netip.AddrPort) error {
	var conn *net.UDPConn
	if err := h.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		return fmt.Errorf("probe socket: %w", err)
	}
	defer conn.Close()
	req := make([]byte, 32)
	// The limit only bounds a server that never comes up: a loaded machine took over 10 s
	// to start one (load 17).
	const limit = time.Minute
	deadline := time.Now().Add(limit)
	for id := uint32(4_000_000_050); time.Now().Before(deadline); id += 100 {
		binary.BigEndian.PutUint32(req, id)
		if _, err := conn.Write(req); err == nil {
			_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			buf := make([]byte, 64)
			if n, err := conn.Read(buf); err == nil && n >= 4 && binary.BigEndian.Uint32(buf) == id {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("chaos server at %s did not answer within %v", to, limit)
}
