package hedgebench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// One round of the rate scenario: the lab and servers (rateRig), an arm's runs, one client
// run with what is sampled around it, and the programs' run time.

// rateRig is the rate scenario's ground: the lab, the two chaos servers (fast, and chaos
// with stalls) and what a run samples around itself.
type rateRig struct {
	ctx                     context.Context
	o                       RateOptions
	l                       *lab.Lab
	client                  *lab.Host
	fast, slow              netip.AddrPort
	serverPIDs, softirqPIDs []int
	stops                   []func()
	next                    uint32 // run counter: id ranges
	last                    int    // the highest concurrency level: its runs send SaturationN
}

// startRateRig brings up the lab and starts both chaos servers.
func startRateRig(ctx context.Context, o RateOptions) (_ *rateRig, err error) {
	l, client, srv, fast, slow, err := benchLab()
	if err != nil {
		return nil, err
	}
	r := &rateRig{ctx: ctx, o: o, l: l, client: client, fast: fast, slow: slow, last: o.Levels[len(o.Levels)-1]}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	for _, s := range []struct {
		at  netip.AddrPort
		pct int
	}{{fast, 0}, {slow, o.StallPct}} {
		pid, stop, err := bench.StartProcessPID(srv, o.Exe, serverArgs([]netip.AddrPort{s.at},
			chaos.Config{StallPct: s.pct, Stall: o.Stall, TTL: time.Second})...)
		if err != nil {
			return nil, fmt.Errorf("start chaos server: %w", err)
		}
		r.stops = append(r.stops, stop)
		r.serverPIDs = append(r.serverPIDs, pid)
	}
	for _, a := range []netip.AddrPort{fast, slow} {
		if err := waitReady(ctx, client, a); err != nil {
			return nil, err
		}
	}
	if r.softirqPIDs, err = bench.KsoftirqdPIDs(); err != nil {
		return nil, err
	}
	return r, nil
}

// place moves every thread of both servers to the CPUs of a run at concurrency c: their own
// at saturation, every CPU below it (RateOptions), and returns the client's CPU list for the
// run ("": unpinned).
func (r *rateRig) place(c int) (string, error) {
	if r.o.serverSet == nil {
		return "", nil
	}
	set, client := r.o.serverSet, r.o.ClientCPUs
	if c != r.last {
		set, client = &unix.CPUSet{}, ""
		for i := range runtime.NumCPU() {
			set.Set(i)
		}
	}
	for _, pid := range r.serverPIDs {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return "", fmt.Errorf("pin chaos server: %w", err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) {
				return "", fmt.Errorf("pin chaos server thread %d: %w", tid, err)
			}
		}
	}
	return client, nil
}

// pinned is the command that runs exe with args on cpus (taskset -c, which execs it: the
// process and its CPU time stay the same), or exe itself when cpus is empty.
func pinned(cpus, exe string, args ...string) (string, []string) {
	if cpus == "" {
		return exe, args
	}
	return "taskset", append([]string{"-c", cpus, exe}, args...)
}

// close stops the servers (last started first) and removes the lab.
func (r *rateRig) close() {
	for i := len(r.stops) - 1; i >= 0; i-- {
		r.stops[i]()
	}
	r.l.Close()
}

// hedgerConfig is the kernel hedger's configuration for arm a.
func (r *rateRig) hedgerConfig(a rateArm) *hedge.Config {
	o := r.o
	cfg := &hedge.Config{Interface: r.client.Iface, DelayLine: hedge.DelayLineConfig{Backend: o.Backend},
		Services: []hedge.ServiceConfig{
			// The budget is not what this scenario measures: wide enough that every
			// request can be hedged (with the bucket, a clone holds a token while it
			// rides the delay line: burst >= requests/s x delay, docs/hedging.md).
			{Name: "fast", Address: r.fast.String(), Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: hedge.BudgetSpec{Ratio: 0.05, Burst: 10000}},
			// The loops' stalls come in synchronised bursts (every loop meets ids ending
			// in 00 and 01 at about the same time); refusals would still be counted.
			{Name: "chaos", Address: r.slow.String(), Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: hedge.BudgetSpec{Ratio: 0.1, Burst: 10000}},
		}}
	for i := range cfg.Services {
		a.set(&cfg.Services[i])
		if a.idle { // a port nobody sends to: kedge passes every request
			ap := netip.MustParseAddrPort(cfg.Services[i].Address)
			cfg.Services[i].Address = netip.AddrPortFrom(ap.Addr(), ap.Port()+100).String()
		}
	}
	return cfg
}

// runArm runs arm a's runs of one round (every level against the fast service; with a
// kernel hedger also the saturation level against the chaos service, and in round 1 the
// program timing) and appends them to res.
func (r *rateRig) runArm(res *RateResult, round, order int, a rateArm) (err error) {
	var h *hedge.Hedger
	if a.set != nil {
		if h, err = hedge.Start(r.hedgerConfig(a), hedge.Options{Netns: r.client.Handle, Backend: r.o.Backend, Log: r.o.Log}); err != nil {
			return fmt.Errorf("start kernel hedger (%s arm): %w", a.name, err)
		}
		res.Backend = h.Backend
		defer func() { err = errors.Join(err, h.Close()) }()
	}
	if _, ok := res.IdleCPU[a.name]; !ok {
		idle, err := bench.IdleCPU(r.ctx, time.Second)
		if err != nil {
			return err
		}
		res.IdleCPU[a.name] = idle
	}
	for _, c := range r.o.Levels {
		run, err := r.runClient(c, round, order, a.name, "fast", r.fast, h)
		if err != nil {
			return err
		}
		res.Runs = append(res.Runs, run)
	}
	if h == nil || a.idle {
		return nil
	}
	run, err := r.runClient(r.last, round, order, a.name, "chaos", r.slow, h)
	if err != nil {
		return err
	}
	res.Runs = append(res.Runs, run)
	if round == 1 {
		r.next++
		pt, err := measurePrograms(h, r.client.Handle, netip.AddrPortFrom(r.client.IPv4, 40000), r.next*idSpan, r.o.ProgRuns, r.o.Delay)
		if err != nil {
			return err
		}
		pt.Arm = a.name
		res.Prog = append(res.Prog, pt)
	}
	return nil
}

// runClient runs one closed-loop client run of concurrency c against to and summarizes it,
// with the CPU, softirq and (with h) the hedger's and pacer's counters around it.
func (r *rateRig) runClient(c, round, order int, arm, svc string, to netip.AddrPort, h *hedge.Hedger) (RateRun, error) {
	o := r.o
	r.next++
	run := RateRun{Concurrency: c, Round: round, Order: order, Arm: arm, Service: svc}
	path := filepath.Join(o.OutDir, fmt.Sprintf("c%d-r%d-%s-%s.json", c, round, svc, arm))
	sample := func() (procSample, error) { return readProcs(r.serverPIDs, r.softirqPIDs) }
	var before *hedge.Snapshot
	var err error
	if h != nil {
		if before, err = h.Stats(); err != nil {
			return run, err
		}
	}
	clientCPUs, err := r.place(c)
	if err != nil {
		return run, err
	}
	cpu0, err := bench.ReadCPU()
	if err != nil {
		return run, err
	}
	sirq0, err := readSoftirqs()
	if err != nil {
		return run, err
	}
	steal0, err := bench.ReadSteal()
	if err != nil {
		return run, err
	}
	p0, err := sample()
	if err != nil {
		return run, err
	}
	n := o.N
	if c == r.last {
		n = o.SaturationN
	}
	o.Log.Info("rate run", "concurrency", c, "round", round, "arm", arm, "service", svc, "requests", n)
	name, args := pinned(clientCPUs, o.Exe, "chaos", "client", "--mode", "baseline", "--connected",
		"--target", to.String(), "-n", fmt.Sprint(n), "--warmup", fmt.Sprint(o.Warmup),
		"--concurrency", fmt.Sprint(c), "--timeout", o.Timeout.String(), "--base-id", fmt.Sprint(r.next*idSpan),
		"--scenario", Rate, "--name", filepath.Base(path), "--out", path)
	clientCPU, err := bench.RunProcessCPU(r.ctx, r.client, io.Discard, name, args...)
	o.Log.Debug("rate run end", "concurrency", c, "round", round, "arm", arm, "service", svc) // with the start line, a run's window in a system-wide profile
	p1, perr := sample()
	cpu1, cerr := bench.ReadCPU()
	sirq1, serr := readSoftirqs()
	steal1, terr := bench.ReadSteal()
	if err = errors.Join(err, perr, cerr, serr, terr); err != nil {
		return run, err
	}
	if wall := cpu1.Sub(cpu0).Wall.Seconds(); wall > 0 {
		run.StealCPUs = (steal1 - steal0).Seconds() / wall
	}
	run.Softirqs = diffCounters(sirq1, sirq0)
	if h != nil { // the pacer's work during the run, before the settling below
		mid, err := h.Stats()
		if err != nil {
			return run, err
		}
		run.Pacer = diffCounters(mid.DelayLine, before.DelayLine)
	}
	res, err := bench.ReadFile(path)
	if err != nil {
		return run, err
	}
	_ = os.Remove(path) // per-request data of every run would be ~100 MB; result.json keeps the summary
	if len(res.Series) != 1 {
		return run, fmt.Errorf("%s: %d series, want 1", path, len(res.Series))
	}
	stallPct := 0
	if svc == "chaos" {
		stallPct = o.StallPct
	}
	run.Sent = n + o.Warmup
	summarizeRun(&run, res.Series[0], cpu1.Sub(cpu0), stallPct, o.Stall)
	run.ProcCPUUS = p1.sub(p0, clientCPU).perRequest(run.Sent)
	for _, v := range run.ProcCPUUS {
		run.ProcCPUPerReqUS += v
	}
	if h != nil {
		if run.Counters, _, run.LostClones, err = settledCounters(h, svc, before, o.Delay); err != nil {
			return run, err
		}
	}
	return run, nil
}

// settledCounters waits for the last clones to leave the delay line and returns the
// service's counters and the pacer's since before, and the clones lost.
func settledCounters(h *hedge.Hedger, svc string, before *hedge.Snapshot, delay time.Duration) (map[string]uint64, map[string]uint64, *uint64, error) {
	time.Sleep(delay + 50*time.Millisecond) // a clone is due after delay: nothing to poll for "none in flight"
	after, err := h.Stats()
	if err != nil {
		return nil, nil, nil, err
	}
	i := slices.IndexFunc(after.Services, func(s hedge.ServiceStats) bool { return s.Name == svc })
	c := diffCounters(after.Services[i].Counters, before.Services[i].Counters)
	dl := diffCounters(after.DelayLine, before.DelayLine)
	lost := sub0(dl["carried_in"], dl["carried_out"]) + c["clone_errors"]
	return c, dl, &lost, nil
}

// measurePrograms times the programs of h on the fast service (index 0) and records
// which path the test runs took. The requests go in batches of progBatch with a pause of
// three delays between batches: the test runs are far faster than traffic, and the stored
// path's ring frees a cell only once its request is due, so an unpaced loop would fill it
// and time the clone fallback instead.
func measurePrograms(h *hedge.Hedger, ns netns.NsHandle, client netip.AddrPort, firstID uint32, n int, delay time.Duration) (ProgTime, error) {
	before, err := h.Stats()
	if err != nil {
		return ProgTime{}, err
	}
	var split, resp time.Duration
	for done := 0; done < n; done += progBatch {
		if done > 0 {
			time.Sleep(3 * delay) // the batch's requests come due and leave the ring: nothing to poll per cell
		}
		k := min(progBatch, n-done)
		reqs, resps, err := progFrames(h.Config.Services[0], client, firstID+uint32(done), k, 32)
		if err != nil {
			return ProgTime{}, err
		}
		pt, err := h.MeasurePrograms(ns, reqs, resps)
		if err != nil {
			return ProgTime{}, err
		}
		split, resp = split+pt.Split*time.Duration(k), resp+pt.Resp*time.Duration(k)
	}
	c, _, _, err := settledCounters(h, "fast", before, delay)
	if err != nil {
		return ProgTime{}, err
	}
	return ProgTime{Requests: n, SplitNS: float64(split.Nanoseconds()) / float64(n), RespNS: float64(resp.Nanoseconds()) / float64(n), Counters: c}, nil
}

// progFrames builds n requests from client to service s, ids from firstID upwards, and their
// responses, payloadLen bytes each (the id in the service's id field), for MeasurePrograms.
func progFrames(s hedge.ServiceConfig, client netip.AddrPort, firstID uint32, n, payloadLen int) (reqs, resps [][]byte, err error) {
	svc, err := netip.ParseAddrPort(s.Address)
	if err != nil {
		return nil, nil, fmt.Errorf("measure programs: service address %q: %w", s.Address, err)
	}
	id := s.RequestID
	if id.Length > 4 || payloadLen < id.Offset+4 {
		return nil, nil, fmt.Errorf("measure programs: request id of %d bytes at %d in %d-byte payloads: want at most 4 bytes inside the payload", id.Length, id.Offset, payloadLen)
	}
	if client.Addr().Is4() != svc.Addr().Is4() {
		return nil, nil, fmt.Errorf("measure programs: client %s and service %s differ in address family", client, svc)
	}
	frame := func(from, to netip.AddrPort, reqID uint32) []byte {
		p := make([]byte, payloadLen)
		binary.BigEndian.PutUint32(p[id.Offset:], reqID<<(8*(4-id.Length)))
		return pktbuild.Datagram(from, to, p)
	}
	for i := range n {
		rid := firstID + uint32(i)
		reqs = append(reqs, frame(client, svc, rid))
		resps = append(resps, frame(svc, client, rid))
	}
	return reqs, resps, nil
}

// progBatch is the requests timed back to back (well below the store ring's 1024 cells).
const progBatch = 200

func sub0(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func diffCounters(after, before map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(after))
	for k, v := range after {
		out[k] = sub0(v, before[k])
	}
	return out
}

// procSample is the CPU time of the processes a run involves, read at one moment.
type procSample struct {
	servers, softirq, self time.Duration
}

func readProcs(servers, softirq []int) (procSample, error) {
	var s procSample
	for _, pid := range servers {
		d, err := bench.ProcCPU(pid)
		if err != nil {
			return s, err
		}
		s.servers += d
	}
	for _, pid := range softirq {
		d, err := bench.ProcCPU(pid)
		if err != nil {
			return s, err
		}
		s.softirq += d
	}
	var err error
	s.self, err = bench.SelfCPU()
	return s, err
}

// procCPU is the CPU time each process used over a run.
type procCPU struct {
	client, servers, softirq, self time.Duration
}

func (b procSample) sub(a procSample, client time.Duration) procCPU {
	return procCPU{client: client, servers: b.servers - a.servers, softirq: b.softirq - a.softirq, self: b.self - a.self}
}

func (p procCPU) perRequest(n int) map[string]float64 {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(max(n, 1)) }
	return map[string]float64{"client": us(p.client), "servers": us(p.servers), "ksoftirqd": us(p.softirq), "kedge": us(p.self)}
}
