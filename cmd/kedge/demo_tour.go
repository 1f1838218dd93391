package main

// kedge demo tour: after the hedging benchmark, the other three capabilities at work, each
// with a one-line result and a chart, and a summary table (make demo).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pping"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// tourRow is one line of the summary table.
type tourRow struct {
	Capability string `json:"capability"`
	Ran        string `json:"ran"`
	Result     string `json:"result"`
	Chart      string `json:"chart,omitempty"`
	OK         bool   `json:"ok"`
}

type tourOptions struct {
	out, hedgeResult string
	short            bool
}

func newDemoTourCmd() *cobra.Command {
	var o tourOptions
	cmd := &cobra.Command{
		Use:   "tour",
		Short: "Run pping, a scatter at fan-out 64 and a 3-node raft failover, then a summary table with the hedging result",
		Long: `Tour shows the capabilities besides hedging at work, each with a one-line result and
a chart under --out, in a lab it removes again:

  pping   a TCP request/response flow between two lab hosts, monitored passively on the
          client's interface: the RTTs the kernel measured (p50, p99) and their CDF
  sg      one coordinator scattering requests to 64 workers (kedge sg worker, another
          host), the replies summed in XDP: every sum checked, round trips and their CDF
  raft    a 3-node cluster whose leader is killed (kill -9) while a client writes: the
          time until a write is acknowledged again ('kedge bench raft', failover)

then a summary table with the hedging result of --hedge-result (the thesis's Table 4.2,
as 'kedge bench hedge' wrote it; make demo runs that first). --short runs each part
briefly (the test suite's form).`,
		Example: `  sudo kedge demo tour --out results/demo --hedge-result results/hedge/thesis/result.json
  sudo kedge demo tour --short --out /tmp/tour`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.out == "" {
				return usagef("--out is empty: give the directory for the charts")
			}
			ctx, stop := untilDone(cmd.Context(), 0)
			defer stop()
			return runTour(ctx, cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.out, "out", "results/demo", "directory for the charts, results and summary.json")
	cmd.Flags().StringVar(&o.hedgeResult, "hedge-result", "results/hedge/thesis/result.json", "the hedging benchmark's result.json to summarise (missing: the row says how to make it)")
	cmd.Flags().BoolVar(&o.short, "short", false, "brief runs (as make test runs it)")
	return cmd
}

func runTour(ctx context.Context, w io.Writer, o tourOptions) (err error) {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", o.out, err)
	}
	rows := []tourRow{tourHedge(o.hedgeResult)}
	fmt.Fprintf(w, "== hedge: %s\n%s\n", rows[0].Ran, rows[0].Result)

	l, err := lab.Up(lab.Spec{Name: "tour", Fabric: lab.Bridge, Hosts: []string{"client", "srv1", "workers"}})
	if err != nil {
		return rootHint(fmt.Errorf("create the tour's lab: %w", err))
	}
	closed := false
	defer func() {
		if !closed {
			err = errors.Join(err, l.Close())
		}
	}()

	fmt.Fprintln(w, "\n== pping: passive RTTs of a TCP flow, measured in the kernel")
	row := tourPping(ctx, l, o)
	rows = append(rows, row)
	fmt.Fprintf(w, "%s\n%s\n", row.Ran, row.Result)

	fmt.Fprintln(w, "\n== sg: scatter to 64 workers, replies summed in XDP")
	row = tourSG(ctx, l, o)
	rows = append(rows, row)
	fmt.Fprintf(w, "%s\n%s\n", row.Ran, row.Result)

	closed = true
	if err := l.Close(); err != nil {
		return fmt.Errorf("remove the tour's lab: %w", err)
	}

	fmt.Fprintln(w, "\n== raft: a 3-node cluster, its leader killed with kill -9")
	row = tourRaft(ctx, o)
	rows = append(rows, row)
	fmt.Fprintf(w, "%s\n%s\n", row.Ran, row.Result)

	fmt.Fprintln(w, "\n== summary")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPABILITY\tRESULT\tCHART")
	failed := 0
	for _, r := range rows {
		res := r.Result
		if !r.OK {
			failed++
			res = "FAILED " + res
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Capability, res, orDash(r.Chart))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := bench.WriteJSON(filepath.Join(o.out, "summary.json"), rows); err != nil {
		return err
	}
	if left := tourLeftovers(); len(left) > 0 {
		return fmt.Errorf("the tour left namespaces behind: %s", strings.Join(left, ", "))
	}
	fmt.Fprintf(w, "\nnothing left behind (no namespace of this run remains); charts and summary.json in %s\n", o.out)
	if failed > 0 {
		return fmt.Errorf("%d of %d capabilities did not show what they should (see above)", failed, len(rows))
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// tourHedge summarises the hedging benchmark's result: baseline against kernel-hedged p99.
func tourHedge(path string) tourRow {
	row := tourRow{Capability: "hedge", Ran: "Table 4.2: baseline vs app- and kernel-hedged clients (kedge bench hedge)"}
	r, err := bench.ReadFile(path)
	if err != nil {
		row.Result = fmt.Sprintf("no result at %s (run 'kedge bench hedge' first)", path)
		row.OK = true // not run here: nothing failed
		row.Ran = "not run"
		return row
	}
	sums := map[string]bench.Summary{}
	for _, s := range r.Series {
		sums[s.Name] = bench.Summarize(s)
	}
	base, ok1 := sums["baseline"]
	kern, ok2 := sums["kernel-hedged"]
	if !ok1 || !ok2 {
		row.Result = fmt.Sprintf("%s has no baseline and kernel-hedged series", path)
		return row
	}
	row.OK = kern.P99 < base.P99
	row.Result = fmt.Sprintf("p99 %.1f ms unhedged -> %.1f ms kernel-hedged (%.1fx), p50 %.2f -> %.2f ms",
		base.P99, kern.P99, base.P99/kern.P99, base.P50, kern.P50)
	if !math.IsNaN(kern.ExtraLoad) {
		row.Result += fmt.Sprintf(", %.1f%% extra requests", 100*kern.ExtraLoad)
	}
	row.Chart = filepath.Join(filepath.Dir(path), "tail.png")
	return row
}

// rttSink collects pping's RTT samples.
type rttSink struct {
	mu  sync.Mutex
	rtt []time.Duration
}

func (s *rttSink) Event(ev pping.Event) error {
	if e, ok := ev.(*pping.RTTEvent); ok {
		s.mu.Lock()
		s.rtt = append(s.rtt, e.RTT)
		s.mu.Unlock()
	}
	return nil
}

func (s *rttSink) Aggregate(*pping.AggReport) error { return nil }

func usList(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Microsecond)
	}
	return out
}

// tourPping monitors a TCP request/response flow from client to srv1 on the client's eth0.
func tourPping(ctx context.Context, l *lab.Lab, o tourOptions) tourRow {
	row := tourRow{Capability: "pping", Ran: "TCP request/response client -> srv1, monitor on the client's eth0"}
	fail := func(err error) tourRow { row.Result = "failed: " + err.Error(); return row }
	client, srv := l.Host("client"), l.Host("srv1")
	cfg := pping.DefaultConfig()
	cfg.RateLimit = 0       // every identifier: a short run has few
	cfg.CleanupInterval = 0 // no GC iterators in a run this short
	m, err := pping.Load(cfg)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	if err := m.Attach(client.Handle, client.IfIndex, bpfx.TCAuto); err != nil {
		return fail(err)
	}
	sink := &rttSink{}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- m.Run(runCtx, sink) }()

	var ln net.Listener
	addr := netip.AddrPortFrom(srv.IPv4, 7100)
	if err := srv.Do(func() (err error) { ln, err = net.Listen("tcp", addr.String()); return err }); err != nil {
		stop()
		return fail(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c) // echo
	}()
	var conn net.Conn
	if err := client.Do(func() (err error) { conn, err = net.Dial("tcp", addr.String()); return err }); err != nil {
		stop()
		return fail(err)
	}
	d := 5 * time.Second
	if o.short {
		d = time.Second
	}
	var app []time.Duration
	buf := make([]byte, 100)
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		t0 := time.Now()
		if _, err := conn.Write(buf); err != nil {
			break
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			break
		}
		app = append(app, time.Since(t0))
		time.Sleep(2 * time.Millisecond) // a request/response pace, not a bulk transfer
	}
	conn.Close()
	stop()
	if err := <-ran; err != nil {
		return fail(err)
	}
	sink.mu.Lock()
	rtts := slices.Clone(sink.rtt)
	sink.mu.Unlock()
	if len(rtts) == 0 {
		return fail(fmt.Errorf("no RTT samples from %d round trips", len(app)))
	}
	ps := bench.Summarize(bench.Series{Name: "pping", LatenciesUS: usList(rtts)})
	as := bench.Summarize(bench.Series{Name: "app", LatenciesUS: usList(app)})
	base := filepath.Join(o.out, "pping-rtt")
	if err := bench.WriteCDF(base, []bench.Series{
		{Name: "RTT measured by pping (kernel, passive)", LatenciesUS: usList(rtts)},
		{Name: "round trip measured by the application", LatenciesUS: usList(app)},
	}, bench.ChartOptions{Title: "pping: TCP RTTs between two lab hosts"}); err != nil {
		return fail(err)
	}
	row.OK = true
	row.Chart = base + ".png"
	row.Result = fmt.Sprintf("%d RTT samples from %d request/response round trips: p50 %.0f us, p99 %.0f us (the application saw p50 %.0f us)",
		ps.N, len(app), ps.P50*1000, ps.P99*1000, as.P50*1000)
	return row
}

// sgResult is what 'kedge sg scatter -o json' prints (the parts the tour reads).
type sgResult struct {
	Results []struct {
		ID          uint64  `json:"id"`
		Status      string  `json:"status"`
		Count       int     `json:"count"`
		Values      []int64 `json:"values"`
		RoundTripNs int64   `json:"round_trip_ns"`
	} `json:"results"`
}

// tourSG runs 64 reference workers on the workers host and scatters from the client.
func tourSG(ctx context.Context, l *lab.Lab, o tourOptions) tourRow {
	const fanout, elems = 64, 4
	row := tourRow{Capability: "sg", Ran: fmt.Sprintf("%d workers (kedge sg worker), sum of %d x int64, coordinator on the client", fanout, elems)}
	fail := func(err error) tourRow { row.Result = "failed: " + err.Error(); return row }
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	wh, client := l.Host("workers"), l.Host("client")
	workers := fmt.Sprintf("%s:9000+%d", wh.IPv4, fanout)
	w := wh.Command(self, "sg", "worker", "--listen", workers, "--type", "int64", "--elems", fmt.Sprint(elems))
	out, err := w.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	w.Stderr = w.Stdout
	if err := wh.Start(w); err != nil {
		return fail(err)
	}
	defer func() { _ = w.Process.Kill(); _ = w.Wait() }()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), "ready") {
				ready <- true
				said = true
			}
		}
		if !said {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			return fail(errors.New("kedge sg worker exited before it was ready"))
		}
	case <-time.After(10 * time.Second):
		return fail(errors.New("kedge sg worker not ready within 10 s"))
	}
	n := 200
	if o.short {
		n = 50
	}
	sc := exec.CommandContext(ctx, self, "sg", "scatter", "--netns", client.Name, "-i", "eth0", "--workers", workers,
		"--reduction", "sum", "--type", "int64", "--elems", fmt.Sprint(elems), "--count", fmt.Sprint(n), "-o", "json")
	b, err := sc.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return fail(fmt.Errorf("kedge sg scatter: %w", err))
	}
	var res sgResult
	if err := json.Unmarshal(b, &res); err != nil {
		return fail(fmt.Errorf("parse kedge sg scatter's output: %w", err))
	}
	if err := os.WriteFile(filepath.Join(o.out, "sg-scatter.json"), b, 0o644); err != nil {
		return fail(err)
	}
	// Worker w answers element j with 1000*w + j + id%997: the sum over all workers is known.
	complete, right := 0, 0
	var rtt []float64
	var first []int64
	for _, r := range res.Results {
		if r.Status != "ok" || r.Count != fanout {
			continue
		}
		complete++
		rtt = append(rtt, float64(r.RoundTripNs)/1000)
		okSum := len(r.Values) == elems
		for j := 0; okSum && j < elems; j++ {
			want := int64(1000*fanout*(fanout-1)/2 + fanout*(j+int(r.ID%997)))
			okSum = r.Values[j] == want
		}
		if okSum {
			right++
			if first == nil {
				first = r.Values
			}
		}
	}
	if complete == 0 {
		return fail(fmt.Errorf("none of %d requests completed", n))
	}
	base := filepath.Join(o.out, "sg-roundtrip")
	if err := bench.WriteCDF(base, []bench.Series{{Name: fmt.Sprintf("scatter to %d workers, sum reduced in XDP", fanout), LatenciesUS: rtt}},
		bench.ChartOptions{Title: "sg: request round trips at fan-out 64"}); err != nil {
		return fail(err)
	}
	s := bench.Summarize(bench.Series{LatenciesUS: rtt})
	row.Chart = base + ".png"
	row.OK = complete == n && right == complete
	row.Result = fmt.Sprintf("%d/%d requests answered by all %d workers, %d sums as expected (first %v), round trip p50 %.0f us, p99 %.0f us",
		complete, n, fanout, right, first, s.P50*1000, s.P99*1000)
	return row
}

// raftFailover is the part of 'kedge bench raft's result.json the tour reads.
type raftFailover struct {
	Failover []struct {
		Nodes    int     `json:"nodes"`
		Trials   int     `json:"trials"`
		Failed   int     `json:"failed"`
		P50      float64 `json:"p50_ms"`
		Max      float64 `json:"max_ms"`
		Election float64 `json:"election_timeout_ms"`
	} `json:"failover"`
}

// tourRaft runs 'kedge bench raft' failover on a 3-node cluster with the kernel paths on.
func tourRaft(ctx context.Context, o tourOptions) tourRow {
	row := tourRow{Capability: "raft", Ran: "3 nodes in a lab, a client writing, the leader killed (kill -9)"}
	fail := func(err error) tourRow { row.Result = "failed: " + err.Error(); return row }
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	trials := "5"
	if o.short {
		trials = "1"
	}
	dir := filepath.Join(o.out, "raft")
	c := exec.CommandContext(ctx, self, "bench", "raft", "--scenarios", "failover", "--nodes", "3", "--trials", trials,
		"--election-ticks", "10", "--offload", "on", "--out", dir)
	if out, err := c.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("kedge bench raft: %w\n%s", err, out))
	}
	var r raftFailover
	if err := bench.ReadJSON(filepath.Join(dir, "result.json"), &r); err != nil {
		return fail(err)
	}
	if len(r.Failover) == 0 {
		return fail(errors.New("no failover result"))
	}
	f := r.Failover[0]
	row.OK = f.Failed == 0 && f.Trials > 0
	row.Chart = filepath.Join(dir, "failover.png")
	row.Result = fmt.Sprintf("%d of %d leader kills recovered: a write acknowledged again after p50 %.0f ms, max %.0f ms (election timeout %.0f ms)",
		f.Trials-f.Failed, f.Trials, f.P50, f.Max, f.Election)
	return row
}

// tourLeftovers lists the namespaces this process owns (none must remain after the tour).
func tourLeftovers() []string {
	names, _ := netnsx.List()
	var out []string
	for _, n := range names {
		if id, ok := netnsx.OwnerID(n); ok && id == runstate.SelfID() {
			out = append(out, n)
		}
	}
	return out
}
