package sgbench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io/fs"

	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/lab"
	"gonum.org/v1/plot/plotter"
)

// Schema of result.json.
const Schema = "kedge.bench.sg/v1"

// Options of a run.
type Options struct {
	Kedge       string // the kedge binary (clients and workers run as processes)
	Fanouts     []int
	Methods     []string
	Elems       int
	Type        string // the workers' element type: int64 (default) or int32
	LatRequests int
	Outstanding int
	Duration    time.Duration
	Timeout     time.Duration
	Out         string
	// WorkerCPUs is the worker process's CPU list (taskset -c); "1" keeps it off the
	// coordinator's CPU 0. WorkerThreads is its event loops (kedge sg worker --threads).
	WorkerCPUs    string
	WorkerThreads int
	// BridgeNF keeps the host's bridge netfilter hooks (br_netfilter's
	// net.bridge.bridge-nf-call-*tables, per network namespace) on in the lab's bridge
	// namespace. Off by default: a switch between two hosts does not run iptables.
	BridgeNF bool
}

// DefaultOptions: fan-outs 4..1024, every method, 8 requests outstanding.
func DefaultOptions() Options {
	return Options{Fanouts: []int{4, 16, 64, 256, 1024}, Methods: Methods, Elems: 4, LatRequests: 300,
		Outstanding: 8, Duration: 2 * time.Second, Timeout: 200 * time.Millisecond, Out: "results/sg",
		WorkerCPUs: "1", WorkerThreads: 1}
}

// Row is one (method, fan-out) measurement.
type Row struct {
	Method         string  `json:"method"`
	Fanout         int     `json:"fanout"`
	P50US          float64 `json:"p50_us"`
	P99US          float64 `json:"p99_us"`
	LatRequests    int     `json:"lat_requests"`
	LatTimeouts    int     `json:"lat_timeouts"`
	Throughput     float64 `json:"throughput_rps"`
	Completed      int64   `json:"completed"`
	Timeouts       int64   `json:"timeouts"`
	ClientCPUUS    float64 `json:"client_cpu_us_per_req"`  // client process user+sys
	MachineCPUUS   float64 `json:"machine_cpu_us_per_req"` // /proc/stat busy, workers and softirq included
	SyscallsPerReq float64 `json:"syscalls_per_req"`       // client process, loaded phase (perf), -1: not measured
	Mismatches     int64   `json:"mismatches"`
	// Loaded phase, where the time goes (is the worker side the bound?): the worker
	// process's CPU time (user+sys of its threads; with tick accounting and no
	// CONFIG_IRQ_TIME_ACCOUNTING, as on the development VM, softirq ticks that land while
	// it runs are charged to it too) and each CPU's busy share from /proc/stat (softirq
	// included), as fractions of the phase's wall time (1 = the whole CPU). CPU 0 runs the
	// client, CPU 1 the workers.
	WorkerCPU      float64    `json:"worker_cpu"`
	WorkerCPUUSRep float64    `json:"worker_cpu_us_per_reply"`
	CPUBusy        [2]float64 `json:"cpu_busy"`
	CPUSoftirq     [2]float64 `json:"cpu_softirq"`
}

// Ratio compares one of kedge's methods with the best baseline at one fan-out.
type Ratio struct {
	Method          string  `json:"method"` // kedge or kedge-bp
	Fanout          int     `json:"fanout"`
	BestThroughput  string  `json:"best_throughput_baseline"`
	ThroughputRatio float64 `json:"throughput_ratio"` // kedge / best, higher is better
	BestP50         string  `json:"best_p50_baseline"`
	P50Ratio        float64 `json:"p50_ratio"` // kedge / best, lower is better
}

// Result is result.json.
type Result struct {
	bench.Envelope
	Placement string  `json:"placement"`
	Rows      []Row   `json:"rows"`
	Ratios    []Ratio `json:"ratios"`
}

// Run builds a two-host lab, starts max(Fanouts) workers in one process on the second host
// (CPU 1), and runs every method at every fan-out as a client process on CPU 0, methods
// alternating within each fan-out.
func Run(ctx context.Context, o Options, log io.Writer) (*Result, error) {
	maxF := 0
	for _, f := range o.Fanouts {
		maxF = max(maxF, f)
	}
	res := &Result{Envelope: bench.NewEnvelope(ctx, Schema, "", map[string]any{
		"fanouts": o.Fanouts, "methods": o.Methods, "elems": o.Elems, "lat_requests": o.LatRequests,
		"outstanding": o.Outstanding, "duration_s": o.Duration.Seconds(), "timeout_ms": o.Timeout.Milliseconds(),
		"worker_cpus": o.WorkerCPUs, "worker_threads": o.WorkerThreads, "bridge_nf": o.BridgeNF}),
		Placement: fmt.Sprintf("coordinator (client process) pinned to CPU 0 in namespace coord; all workers in one "+
			"`kedge sg worker` process (%d epoll thread(s), recvmmsg/sendmmsg) pinned to CPU %s in namespace w1 "+
			"(one UDP socket per worker); hosts joined by a bridge (veth; bridge netfilter %s); softirq work runs "+
			"where the packets are sent/received", o.WorkerThreads, o.WorkerCPUs, onOff(o.BridgeNF))}
	l, err := lab.Up(lab.Spec{Name: "sgb", Fabric: lab.Bridge, Hosts: []string{"coord", "w1"}})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if !o.BridgeNF {
		if err := bridgeNFOff(l); err != nil {
			return nil, err
		}
	}
	coord, w1 := l.Host("coord"), l.Host("w1")
	base := netip.AddrPortFrom(w1.IPv4, 20000)
	wpid, stop, err := startWorkers(o.Kedge, o.WorkerCPUs, w1.Path(), "--listen", fmt.Sprintf("%s+%d", base, maxF),
		"--type", cmp.Or(o.Type, "int64"), "--elems", strconv.Itoa(o.Elems), "--threads", strconv.Itoa(o.WorkerThreads))
	if err != nil {
		return nil, err
	}
	defer stop()
	for _, f := range o.Fanouts {
		for _, m := range o.Methods {
			row, err := runClient(ctx, o, coord, base, f, m, wpid)
			if err != nil {
				return nil, fmt.Errorf("fan-out %d, %s: %w", f, m, err)
			}
			fmt.Fprintf(log, "fan-out %4d %-10s p50 %8.1f us  p99 %8.1f us  %9.0f req/s  client CPU %7.1f us/req  syscalls %7.1f/req  worker CPU %.2f  CPU0/1 busy %.2f/%.2f  timeouts %d  mismatches %d\n",
				f, m, row.P50US, row.P99US, row.Throughput, row.ClientCPUUS, row.SyscallsPerReq, row.WorkerCPU, row.CPUBusy[0], row.CPUBusy[1],
				row.Timeouts+int64(row.LatTimeouts), row.Mismatches)
			res.Rows = append(res.Rows, *row)
		}
	}
	res.Ratios = ratios(res.Rows)
	return res, nil
}

// bridgeNFOff turns bridge netfilter off in the lab's own bridge namespace (absent without
// br_netfilter): a switch between two hosts does not run iptables.
func bridgeNFOff(l *lab.Lab) error {
	for _, k := range []string{"iptables", "ip6tables", "arptables"} {
		if err := l.Fabric.SetSysctl("net/bridge/bridge-nf-call-"+k, "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("turn bridge netfilter off in the lab: %w", err)
		}
	}
	return nil
}

func runClient(ctx context.Context, o Options, coord *lab.Host, base netip.AddrPort, f int, m string, workerPID int) (*Row, error) {
	lat := o.LatRequests
	if f >= 1024 {
		lat = max(lat/3, 50)
	}
	w, err := runClientProc(ctx, clientProc{bin: o.Kedge, cpu: "0", netns: coord.Path(), iface: coord.Iface, method: m,
		workers: fmt.Sprintf("%s+%d", base, f), typ: o.Type, elems: o.Elems, lat: lat, outstanding: o.Outstanding,
		duration: o.Duration, timeout: o.Timeout, workerPID: workerPID, syscalls: true})
	if err != nil {
		return nil, err
	}
	cr := &w.cr
	row := &Row{Method: m, Fanout: f, LatRequests: len(cr.LatenciesUS), LatTimeouts: cr.LatTimeouts,
		Completed: cr.Completed, Timeouts: cr.Timeouts, Mismatches: cr.Mismatches, SyscallsPerReq: -1}
	sort.Float64s(cr.LatenciesUS)
	if len(cr.LatenciesUS) > 0 {
		row.P50US = bench.Percentile(cr.LatenciesUS, 50)
		row.P99US = bench.Percentile(cr.LatenciesUS, 99)
	}
	if cr.LoadedSec > 0 {
		row.Throughput = float64(cr.Completed) / cr.LoadedSec
	}
	if w.wall > 0 {
		row.WorkerCPU = w.worker.Seconds() / w.wall.Seconds()
		row.CPUBusy, row.CPUSoftirq = w.busy, w.softirq
	}
	if cr.Completed > 0 {
		row.WorkerCPUUSRep = w.worker.Seconds() * 1e6 / float64(cr.Completed*int64(f))
		row.ClientCPUUS = (cr.CPUUserSec + cr.CPUSysSec) * 1e6 / float64(cr.Completed)
		row.MachineCPUUS = w.machine.Seconds() * 1e6 / float64(cr.Completed)
		if w.syscalls >= 0 {
			row.SyscallsPerReq = w.syscalls / float64(cr.Completed)
		}
	}
	return row, nil
}

// startWorkers starts `kedge sg worker` (bin) pinned to cpus in the namespace at netns, with
// args, and waits until it says its sockets are ready. stop ends it (SIGTERM, then waits).
func startWorkers(bin, cpus, netns string, args ...string) (pid int, stop func(), err error) {
	wcmd := exec.Command("taskset", append([]string{"-c", cpus, bin, "sg", "worker", "--netns", netns}, args...)...)
	wcmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	werr, _ := wcmd.StderrPipe()
	if err := wcmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("start workers: %w", err)
	}
	stop = func() { _ = wcmd.Process.Signal(syscall.SIGTERM); _ = wcmd.Wait() }
	sc := bufio.NewScanner(werr)
	if !sc.Scan() || !strings.Contains(sc.Text(), "ready") {
		stop()
		return 0, nil, fmt.Errorf("workers did not start: %s", sc.Text())
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return wcmd.Process.Pid, stop, nil
}

// clientProc is one run of the client process (kedge bench sg-client): one method, one
// fan-out, pinned to cpu, in the namespace at netns.
type clientProc struct {
	bin, cpu, netns, iface, method, workers, typ string
	elems, lat, outstanding                      int
	duration, timeout                            time.Duration
	workerPID                                    int      // the worker process, whose CPU time is measured
	syscalls                                     bool     // count the client's system calls in the loaded phase (perf)
	extra                                        []string // further flags of the client
}

// clientWindow is what one client run measured: the client's own result and, over its
// loaded phase (the window), the machine's and the worker process's CPU time.
type clientWindow struct {
	cr       ClientResult
	wall     time.Duration
	machine  time.Duration // busy time of every CPU (/proc/stat)
	busy     [2]float64    // CPU 0 and 1 busy, fractions of the window
	softirq  [2]float64
	worker   time.Duration // the worker process's user+sys
	syscalls float64       // -1: not counted
	steal    float64       // CPUs the hypervisor took over the window (/proc/stat's steal / wall)
}

// runClientProc starts the client process, drives its phases over stdin/stdout (ready,
// unloaded latencies, loaded, done) and measures the loaded phase.
func runClientProc(ctx context.Context, c clientProc) (*clientWindow, error) {
	cmd := exec.CommandContext(ctx, "taskset", "-c", c.cpu, c.bin, "bench", "sg-client", "--netns", c.netns,
		"--method", c.method, "-i", c.iface, "--workers", c.workers, "--elems", strconv.Itoa(c.elems),
		"--lat-requests", strconv.Itoa(c.lat), "--outstanding", strconv.Itoa(c.outstanding),
		"--duration", c.duration.String(), "--timeout", c.timeout.String())
	if c.typ != "" && c.typ != "int64" {
		cmd.Args = append(cmd.Args, "--type", c.typ)
	}
	cmd.Args = append(cmd.Args, c.extra...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, _ := cmd.StdinPipe()
	outp, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	rd := bufio.NewReader(outp)
	expect := func(word string) error {
		line, err := rd.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != word {
			return fmt.Errorf("client said %q (%v), want %q: %s", line, err, word, stderr.String())
		}
		return nil
	}
	if err := expect("ready"); err != nil {
		return nil, err
	}
	fmt.Fprintln(in)
	if err := expect("loaded"); err != nil {
		return nil, err
	}
	w := &clientWindow{syscalls: -1}
	var perf *exec.Cmd
	perfOut := filepath.Join(os.TempDir(), fmt.Sprintf("kedge-sgbench-perf-%d", cmd.Process.Pid))
	defer os.Remove(perfOut)
	if c.syscalls {
		perf = exec.Command("perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", strconv.Itoa(cmd.Process.Pid), "-o", perfOut)
		if perf.Start() != nil {
			perf = nil
		} else {
			time.Sleep(300 * time.Millisecond) // perf attaches asynchronously; nothing to poll
		}
	}
	cpu0, _ := bench.ReadCPU()
	per0, _ := bench.ReadPerCPU()
	wk0, _ := bench.ProcCPU(c.workerPID)
	st0, sterr0 := bench.ReadSteal()
	t0 := time.Now()
	fmt.Fprintln(in)
	if err := expect("done"); err != nil {
		return nil, err
	}
	w.wall = time.Since(t0)
	cpu1, _ := bench.ReadCPU()
	per1, _ := bench.ReadPerCPU()
	wk1, _ := bench.ProcCPU(c.workerPID)
	st1, sterr1 := bench.ReadSteal()
	if perf != nil {
		_ = perf.Process.Signal(syscall.SIGINT)
		_ = perf.Wait()
		w.syscalls = readPerf(perfOut)
	}
	fmt.Fprintln(in)
	if err := json.NewDecoder(rd).Decode(&w.cr); err != nil {
		return nil, fmt.Errorf("read client result: %w: %s", err, stderr.String())
	}
	w.machine = cpu1.Sub(cpu0).Busy
	w.worker = wk1 - wk0
	if err := cmpErr(sterr0, sterr1); err != nil {
		return nil, err
	}
	if w.wall > 0 {
		w.steal = (st1 - st0).Seconds() / w.wall.Seconds()
	}
	for i := range w.busy {
		if i < len(per0) && i < len(per1) && w.wall > 0 {
			d := per1[i].Sub(per0[i])
			w.busy[i] = d.Busy.Seconds() / w.wall.Seconds()
			w.softirq[i] = d.Softirq.Seconds() / w.wall.Seconds()
		}
	}
	return w, nil
}

// readPerf reads the count from perf stat -x, output ("12345,,raw_syscalls:sys_enter,...").
func readPerf(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ",")
		if len(f) > 2 && strings.Contains(line, "raw_syscalls:sys_enter") {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				return v
			}
		}
	}
	return -1
}

func ratios(rows []Row) []Ratio {
	var out []Ratio
	byF := map[int][]Row{}
	var fs []int
	for _, r := range rows {
		if _, ok := byF[r.Fanout]; !ok {
			fs = append(fs, r.Fanout)
		}
		byF[r.Fanout] = append(byF[r.Fanout], r)
	}
	for _, f := range fs {
		var ks []*Row
		var bestT, bestL *Row
		for i := range byF[f] {
			r := &byF[f][i]
			if IsKedge(r.Method) {
				ks = append(ks, r)
				continue
			}
			if bestT == nil || r.Throughput > bestT.Throughput {
				bestT = r
			}
			if r.P50US > 0 && (bestL == nil || r.P50US < bestL.P50US) {
				bestL = r
			}
		}
		if bestT == nil || bestL == nil || bestT.Throughput == 0 || bestL.P50US == 0 {
			continue
		}
		for _, k := range ks {
			out = append(out, Ratio{Method: k.Method, Fanout: f, BestThroughput: bestT.Method, ThroughputRatio: k.Throughput / bestT.Throughput,
				BestP50: bestL.Method, P50Ratio: k.P50US / bestL.P50US})
		}
	}
	return out
}

// WriteTable prints the rows and the ratios.
func WriteTable(w io.Writer, r *Result) {
	fmt.Fprintf(w, "%-7s %-10s %10s %10s %12s %14s %15s %12s %10s %10s %9s\n", "FANOUT", "METHOD", "P50_US", "P99_US", "REQ/S", "CLIENT_CPU_US",
		"MACHINE_CPU_US", "SYSCALLS/REQ", "WORKER_CPU", "CPU0/CPU1", "TIMEOUTS")
	for _, x := range r.Rows {
		fmt.Fprintf(w, "%-7d %-10s %10.1f %10.1f %12.0f %14.1f %15.1f %12.1f %10.2f %5.2f/%4.2f %9d\n", x.Fanout, x.Method, x.P50US, x.P99US,
			x.Throughput, x.ClientCPUUS, x.MachineCPUUS, x.SyscallsPerReq, x.WorkerCPU, x.CPUBusy[0], x.CPUBusy[1], x.Timeouts+int64(x.LatTimeouts))
	}
	fmt.Fprintln(w)
	for _, q := range r.Ratios {
		if q.ThroughputRatio == 0 {
			fmt.Fprintf(w, "fan-out %4d: %s completed no request (see the timeouts)\n", q.Fanout, q.Method)
			continue
		}
		fmt.Fprintf(w, "fan-out %4d: %s/%s throughput %.2fx, %s/%s p50 %.2fx\n", q.Fanout, q.Method, q.BestThroughput, q.ThroughputRatio,
			q.Method, q.BestP50, q.P50Ratio)
	}
}

// WriteCharts writes p50 latency and throughput against fan-out, one line per method.
func WriteCharts(dir string, r *Result) error {
	for _, c := range []struct {
		name, y string
		val     func(Row) float64
	}{{"latency", "p50 latency (us, log)", func(x Row) float64 { return x.P50US }},
		{"throughput", "throughput (requests/s, log)", func(x Row) float64 { return x.Throughput }}} {
		var args []any
		methods := []string{}
		for _, x := range r.Rows {
			if len(methods) == 0 || !contains(methods, x.Method) {
				methods = append(methods, x.Method)
			}
		}
		for _, m := range methods {
			var pts plotter.XYs
			for _, x := range r.Rows {
				if x.Method == m && c.val(x) > 0 {
					pts = append(pts, plotter.XY{X: float64(x.Fanout), Y: c.val(x)})
				}
			}
			args = append(args, m, pts)
		}
		title := "kedge bench sg: " + c.name + " against fan-out"
		if err := saveFanoutChart(filepath.Join(dir, c.name), title, "fan-out (workers, log)", c.y, args); err != nil {
			return err
		}
	}
	return nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// WriteMarkdown renders r as the tables of docs/benchmarks.md's sg section: the run's
// envelope, every row, and the kedge/best-baseline ratios against the targets
// (fan-out >= 16: throughput >= 1.5x, p50 <= 0.7x). Everything comes from r.
func WriteMarkdown(w io.Writer, r *Result) {
	fmt.Fprintf(w, "Run: %s.\n\n", r.Envelope.Describe())
	fmt.Fprintf(w, "Placement: %s.\n\n", r.Placement)
	fmt.Fprintln(w, "| fan-out | method | p50 us | p99 us | req/s | client CPU us/req | machine CPU us/req | syscalls/req | worker CPU | worker CPU us/reply | CPU0 busy (softirq) | CPU1 busy (softirq) | timeouts | mismatches |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, x := range r.Rows {
		fmt.Fprintf(w, "| %d | %s | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f (%.2f) | %.2f (%.2f) | %d | %d |\n", x.Fanout, x.Method, x.P50US, x.P99US,
			x.Throughput, x.ClientCPUUS, x.MachineCPUUS, x.SyscallsPerReq, x.WorkerCPU, x.WorkerCPUUSRep, x.CPUBusy[0], x.CPUSoftirq[0],
			x.CPUBusy[1], x.CPUSoftirq[1], x.Timeouts+int64(x.LatTimeouts), x.Mismatches)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| fan-out | method | best baseline (req/s) | throughput ratio | target >= 1.5x | best baseline (p50) | p50 ratio | target <= 0.7x |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, q := range r.Ratios {
		if q.Method == "" {
			q.Method = "kedge" // results from before kedge-bp
		}
		met := func(ok bool) string {
			switch {
			case q.Fanout < 16:
				return "(not a target)"
			case ok:
				return "met"
			}
			return "missed"
		}
		fmt.Fprintf(w, "| %d | %s | %s | %.2fx | %s | %s | %.2fx | %s |\n", q.Fanout, q.Method, q.BestThroughput, q.ThroughputRatio,
			met(q.ThroughputRatio >= 1.5), q.BestP50, q.P50Ratio, met(q.P50Ratio > 0 && q.P50Ratio <= 0.7))
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
