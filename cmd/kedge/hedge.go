package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/agent"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/hedge"
)

func init() { register(newHedgeCmd) }

func newHedgeCmd() *cobra.Command {
	var runDir string
	cmd := &cobra.Command{
		Use:   "hedge",
		Short: "Transparent UDP request hedging in the kernel (run, status, stats)",
		Long: `Hedge sends a second copy of a UDP request to another replica when the first has not
been answered within a delay, without changing the client: TC programs on the client's
interface clone each request into a delay line, send the clone to another replica if no
response came in time (within a budget), and make sure the application sees exactly one
response. 'kedge hedge run' attaches it; 'status' and 'stats' show running hedgers.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown hedge command %q: use run, status or stats (see '%s --help')", args[0], cmd.CommandPath())
			}
			return usagef("%s needs a command: run, status or stats (see '%s --help')", cmd.CommandPath(), cmd.CommandPath())
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	cmd.PersistentFlags().StringVar(&runDir, "run-dir", hedge.StatusDir, "directory of the hedgers' status files")
	_ = cmd.PersistentFlags().MarkHidden("run-dir")
	cmd.AddCommand(newHedgeRunCmd(&runDir), newHedgeStatusCmd(&runDir), newHedgeStatsCmd(&runDir))
	return cmd
}

// hedgeFlags are the flags of `kedge hedge run`.
type hedgeFlags struct {
	config, netnsArg, backend, metricsAddr string
	format                                 string // event stream: "", json, jsonl
	duration                               time.Duration

	// One service without a file.
	iface, service, name, idOrder string
	replicas                      []string
	delay, delayMin, delayMax     time.Duration
	quantile, budgetRatio         float64
	budgetMode                    string
	replicaChoice                 string
	maxHedges                     int
	storeLimit                    int
	budgetWindow                  time.Duration
	idOffset, idLength, burst     int
	protocol                      string
	hedgeable                     []string
	ejectAfter                    int
	ejectBackoff, ejectMaxBackoff time.Duration
}

// serviceFlags are the flags that declare a service instead of --config.
var serviceFlags = []string{"interface", "service", "replica", "name", "delay", "delay-quantile", "delay-min",
	"delay-max", "id-offset", "id-length", "id-order", "budget-ratio", "budget-burst", "budget-mode", "budget-window",
	"replica-choice", "max-hedges", "store-limit", "protocol", "hedgeable", "eject-after", "eject-backoff", "eject-max-backoff"}

// idFlags locate the request id: a protocol preset sets it instead.
var idFlags = []string{"id-offset", "id-length", "id-order"}

func newHedgeRunCmd(runDir *string) *cobra.Command {
	var f hedgeFlags
	cmd := &cobra.Command{
		Use:   "run (--config FILE | --interface IFACE --service ADDR:PORT [flags])",
		Short: "Attach the hedger and run it in the foreground until Ctrl-C, SIGTERM or --duration",
		Long: `Run attaches the hedger to the client-side interface and keeps it attached until Ctrl-C,
SIGTERM or --duration; then it detaches and removes everything it made. Services come
from a YAML file (several services; docs/hedging.md has every key):

  interface: eth0
  delay_line: {backend: auto}          # auto | conveyor | netem | edt
  services:
    - name: dns
      protocol: dns                     # dns | memcached-udp | generic: id, hedgeable rule, port
      address: 198.18.0.12              # where clients send (port 53 from the protocol)
      replicas: [198.18.0.13]           # where hedges may go instead
    - name: kv
      address: 198.18.0.22:9999
      replicas: [198.18.0.23:9999]
      request_id: {offset: 0, length: 4, order: big}
      hedgeable: [{offset: 4, text: "R"}]   # only requests with "R" at 4 (default: all)
      ejection: {after: 3, backoff: 1s} # unanswered hedges that eject a replica (or: off)
      delay: 10ms                       # or {quantile: 0.95, min: 1ms, max: 50ms}
      budget: {ratio: 0.05, burst: 10}  # hedges <= 5% of requests over 10 s + 10 (mode: window | bucket)
      replica_choice: rr                # rr | p50 (lowest recent median latency)
      max_hedges: 1                     # 1..4 hedges per request, each to another replica
      store_limit: 512                  # payload bytes kept in the kernel (0: clone every request)

or, for one service, from flags (--service, --replica, --delay, ...).

A protocol preset (--protocol dns | memcached-udp) says where the request id is, which
requests may be repeated (DNS: standard queries, not UPDATE or NOTIFY; memcached: get and
gets, never a set) and the default port. Requests the hedgeable rule does not match pass
unrecorded and unhedged (not_hedgeable). A replica that leaves its last hedges unanswered,
or is far slower than the others, gets no hedges for a back-off that grows while it stays
bad; with every replica out, hedging pauses and says so. The address the client used is
never changed. It warns when a service's responses match none of its requests (a wrong
request-id spec).

At start it removes what killed runs left behind (their kedge-<pid>-* namespaces, which
hold their delay lines, and a stale kedge-dl0). While running it writes its status and
counters every second to /run/kedge/hedge.<pid>.json, read by 'kedge hedge status' and
'kedge hedge stats'; with --metrics-addr it also serves them to Prometheus at /metrics.
It warns when the budget keeps hedges from being sent: in bucket mode as soon as a
service's request rate is known, if budget.burst cannot cover requests/s x delay (each
waiting request holds a token), and in either mode whenever more than 10% of the requests
answered after the delay were not hedged for lack of budget (counter unhedged_late); each
warning names the setting.

Exit codes: 0 detached cleanly, 1 runtime error, 2 bad flags or config (also an interface
or --netns that does not exist), 3 this kernel lacks what the hedger needs (e.g. the
qdisc of the chosen --backend).`,
		Example: `  # one service, fixed 10 ms delay, hedges to a second replica
  sudo kedge hedge run --interface eth0 --service 198.18.0.12:9999 --replica 198.18.0.13:9999 --delay 10ms

  # DNS: 2-byte id, only standard queries hedged, port 53
  sudo kedge hedge run --interface eth0 --protocol dns --service 198.18.0.12 --replica 198.18.0.13

  # memcached over UDP: gets hedged, sets never
  sudo kedge hedge run --interface eth0 --protocol memcached-udp --service 198.18.0.12 --replica 198.18.0.13

  # adaptive delay: the p95 of recent latencies, kept within 1-50 ms
  sudo kedge hedge run --interface eth0 --service 198.18.0.12:9999 --replica 198.18.0.13:9999 \
      --delay-quantile 0.95 --delay-min 1ms --delay-max 50ms

  # every request cloned into the delay line (no stored path: for requests larger than a store cell)
  sudo kedge hedge run --interface eth0 --service 198.18.0.12:9999 --replica 198.18.0.13:9999 --store-limit 0

  # print each hedge (sent, won, lost, refused) as a JSON line
  sudo kedge hedge run --interface eth0 --protocol dns --service 198.18.0.12 --replica 198.18.0.13 -F jsonl

  # several services from a file, with a Prometheus endpoint
  sudo kedge hedge run --config hedge.yaml --metrics-addr 127.0.0.1:9464

  # inside the client host of a lab ('kedge lab up --name demo'), for one minute
  sudo kedge hedge run --netns kedge-lab-demo-client --config hedge.yaml --duration 1m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runHedge(cmd, &f, *runDir)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", "", "YAML config file (excludes the service flags)")
	addNetnsFlag(cmd, &f.netnsArg, "hedge the interface")
	fl.StringVar(&f.backend, "backend", "", "delay-line backend: auto, conveyor, netem or edt (overrides the config)")
	addDurationFlag(cmd, &f.duration, "detach")
	addMetricsFlag(cmd, &f.metricsAddr)
	fl.StringVarP(&f.format, "format", "F", "", "print an event per hedge sent, won, lost or refused on stdout: json (one array) or jsonl (one object a line); default none")
	fl.StringVarP(&f.iface, "interface", "i", "", "client-side interface requests leave through (e.g. eth0)")
	fl.StringVar(&f.service, "service", "", "service address clients send to, ADDR:PORT")
	fl.StringArrayVar(&f.replicas, "replica", nil, "replica ADDR:PORT hedges may go to (repeatable; none: the service address itself)")
	fl.StringVar(&f.name, "name", "", "service name in stats and metrics (default: the --service address)")
	fl.DurationVar(&f.delay, "delay", hedge.DefaultDelay, "fixed hedge delay, 200us-10s (a config file's service without delay gets the same)")
	fl.Float64Var(&f.quantile, "delay-quantile", 0, "adaptive delay: this quantile of recent latencies, e.g. 0.95 (excludes --delay)")
	fl.DurationVar(&f.delayMin, "delay-min", time.Millisecond, "adaptive delay: lower clamp")
	fl.DurationVar(&f.delayMax, "delay-max", 50*time.Millisecond, "adaptive delay: upper clamp")
	fl.StringVar(&f.protocol, "protocol", hedge.ProtocolGeneric, "protocol preset: dns, memcached-udp or generic (sets the request id, which requests are hedged and the default port; generic: the --id-* flags)")
	fl.StringArrayVar(&f.hedgeable, "hedgeable", nil, "only requests with these bytes are hedged: OFFSET:HEX[/MASK] (e.g. 2:00/f8) or OFFSET:text:TEXT (e.g. '8:text:get '); repeatable, any matches (default: the protocol's rule; generic: every request)")
	fl.IntVar(&f.ejectAfter, "eject-after", hedge.DefaultEjectAfter, "replica judgement: unanswered hedges that eject a replica from hedging for a while (0: never)")
	fl.DurationVar(&f.ejectBackoff, "eject-backoff", hedge.DefaultEjectBackoff, "replica judgement: the first ejection's length, doubled with each one in a row")
	fl.DurationVar(&f.ejectMaxBackoff, "eject-max-backoff", hedge.DefaultEjectMaxBackoff, "replica judgement: the longest ejection")
	fl.IntVar(&f.idOffset, "id-offset", 0, "request id: byte offset in the UDP payload (the response has it at the same place)")
	fl.IntVar(&f.idLength, "id-length", hedge.DefaultIDLength, "request id: length in bytes, 1-8")
	fl.StringVar(&f.idOrder, "id-order", "big", "request id: byte order, big or little")
	fl.Float64Var(&f.budgetRatio, "budget-ratio", 0.05, "budget: hedges per request (0.05 = at most 5% extra load)")
	fl.IntVar(&f.burst, "budget-burst", 10, "budget: hedges allowed beyond the ratio (the bucket's size, or the window's floor)")
	fl.StringVar(&f.budgetMode, "budget-mode", hedge.DefaultBudgetMode, "budget: window (hedges <= ratio x requests over --budget-window, + burst) or bucket (token bucket)")
	fl.DurationVar(&f.budgetWindow, "budget-window", hedge.DefaultBudgetWindow, "budget: the sliding window of mode window")
	fl.StringVar(&f.replicaChoice, "replica-choice", hedge.ReplicaRR, "which replica a hedge goes to, of those the request was not sent to: rr (round robin) or p50 (lowest recent median latency; untried replicas first)")
	fl.IntVar(&f.maxHedges, "max-hedges", 1, fmt.Sprintf("hedges per request, 1-%d, each after a further delay and to another replica", hedge.MaxHedgesLimit))
	fl.IntVar(&f.storeLimit, "store-limit", 0, fmt.Sprintf("requests with at most this many bytes of UDP payload are kept in the kernel and their hedge built from a pacer tick; larger ones are cloned into the delay line (default: the largest payload of the interface's MTU, e.g. 1472, at most %d: no clone path and no conveyor fillers; 0: clone every request; below the MTU's payload, e.g. 512: larger requests and those a full store ring cannot take are cloned)", hedge.MaxStoreLimit))
	return cmd
}

// hedgeConfig builds the config from --config or from the service flags.
func hedgeConfig(cmd *cobra.Command, f *hedgeFlags) (*hedge.Config, error) {
	var set []string
	for _, n := range serviceFlags {
		if cmd.Flags().Changed(n) {
			set = append(set, "--"+n)
		}
	}
	if f.config != "" {
		if len(set) > 0 {
			return nil, usagef("--config and %s exclude each other: declare the services in the file, or use flags for one service", set[0])
		}
		cfg, err := hedge.LoadConfig(f.config)
		if err != nil {
			return nil, usagef("%w", err)
		}
		return cfg, nil
	}
	if f.service == "" {
		return nil, usagef("%s needs --config FILE or --service ADDR:PORT (see '%s --help')", cmd.CommandPath(), cmd.CommandPath())
	}
	quantile := cmd.Flags().Changed("delay-quantile")
	switch {
	case quantile && cmd.Flags().Changed("delay"):
		return nil, usagef("--delay and --delay-quantile exclude each other: a fixed delay or a quantile of recent latencies")
	case !quantile && (cmd.Flags().Changed("delay-min") || cmd.Flags().Changed("delay-max")):
		return nil, usagef("--delay-min and --delay-max clamp an adaptive delay: add --delay-quantile (e.g. 0.95)")
	// A zero length or delay in hedge.Config means "the default"; given as flags they are errors.
	case f.idLength == 0:
		return nil, usagef("--id-length 0: use 1..8 bytes")
	case f.maxHedges == 0:
		return nil, usagef("--max-hedges 0: use 1..%d", hedge.MaxHedgesLimit)
	case !quantile && f.delay <= 0:
		return nil, usagef("--delay %v out of range: use 200us..10s", f.delay)
	}
	svc := hedge.ServiceConfig{
		Name: f.name, Address: f.service, Replicas: f.replicas, Protocol: f.protocol,
		RequestID:     hedge.RequestIDSpec{Offset: f.idOffset, Length: f.idLength, Order: f.idOrder},
		Delay:         hedge.DelaySpec{Fixed: f.delay},
		Budget:        hedge.BudgetSpec{Mode: f.budgetMode, Ratio: f.budgetRatio, Burst: f.burst},
		ReplicaChoice: f.replicaChoice, MaxHedges: f.maxHedges,
	}
	if f.protocol != hedge.ProtocolGeneric {
		for _, n := range idFlags {
			if cmd.Flags().Changed(n) {
				return nil, usagef("--protocol %s sets the request id: drop --%s, or use --protocol generic", f.protocol, n)
			}
		}
		svc.RequestID = hedge.RequestIDSpec{}
	}
	for _, h := range f.hedgeable {
		r, err := hedge.ParseHedgeRule(h)
		if err != nil {
			return nil, usagef("--hedgeable %w", err)
		}
		svc.Hedgeable = append(svc.Hedgeable, r)
	}
	switch {
	case f.ejectAfter < 0:
		return nil, usagef("--eject-after %d: use 0 (never) or 1..1000", f.ejectAfter)
	case f.ejectAfter == 0:
		svc.Ejection = hedge.EjectionSpec{Off: true}
	default:
		svc.Ejection = hedge.EjectionSpec{After: f.ejectAfter, Backoff: f.ejectBackoff, MaxBackoff: f.ejectMaxBackoff}
	}
	if cmd.Flags().Changed("store-limit") { // else derived from the interface's MTU at start
		svc.StoreLimit = &f.storeLimit
	}
	if svc.Name == "" {
		svc.Name = f.service
	}
	if f.budgetMode == hedge.BudgetWindow {
		svc.Budget.Window = hedge.Duration(f.budgetWindow)
	} else if cmd.Flags().Changed("budget-window") {
		return nil, usagef("--budget-window is for --budget-mode window")
	}
	if quantile {
		svc.Delay = hedge.DelaySpec{Quantile: f.quantile, Min: f.delayMin, Max: f.delayMax}
	}
	cfg := &hedge.Config{Interface: f.iface, Services: []hedge.ServiceConfig{svc}}
	if d := max(svc.Delay.Fixed, svc.Delay.Max); d > 2500*time.Millisecond {
		cfg.TTL = hedge.Duration(2 * d) // scoreboard entries must outlive the delay (default 5s)
	}
	if err := cfg.Validate(); err != nil {
		// Validate speaks of config keys; name the flags instead.
		return nil, usageError{Err: errors.New(flagNames.Replace(err.Error()))}
	}
	return cfg, nil
}

var flagNames = strings.NewReplacer(
	"interface is required", "--interface is required",
	"request_id.offset", "--id-offset", "request_id.length", "--id-length", "request_id.order", "--id-order",
	"store_limit", "--store-limit", "delay.quantile", "--delay-quantile", "budget.ratio", "--budget-ratio", "budget.burst", "--budget-burst", "budget.mode", "--budget-mode", "budget.window", "--budget-window",
	"replica_choice", "--replica-choice", "max_hedges", "--max-hedges",
	"ejection.after", "--eject-after", "ejection.max_backoff", "--eject-max-backoff", "ejection.backoff", "--eject-backoff",
	"hedgeable[", "--hedgeable[", "remove request_id, or use protocol: generic", "drop the --id-* flags, or use --protocol generic",
	": address ", ": --service ", ": replica ", ": --replica ", " and address ", " and --service ",
	": delay needs", ": --delay-min and --delay-max need", ": delay ", ": --delay ",
)

func runHedge(cmd *cobra.Command, f *hedgeFlags, runDir string) (err error) {
	cfg, err := hedgeConfig(cmd, f)
	if err != nil {
		return err
	}
	switch f.backend {
	case "", hedge.BackendAuto, hedge.BackendConveyor, hedge.BackendNetem, hedge.BackendEDT:
	default:
		return usagef("--backend %q unknown: use auto, conveyor, netem or edt", f.backend)
	}
	var events *hedge.EventWriter
	if f.format != "" {
		if events, err = hedge.NewEventWriter(cmd.OutOrStdout(), f.format); err != nil {
			return usagef("-F %q: use json or jsonl", f.format)
		}
		defer events.Close()
	}
	target, err := openRunTarget(f.metricsAddr, f.netnsArg, cfg.Interface)
	if err != nil {
		return err
	}
	defer target.Close()
	ns := target.ns
	// Signals before the (slow) start: a Ctrl-C during calibration still detaches cleanly.
	ctx, stop := untilDone(cmd.Context(), f.duration)
	defer stop()

	cleanStale(ns, runDir)
	h, err := hedge.Start(cfg, hedge.Options{Netns: ns, Backend: f.backend, Log: slog.Default(), Events: events != nil})
	if err != nil {
		var le *bpfx.LoadError
		if verbose && errors.As(err, &le) {
			fmt.Fprintln(cmd.ErrOrStderr(), le.Full())
		}
		return rootHint(fmt.Errorf("start hedger: %w", err))
	}
	defer func() {
		if cerr := h.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("detach hedger: %w", cerr))
		} else {
			slog.Info("hedger detached")
		}
	}()

	target.metrics.Serve(nil, hedge.NewCollector(h))

	st := hedge.Status{
		PID: os.Getpid(), Started: time.Now(), Interface: cfg.Interface,
		Netns: f.netnsArg, DelayLineNetns: h.DelayLineNetns(),
	}
	if f.config != "" {
		st.ConfigPath, _ = filepath.Abs(f.config)
	}
	if st.Netns == "" {
		st.Netns = currentNetnsName()
	}
	published, watched, streamed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(streamed)
		if events == nil {
			return
		}
		if err := h.Events(ctx, func(ev hedge.Event) { _ = events.Write(ev) }); err != nil {
			slog.Warn("event stream ended", "err", err)
		}
	}()
	go func() {
		defer close(published)
		h.PublishStatus(ctx, runDir, st, time.Second)
	}()
	go func() {
		defer close(watched)
		h.Watch(ctx, 2*time.Second)
	}()
	slog.Info("hedging; Ctrl-C or SIGTERM detaches", "status", hedge.StatusPath(runDir, st.PID))
	<-ctx.Done()
	<-published // no Stats() after Close
	<-watched
	<-streamed
	if snap, serr := h.Stats(); serr == nil {
		for _, s := range snap.Services {
			c := s.Counters
			slog.Info("service totals", "service", s.Name, "requests", c["requests"], "responses", c["responses"],
				"hedges_sent", c["hedges_sent"], "hedges_won", c["hedges_won"],
				"duplicates_dropped", c["duplicates_dropped"], "budget_exhausted", c["budget_exhausted"])
		}
	}
	return nil
}

// cleanStale removes what killed runs left behind (see cleanBeforeRun); hedge.Start
// removes a stale kedge-dl0 itself.
func cleanStale(ns netns.NsHandle, runDir string) { cleanBeforeRun(ns, runDir) }

func newHedgeStatusCmd(runDir *string) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List running hedgers: backend, delay-line calibration, delay per service",
		Long: `Status lists the running 'kedge hedge run' processes from their status files in
/run/kedge (updated every second): namespace, interface, delay-line backend and its
calibration as measured at start (conveyor: period mean/min/max, spread, fillers), and
each service's request-id spec (where in the datagram the id is read), configured and
current delay. Status files of killed runs are removed.`,
		Example: `  kedge hedge status
  kedge hedge status -o json | jq '.[].snapshot.backend'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sts, err := readHedgers(output, *runDir)
			if err != nil {
				return err
			}
			if sts == nil {
				sts = []hedge.Status{}
			}
			return writeReport(cmd.OutOrStdout(), output, sts, func(w io.Writer) error { return writeHedgeStatus(w, sts, *runDir) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// readHedgers checks -o and reads the running hedgers' status files.
func readHedgers(output, runDir string) ([]hedge.Status, error) {
	return hedge.ReadStatuses(runDir)
}

func writeHedgeStatus(w io.Writer, sts []hedge.Status, runDir string) error {
	if len(sts) == 0 {
		_, err := fmt.Fprintln(w, noHedger(runDir))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tNETNS\tIFACE\tBACKEND\tTARGET\tPERIOD MEAN\tMIN\tMAX\tSPREAD\tFILLERS\tUP")
	for _, st := range sts {
		s := st.Snapshot
		if s == nil {
			s = &hedge.Snapshot{}
		}
		c := s.Calibration
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", st.PID, st.Netns, st.Interface, s.Backend,
			dur(s.Period), dur(c.Mean), dur(c.Min), dur(c.Max), dur(c.Spread), c.Fillers,
			s.Time.Sub(st.Started).Round(time.Second))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "PID\tSERVICE\tADDRESS\tPROTOCOL\tREQUEST ID\tHEDGEABLE\tDELAY\tDELAY NOW\tREQUESTS\tHEDGES\tSTATE")
	var notes []string
	for _, st := range sts {
		if st.Snapshot == nil {
			continue
		}
		for _, s := range st.Snapshot.Services {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", st.PID, s.Name, s.Address, orDash(s.Protocol), s.RequestID,
				orDash(s.Hedgeable), s.Delay, dur(s.DelayNow), s.Counters["requests"], s.Counters["hedges_sent"], serviceState(s))
			if s.Warning != "" {
				notes = append(notes, "warning: "+s.Warning)
			}
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "PID\tSERVICE\tREPLICA\tP50\tJUDGEMENT\tUNANSWERED\tEJECTIONS")
	for _, st := range sts {
		if st.Snapshot == nil {
			continue
		}
		for _, s := range st.Snapshot.Services {
			for i, r := range s.Replicas {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\n", st.PID, s.Name, r.Address, dur(r.P50), replicaState(i, r), r.Unanswered, r.Ejections)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return err
		}
	}
	return nil
}

// serviceState is a service's line in `kedge hedge status`: hedging, paused (every replica
// ejected) or a warning.
func serviceState(s hedge.ServiceStats) string {
	switch {
	case s.Paused:
		return "paused: every replica ejected"
	case s.Warning != "":
		return "warning: responses match no request (below)"
	}
	return "hedging"
}

// replicaState: replica 0 is the address the client used (never a hedge's); the others are
// in, or ejected for what is left of their back-off.
func replicaState(i int, r hedge.ReplicaStats) string {
	switch {
	case i == 0:
		return "service address"
	case r.Ejected:
		return "ejected, back in " + dur(r.OutFor)
	}
	return "in"
}

// noHedger says that no 'kedge hedge run' runs, and where a running agent's hedgers are.
func noHedger(runDir string) string {
	agents, _ := agent.ReadStatuses(runDir)
	var where []string
	for _, a := range agents {
		n := 0
		for _, u := range a.Units {
			if u.Kind == "hedge" {
				n++
			}
		}
		if n > 0 {
			where = append(where, fmt.Sprintf("kedge agent (pid %d) runs %d hedger(s): their counters are at http://%s/metrics, what is attached at /readyz", a.PID, n, a.Listen))
		}
	}
	if len(where) == 0 {
		return "no hedger running (start one with 'kedge hedge run' or 'kedge agent')"
	}
	return "no 'kedge hedge run' running; " + strings.Join(where, "; ")
}

// dur prints a duration rounded to what the eye needs ("-" for none).
func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d.Abs() < 10*time.Microsecond:
		return d.String()
	case d.Abs() < 10*time.Millisecond:
		return d.Round(time.Microsecond).String()
	default:
		return d.Round(10 * time.Microsecond).String()
	}
}

func newHedgeStatsCmd(runDir *string) *cobra.Command {
	var (
		output string
		pid    int
	)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show a running hedger's counters per service and its delay line's",
		Long: `Stats prints the counters of a running hedger (from its status file, at most a second
old), one column per service: requests, first responses, clones into the delay line,
clones dropped because answered, hedges sent and won, duplicate responses dropped,
requests not cloned (so not hedged) for lack of a budget token, ..., the free budget
tokens, the current delay, latency quantiles (request
to first response, over the adaptive-delay window) and delay-line precision (hedge send
time minus intended time). Then the delay line's own counters. With several hedgers
running, --pid picks one. -o json prints the whole status file.`,
		Example: `  kedge hedge stats
  kedge hedge stats --pid 4242 -o json | jq '.snapshot.services[0].counters.hedges_sent'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sts, err := readHedgers(output, *runDir)
			if err != nil {
				return err
			}
			st, err := pickHedger(sts, pid)
			if err != nil {
				return err
			}
			if st == nil {
				return writeReport(cmd.OutOrStdout(), output, struct{}{}, func(w io.Writer) error {
					_, err := fmt.Fprintln(w, noHedger(*runDir))
					return err
				})
			}
			return writeReport(cmd.OutOrStdout(), output, st, func(w io.Writer) error { return writeHedgeStats(w, st) })
		},
	}
	cmd.Flags().IntVar(&pid, "pid", 0, "the hedger's pid (see 'kedge hedge status'); needed when several run")
	addOutputFlag(cmd, &output)
	return cmd
}

func pickHedger(sts []hedge.Status, pid int) (*hedge.Status, error) {
	if pid != 0 {
		for i := range sts {
			if sts[i].PID == pid {
				return &sts[i], nil
			}
		}
		return nil, usagef("no hedger with pid %d is running (see 'kedge hedge status')", pid)
	}
	switch len(sts) {
	case 0:
		return nil, nil // nothing running: said, not an error (as every status command)
	case 1:
		return &sts[0], nil
	}
	pids := make([]string, len(sts))
	for i, s := range sts {
		pids[i] = fmt.Sprint(s.PID)
	}
	return nil, usagef("%d hedgers are running (pids %s): pick one with --pid", len(sts), strings.Join(pids, ", "))
}

func writeHedgeStats(w io.Writer, st *hedge.Status) error {
	s := st.Snapshot
	if s == nil {
		_, err := fmt.Fprintf(w, "hedger %d has not published counters yet\n", st.PID)
		return err
	}
	fmt.Fprintf(w, "hedger %d on %s in %s, backend %s, as of %s\n\n", st.PID, st.Interface, st.Netns, s.Backend,
		s.Time.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	row := func(name string, cell func(hedge.ServiceStats) string) {
		fmt.Fprint(tw, name, "\t")
		for _, svc := range s.Services {
			fmt.Fprint(tw, cell(svc), "\t")
		}
		fmt.Fprintln(tw)
	}
	row("", func(v hedge.ServiceStats) string { return v.Name })
	row("address", func(v hedge.ServiceStats) string { return v.Address })
	row("delay", func(v hedge.ServiceStats) string { return v.Delay })
	row("delay now", func(v hedge.ServiceStats) string { return dur(v.DelayNow) })
	row("budget tokens", func(v hedge.ServiceStats) string { return fmt.Sprintf("%.1f", v.Tokens) })
	row("protocol", func(v hedge.ServiceStats) string { return orDash(v.Protocol) })
	row("hedgeable", func(v hedge.ServiceStats) string { return orDash(v.Hedgeable) })
	row("state", serviceState)
	for _, c := range hedge.ServiceCounterNames() {
		row(c, func(v hedge.ServiceStats) string { return fmt.Sprint(v.Counters[c]) })
	}
	row("latency p50", func(v hedge.ServiceStats) string { return dur(v.LatencyP50) })
	row("latency p95", func(v hedge.ServiceStats) string { return dur(v.LatencyP95) })
	row("latency p99", func(v hedge.ServiceStats) string { return dur(v.LatencyP99) })
	row("precision samples", func(v hedge.ServiceStats) string { return fmt.Sprint(v.Precision.Samples) })
	row("precision p50", func(v hedge.ServiceStats) string { return dur(v.Precision.P50) })
	row("precision p99", func(v hedge.ServiceStats) string { return dur(v.Precision.P99) })
	row("replica choice", func(v hedge.ServiceStats) string {
		if v.ReplicaChoice == "" {
			return "-" // a status file of an older kedge
		}
		return fmt.Sprintf("%s, max %d hedges", v.ReplicaChoice, v.MaxHedges)
	})
	nrep := 0
	for _, svc := range s.Services {
		nrep = max(nrep, len(svc.Replicas))
	}
	for i := range nrep {
		row(fmt.Sprintf("replica %d p50", i), func(v hedge.ServiceStats) string {
			if i >= len(v.Replicas) {
				return ""
			}
			return dur(v.Replicas[i].P50)
		})
		row(fmt.Sprintf("replica %d", i), func(v hedge.ServiceStats) string {
			if i >= len(v.Replicas) {
				return ""
			}
			return replicaState(i, v.Replicas[i])
		})
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, svc := range s.Services {
		if svc.Warning != "" {
			fmt.Fprintln(w, "\nwarning:", svc.Warning)
		}
	}

	fmt.Fprintln(w, "\ndelay line")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	dl := s.DelayLine
	names := make([]string, 0, len(dl))
	for k := range dl {
		if !strings.HasPrefix(k, "period_") {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		fmt.Fprintf(tw, "%s\t%d\t\n", k, dl[k])
	}
	if n := dl["period_count"]; n > 0 {
		fmt.Fprintf(tw, "period mean\t%s\t\n", dur(time.Duration(dl["period_sum_ns"]/n)))
		fmt.Fprintf(tw, "period min\t%s\t\n", dur(time.Duration(dl["period_min_ns"])))
		fmt.Fprintf(tw, "period max\t%s\t\n", dur(time.Duration(dl["period_max_ns"])))
	}
	fmt.Fprintln(tw, "\t\t")
	for _, k := range hedge.GlobalCounterNames() {
		fmt.Fprintf(tw, "%s (no service)\t%d\t\n", k, s.Global[k])
	}
	return tw.Flush()
}
