package hedgebench

// The memcached scenario: real memcached replicas (srv1, the address the clients use, and
// srv2, its replica) in the lab, real clients nobody here wrote, one replica paused on a
// seeded schedule, with and without kedge.
//
// - Gets and TCP sets: clients/mcload.php, closed loops on PHP's pecl memcache extension,
//   whose MemcachePool sends a get of a key array over UDP (memcached's 8-byte frame header)
//   and every write over TCP; 10% of its operations are sets.
// - UDP sets: memcslap (libmemcached-tools) in bursts, `-U -t set`: libmemcached's UDP
//   mode sends writes with noreply (it refuses reads over UDP: memcslap -U -t get aborts).
//
// srv1's memcached is stopped (SIGSTOP) and continued on the seeded schedule from each run's
// start, the same for both arms. Both replicas hold the same keys (stored over TCP first).
// memcached's own counters (cmd_set, cmd_get on each replica, read in its namespace) are the
// witness that no set ever reaches srv2.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/lab"
)

// Memcached is the scenario's name.
const Memcached = "memcached"

// MemcachedSchema names the layout of MemcachedResult.
const MemcachedSchema = "kedge.bench.memcached/v1"

// The two arms of the memcached scenario.
const (
	ArmMCUnhedged = "memcached"
	ArmMCKedge    = "memcached + kedge"
)

// MemcachedOptions configure RunMemcached. Zero values take the defaults in parentheses.
type MemcachedOptions struct {
	Clients int           // PHP client processes, closed loops (4)
	Ops     int           // measured operations per client and run (30000)
	Warmup  int           // discarded first operations per client (200)
	SetPct  int           // share of the PHP clients' operations that are sets, over TCP (10)
	Keys    int           // keys k0..k(Keys-1), stored on both replicas first (1000)
	Rounds  int           // rounds, each running both arms, the order rotated (3)
	Delay   time.Duration // hedge delay (2 ms)
	// Budget is the hedge budget (10% of requests, burst 50): while srv1 is stopped every
	// get is hedged, so a stop covering 2% of the time asks more than 2% of the gets.
	Budget hedge.BudgetSpec
	// UDPSetBurst sets are sent by one memcslap run every UDPSetEvery (20 every 100 ms);
	// UDPSetBurst < 0 sends none.
	UDPSetBurst  int
	UDPSetEvery  time.Duration
	Pauses       PauseSpec // srv1's stops (seed 1, 2% of the time, 20-60 ms)
	Backend      string    // delay-line backend (auto)
	PHP          string    // php (the CLI, with the memcache extension)
	Script       string    // clients/mcload.php (default: found next to the checkout)
	Memslap      string    // memcslap
	MemcachedBin string    // memcached
	OutDir       string
	Log          *slog.Logger
}

// DefaultMemcachedPauses is srv1's default schedule: stops of 20-60 ms covering 2% of the time.
func DefaultMemcachedPauses() PauseSpec {
	return PauseSpec{Seed: 1, Coverage: 0.02, Min: 20 * time.Millisecond, Max: 60 * time.Millisecond}
}

func (o *MemcachedOptions) defaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Clients, 4)
	def(&o.Ops, 30000)
	def(&o.Warmup, 200)
	def(&o.SetPct, 10)
	def(&o.Keys, 1000)
	def(&o.Rounds, 3)
	def(&o.UDPSetBurst, 20)
	if o.Delay == 0 {
		o.Delay = 2 * time.Millisecond
	}
	if o.Budget == (hedge.BudgetSpec{}) {
		o.Budget = hedge.BudgetSpec{Ratio: 0.1, Burst: 50}
	}
	if o.UDPSetEvery == 0 {
		o.UDPSetEvery = 100 * time.Millisecond
	}
	if o.Pauses == (PauseSpec{}) {
		o.Pauses = DefaultMemcachedPauses()
	}
	switch {
	case o.Clients < 1 || o.Ops < 1 || o.Warmup < 0 || o.Rounds < 1 || o.Keys < 1:
		return paramErrorf("memcached: %d clients, %d operations, %d warm-up, %d rounds, %d keys: need at least one of each", o.Clients, o.Ops, o.Warmup, o.Rounds, o.Keys)
	case o.SetPct < 0 || o.SetPct >= 100:
		return paramErrorf("memcached: set share %d%% out of range 0-99", o.SetPct)
	case o.Delay <= 0 || o.Delay >= time.Second:
		return paramErrorf("memcached: hedge delay %v out of range (0, 1s)", o.Delay)
	}
	if err := o.Pauses.Validate(); err != nil {
		return err
	}
	for _, tool := range []struct {
		path *string
		name string
		pkg  string
	}{{&o.PHP, "php", "php-cli php-memcache"}, {&o.MemcachedBin, "memcached", "memcached"}, {&o.Memslap, "memcslap", "libmemcached-tools"}} {
		if tool.name == "memcslap" && o.UDPSetBurst < 0 {
			continue
		}
		if *tool.path == "" {
			*tool.path = tool.name
		}
		p, err := exec.LookPath(*tool.path)
		if err != nil {
			return fmt.Errorf("memcached scenario: %s not found: install it (apt-get install %s; scripts/deps.sh does)", tool.name, tool.pkg)
		}
		*tool.path = p
	}
	if o.Script == "" {
		o.Script = findClient("mcload.php")
	}
	if o.Script == "" {
		return errors.New("memcached scenario: clients/mcload.php not found: run from the repository root")
	}
	if out, err := exec.Command(o.PHP, "-r", "exit(class_exists('MemcachePool') ? 0 : 3);").CombinedOutput(); err != nil {
		return fmt.Errorf("memcached scenario: %s has no memcache extension (apt-get install php-memcache): %v %s", o.PHP, err, strings.TrimSpace(string(out)))
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join("results", "hedge", Memcached)
	}
	return os.MkdirAll(o.OutDir, 0o755)
}

// MCRun is one run of one arm.
type MCRun struct {
	Round int    `json:"round"`
	Order int    `json:"order"` // position in its round
	Arm   string `json:"arm"`
	// Gets and Sets are the PHP clients' measured operations; GetMisses the gets that
	// returned no value (a miss or the extension's timeout).
	Gets      int     `json:"gets"`
	Sets      int     `json:"sets"`
	GetMisses int     `json:"get_misses"`
	OpsPerSec float64 `json:"ops_per_s"` // sum over the clients of operations / elapsed
	P50US     float64 `json:"get_p50_us"`
	P99US     float64 `json:"get_p99_us"`
	P999US    float64 `json:"get_p999_us"`
	MaxUS     float64 `json:"get_max_us"`
	// SetsAll counts the PHP clients' sets with the warm-up's (what srv1's cmd_set sees of
	// them); UDPSets the sets memcslap sent over UDP during the run.
	SetsAll int `json:"sets_all"`
	UDPSets int `json:"udp_sets"`
	// ClientUDPOut is the client namespace's UDP datagrams sent (/proc/net/snmp): the gets
	// (warm-up included) and hedges went over UDP when it is at least their number.
	ClientUDPOut uint64 `json:"client_udp_out"`
	// Srv1 and Srv2 are the changes of memcached's counters on each replica over the run.
	Srv1 map[string]uint64 `json:"srv1"`
	Srv2 map[string]uint64 `json:"srv2"`
	// Counters are the hedger's (kedge arm only).
	Counters map[string]uint64 `json:"kedge_counters,omitempty"`
	// Global are the hedger's counters of no service: memcslap's sets carry values of up
	// to about 5 KB, so most are IP fragments, passed untouched and counted in fragments.
	Global map[string]uint64 `json:"kedge_global,omitempty"`
	Pauses PauseRun          `json:"srv1_pauses"`
	// latencies are the pooled get latencies, for the summary and the charts.
	latencies []float64
}

// MCArm summarises one arm over the rounds: medians of the runs, percentiles of the pooled
// gets, and the sets each replica received.
type MCArm struct {
	Arm       string  `json:"arm"`
	Runs      int     `json:"runs"`
	OpsPerSec float64 `json:"ops_per_s_median"`
	// RatioToUnhedged is the median over rounds of this arm's ops/s over the unhedged
	// arm's in the same round (1 for the unhedged arm).
	RatioToUnhedged float64 `json:"ops_ratio_median"`
	Gets            int     `json:"gets"`
	GetMisses       int     `json:"get_misses"`
	P50US           float64 `json:"get_p50_us"`
	P95US           float64 `json:"get_p95_us"`
	P99US           float64 `json:"get_p99_us"`
	P999US          float64 `json:"get_p999_us"`
	MaxUS           float64 `json:"get_max_us"`
	// SetsSent are the sets the clients sent (PHP over TCP, warm-up included, plus memcslap
	// over UDP); Srv1Sets
	// and Srv2Sets what each replica's cmd_set counted. Srv2Sets must be 0: every set is
	// addressed to srv1, and a set is never hedged.
	SetsSent    int    `json:"sets_sent"`
	Srv1Sets    uint64 `json:"srv1_cmd_set"`
	Srv2Sets    uint64 `json:"srv2_cmd_set"`
	Srv2Gets    uint64 `json:"srv2_cmd_get"`
	HedgesSent  uint64 `json:"hedges_sent"`
	Hedgeable   uint64 `json:"not_hedgeable"`
	DupsDropped uint64 `json:"duplicates_dropped"`
}

// MemcachedResult is the scenario's result (schema MemcachedSchema).
type MemcachedResult struct {
	bench.Envelope
	Runs []MCRun `json:"runs"`
	Arms []MCArm `json:"arms"`
}

// RunMemcached runs the memcached scenario and writes result.json and the charts to OutDir.
func RunMemcached(ctx context.Context, o MemcachedOptions) (MemcachedResult, error) {
	var res MemcachedResult
	if err := o.defaults(); err != nil {
		return res, err
	}
	l, err := lab.Up(lab.Spec{Name: "bmc", Fabric: lab.Bridge, Hosts: []string{"client", "srv1", "srv2"}})
	if err != nil {
		return res, err
	}
	defer l.Close()
	client, srv1, srv2 := l.Host("client"), l.Host("srv1"), l.Host("srv2")
	keys := make([]string, o.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	var primary *exec.Cmd
	for _, h := range []*lab.Host{srv1, srv2} {
		cmd, err := lab.StartMemcached(h, o.MemcachedBin)
		if err != nil {
			return res, err
		}
		defer lab.StopProcess(cmd)
		if h == srv1 {
			primary = cmd
		}
		if err := lab.MemcachedStore(h, keys, "value-of-the-bench"); err != nil {
			return res, err
		}
	}
	sched := o.Pauses.Schedule(scheduleHorizon)
	target := netip.AddrPortFrom(srv1.IPv4, lab.MemcachedPort)
	arms := []string{ArmMCUnhedged, ArmMCKedge}
	for round := 1; round <= o.Rounds; round++ {
		for i := range arms {
			arm := arms[(i+round-1)%len(arms)]
			var h *hedge.Hedger
			if arm == ArmMCKedge {
				cfg := &hedge.Config{Interface: client.Iface, DelayLine: hedge.DelayLineConfig{Backend: o.Backend},
					Services: []hedge.ServiceConfig{{Name: "memcached", Protocol: hedge.ProtocolMemcachedUDP,
						Address: srv1.IPv4.String(), Replicas: []string{srv2.IPv4.String()},
						Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: o.Budget}}}
				if h, err = hedge.Start(cfg, hedge.Options{Netns: client.Handle, Backend: o.Backend, Log: o.Log}); err != nil {
					return res, fmt.Errorf("start kernel hedger: %w", err)
				}
			}
			o.Log.Info("memcached run", "round", round, "arm", arm)
			run, err := o.runOnce(ctx, client, srv1, srv2, primary, target, sched, round)
			run.Round, run.Order, run.Arm = round, i, arm
			if h != nil {
				if snap, serr := h.Stats(); serr == nil {
					run.Counters, run.Global = snap.Services[0].Counters, snap.Global
				}
				err = errors.Join(err, h.Close())
			}
			if err != nil {
				return res, fmt.Errorf("memcached round %d, %s: %w", round, arm, err)
			}
			res.Runs = append(res.Runs, run)
		}
	}
	res.Envelope = bench.NewEnvelope(ctx, MemcachedSchema, Memcached, map[string]any{
		"clients": o.Clients, "ops_per_client": o.Ops, "warmup": o.Warmup, "set_pct": o.SetPct, "keys": o.Keys,
		"rounds": o.Rounds, "hedge_delay_ms": ms(o.Delay), "budget_ratio": o.Budget.Ratio, "budget_burst": o.Budget.Burst,
		"udp_set_burst": o.UDPSetBurst, "udp_set_every_ms": ms(o.UDPSetEvery),
		"srv1_pauses": PauseSchedule{Seed: o.Pauses.Seed, Coverage: o.Pauses.Coverage, MinMS: ms(o.Pauses.Min), MaxMS: ms(o.Pauses.Max),
			Clock: "from each run's start"},
		"clients_used": []string{mcClientName(o.PHP), memslapVersion(o.Memslap)},
		"memcached":    strings.TrimSpace(runOut(o.MemcachedBin, "-V")),
		"replicas":     []string{target.String(), netip.AddrPortFrom(srv2.IPv4, lab.MemcachedPort).String()},
	})
	res.Arms = summarizeMC(res.Runs, arms)
	if err := bench.WriteJSON(filepath.Join(o.OutDir, "result.json"), res); err != nil {
		return res, err
	}
	return res, writeMCCharts(o.OutDir, res, o.Delay)
}

// runOnce runs the clients once against target while srv1's memcached is paused per
// sched, and returns what they and both replicas counted.
func (o MemcachedOptions) runOnce(ctx context.Context, client, srv1, srv2 *lab.Host, primary *exec.Cmd, target netip.AddrPort, sched []Pause, round int) (MCRun, error) {
	var run MCRun
	before1, err := lab.MemcachedStats(srv1)
	if err != nil {
		return run, err
	}
	before2, err := lab.MemcachedStats(srv2)
	if err != nil {
		return run, err
	}
	udpBefore, err := udpOut(client)
	if err != nil {
		return run, err
	}
	dir, err := os.MkdirTemp("", "kedge-mcload-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(dir)

	// The clients start together; srv1's schedule and the UDP set bursts run until they end.
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, o.Clients)
	start := time.Now()
	for c := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := filepath.Join(dir, fmt.Sprintf("c%d.json", c))
			errs[c] = bench.RunProcess(ctx, client, io.Discard, o.PHP, o.Script, target.Addr().String(), fmt.Sprint(target.Port()),
				fmt.Sprint(o.Ops), fmt.Sprint(o.Warmup), fmt.Sprint(o.SetPct), fmt.Sprint(o.Keys), fmt.Sprint(round*100+c+1), out)
		}()
	}
	go func() { wg.Wait(); close(done) }()
	var applied []Applied
	pausesDone := make(chan struct{})
	go func() { applied = applyPauses(ctx, primary.Process, start, sched, done); close(pausesDone) }()
	udpSets, udpErr := o.udpSets(ctx, client, target, done)
	<-done
	<-pausesDone
	elapsed := time.Since(start)
	if err := errors.Join(append(errs, udpErr)...); err != nil {
		return run, err
	}
	run.UDPSets = udpSets
	rec := PauseRecord{Elapsed: elapsed, Applied: applied}
	run.Pauses = PauseRun{ElapsedMS: ms(elapsed), Pauses: len(applied), StoppedMS: ms(rec.StoppedTime()),
		Coverage: safeDiv(float64(rec.StoppedTime()), float64(elapsed)), MaxOverrunMS: ms(rec.MaxOverrun()), Applied: applied}

	for c := range o.Clients {
		var r struct {
			Gets, Sets int
			SetsAll    int       `json:"sets_all"`
			ElapsedS   float64   `json:"elapsed_s"`
			Lat        []float64 `json:"get_latencies_us"`
			OK         []bool    `json:"get_ok"`
		}
		if err := bench.ReadJSON(filepath.Join(dir, fmt.Sprintf("c%d.json", c)), &r); err != nil {
			return run, err
		}
		run.Gets += r.Gets
		run.Sets += r.Sets
		run.SetsAll += r.SetsAll
		for _, ok := range r.OK {
			if !ok {
				run.GetMisses++
			}
		}
		if r.ElapsedS > 0 {
			run.OpsPerSec += float64(r.Gets+r.Sets) / r.ElapsedS
		}
		run.latencies = append(run.latencies, r.Lat...)
	}
	slices.Sort(run.latencies)
	run.P50US, run.P99US = bench.Percentile(run.latencies, 50), bench.Percentile(run.latencies, 99)
	run.P999US, run.MaxUS = bench.Percentile(run.latencies, 99.9), bench.Percentile(run.latencies, 100)

	// srv1 has answered everything once it runs again; its counters settle at once.
	after1, err := lab.MemcachedStats(srv1)
	if err != nil {
		return run, err
	}
	after2, err := lab.MemcachedStats(srv2)
	if err != nil {
		return run, err
	}
	run.Srv1, run.Srv2 = mcDelta(before1, after1), mcDelta(before2, after2)
	udpAfter, err := udpOut(client)
	run.ClientUDPOut = udpAfter - udpBefore
	return run, err
}

// udpSets runs memcslap bursts of UDP sets against target every UDPSetEvery until done is
// closed, and returns how many sets it sent.
func (o MemcachedOptions) udpSets(ctx context.Context, client *lab.Host, target netip.AddrPort, done <-chan struct{}) (int, error) {
	if o.UDPSetBurst < 0 {
		return 0, nil
	}
	sent := 0
	t := time.NewTicker(o.UDPSetEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return sent, nil
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-t.C:
		}
		if err := bench.RunProcess(ctx, client, io.Discard, o.Memslap, "-U", "-q", "-s", target.String(),
			"-t", "set", "-e", fmt.Sprint(o.UDPSetBurst), "-c", "1"); err != nil {
			return sent, fmt.Errorf("memcslap: %w", err)
		}
		sent += o.UDPSetBurst
	}
}

// udpOut reads the UDP datagrams sent from h's namespace (Udp OutDatagrams of
// /proc/net/snmp, read through the calling thread, which Do moves into the namespace).
func udpOut(h *lab.Host) (uint64, error) {
	var n uint64
	err := h.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var names []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "Udp:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i, name := range names {
				if name == "OutDatagrams" && i < len(f) {
					n, err = strconv.ParseUint(f[i], 10, 64)
					return err
				}
			}
		}
		return errors.New("no Udp OutDatagrams")
	})
	if err != nil {
		return 0, fmt.Errorf("read UDP counters in %s: %w", h.HostName, err)
	}
	return n, nil
}

var mcCounters = []string{"cmd_get", "cmd_set", "get_hits", "get_misses"}

func mcDelta(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for _, k := range mcCounters {
		d[k] = after[k] - before[k]
	}
	return d
}

// summarizeMC summarises the runs per arm, in the order of arms.
func summarizeMC(runs []MCRun, arms []string) []MCArm {
	unhedged := map[int]float64{}
	for _, r := range runs {
		if r.Arm == ArmMCUnhedged {
			unhedged[r.Round] = r.OpsPerSec
		}
	}
	var out []MCArm
	for _, arm := range arms {
		a := MCArm{Arm: arm}
		var ops, ratios, lat []float64
		for _, r := range runs {
			if r.Arm != arm {
				continue
			}
			a.Runs++
			ops = append(ops, r.OpsPerSec)
			if u := unhedged[r.Round]; u > 0 {
				ratios = append(ratios, r.OpsPerSec/u)
			}
			lat = append(lat, r.latencies...)
			a.Gets += r.Gets
			a.GetMisses += r.GetMisses
			a.SetsSent += r.SetsAll + r.UDPSets
			a.Srv1Sets += r.Srv1["cmd_set"]
			a.Srv2Sets += r.Srv2["cmd_set"]
			a.Srv2Gets += r.Srv2["cmd_get"]
			a.HedgesSent += r.Counters["hedges_sent"]
			a.Hedgeable += r.Counters["not_hedgeable"]
			a.DupsDropped += r.Counters["duplicates_dropped"]
		}
		slices.Sort(lat)
		a.OpsPerSec, a.RatioToUnhedged = bench.Median(ops), bench.Median(ratios)
		a.P50US, a.P95US, a.P99US = bench.Percentile(lat, 50), bench.Percentile(lat, 95), bench.Percentile(lat, 99)
		a.P999US, a.MaxUS = bench.Percentile(lat, 99.9), bench.Percentile(lat, 100)
		if math.IsNaN(a.RatioToUnhedged) {
			a.RatioToUnhedged = 0
		}
		out = append(out, a)
	}
	return out
}

// writeMCCharts draws the get latency CDFs of both arms (all rounds pooled): cdf and tail.
func writeMCCharts(dir string, res MemcachedResult, delay time.Duration) error {
	r := bench.Result{Envelope: res.Envelope}
	for _, arm := range []string{ArmMCUnhedged, ArmMCKedge} {
		s := bench.Series{Name: arm}
		for _, run := range res.Runs {
			if run.Arm == arm {
				s.LatenciesUS = append(s.LatenciesUS, run.latencies...)
			}
		}
		r.Series = append(r.Series, s)
	}
	r.Scenario = "memcached gets (srv1 paused 2% of the time)"
	return bench.WriteCharts(dir, r, 0.95, delay)
}

// WriteMemcachedReport prints the scenario's table: per arm, throughput, get latency and
// where the sets went.
func WriteMemcachedReport(w io.Writer, res MemcachedResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", res.Describe())
	fmt.Fprintf(&b, "| arm | runs | ops/s (median) | ratio | gets | misses | P50 ms | P99 ms | P99.9 ms | max ms | sets sent | srv1 cmd_set | srv2 cmd_set | srv2 cmd_get | hedges |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, a := range res.Arms {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.3f | %d | %d | %.3f | %.3f | %.3f | %.3f | %d | %d | %d | %d | %d |\n",
			a.Arm, a.Runs, a.OpsPerSec, a.RatioToUnhedged, a.Gets, a.GetMisses, a.P50US/1e3, a.P99US/1e3, a.P999US/1e3, a.MaxUS/1e3,
			a.SetsSent, a.Srv1Sets, a.Srv2Sets, a.Srv2Gets, a.HedgesSent)
	}
	for _, a := range res.Arms {
		if a.Srv2Sets != 0 {
			fmt.Fprintf(&b, "SETS DUPLICATED: %s: srv2 counted %d sets, every set is addressed to srv1\n", a.Arm, a.Srv2Sets)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mcClientName names the PHP client: php and memcache extension versions.
func mcClientName(php string) string {
	v := strings.TrimSpace(runOut(php, "-r", "echo 'php ', PHP_VERSION, ' + pecl memcache ', phpversion('memcache');"))
	if v == "" {
		return "php + pecl memcache"
	}
	return v
}

func memslapVersion(bin string) string {
	if bin == "" {
		return ""
	}
	return strings.TrimSpace(runOut(bin, "--version"))
}

func runOut(name string, args ...string) string {
	out, _ := exec.Command(name, args...).Output()
	return string(out)
}
