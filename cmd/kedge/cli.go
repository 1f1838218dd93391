package main

// The pieces every kedge command shares: the -o/--output flag, the --netns flag and its
// resolver (with the interface lookup that follows it), the Prometheus metrics server of
// --metrics-addr, and running until a signal or --duration. Capability files (hedge.go,
// pping.go, sg.go, raft.go) hold only their commands and call these.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// ---- -o/--output ----

// Output formats of -o. "table" is accepted as another name for text (kedge's first name
// for it), so scripts written against it keep working.
const (
	outputText  = "text"
	outputJSON  = "json"
	outputTable = "table"
)

// outputValue is the -o flag: checked when parsed, so a bad format is a usage error before
// the command does anything.
type outputValue struct{ p *string }

func (o outputValue) String() string { return *o.p }
func (o outputValue) Type() string   { return "format" }
func (o outputValue) Set(s string) error {
	switch s {
	case outputText, outputTable:
		*o.p = outputText
	case outputJSON:
		*o.p = outputJSON
	default:
		return fmt.Errorf("unknown output format %q: use text or json", s)
	}
	return nil
}

// addOutputFlag adds -o/--output (text or json) to cmd, stored in *p.
func addOutputFlag(cmd *cobra.Command, p *string) {
	*p = outputText
	cmd.Flags().VarP(outputValue{p}, "output", "o", "output format: text or json")
}

// checkOutputFormat checks a format set other than through addOutputFlag's flag.
func checkOutputFormat(o string) error {
	if err := (outputValue{&o}).Set(o); err != nil {
		return usagef("%w", err)
	}
	return nil
}

// writeReport prints v as indented JSON (-o json) or with text.
func writeReport(w io.Writer, output string, v any, text func(io.Writer) error) error {
	if output == outputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		return nil
	}
	return text(w)
}

// noArgs rejects positional arguments with a hint (cobra.NoArgs says only "unknown command").
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q (see '%s --help')", cmd.CommandPath(), args[0], cmd.CommandPath())
	}
	return nil
}

// ---- --netns and the interface in it ----

// addNetnsFlag adds --netns (a name under /run/netns, as 'ip netns' and 'kedge lab' make
// them, or a path such as /proc/PID/ns/net), stored in *p; what says what runs there.
func addNetnsFlag(cmd *cobra.Command, p *string, what string) {
	cmd.Flags().StringVar(p, "netns", "", what+" in this network namespace: a name under /run/netns (see 'ip netns list') or a path such as /proc/PID/ns/net")
}

// openNetns resolves --netns: a path, or a name under /run/netns. "" is the current
// namespace (netns.None(), which kedge's packages take as "here"). The caller closes a
// handle >= 0.
func openNetns(arg string) (netns.NsHandle, error) {
	h, err := netnsx.Open(arg)
	if err != nil {
		return netns.None(), usagef("--netns %s: %w (list namespaces with 'ip netns list' or 'kedge lab list')", arg, err)
	}
	return h, nil
}

// netnsLabel names --netns in messages: the argument, or "the current network namespace".
func netnsLabel(arg string) string {
	if arg == "" {
		return "the current network namespace"
	}
	return "network namespace " + arg
}

// findInterface returns the index of iface in ns (opened from nsArg by openNetns). An
// interface that does not exist is bad usage (exit 2), in every command.
func findInterface(ns netns.NsHandle, nsArg, iface string) (int, error) {
	idx, err := bpfx.IfIndex(ns, iface)
	if errors.Is(err, bpfx.ErrNoInterface) {
		return 0, usagef("find interface %q in %s: %w (list interfaces with 'ip link')", iface, netnsLabel(nsArg), bpfx.ErrNoInterface)
	}
	return idx, err
}

// runTarget is where a command that attaches to an interface runs: --metrics-addr
// listening (nil without it), the --netns namespace open and the interface found in it.
type runTarget struct {
	metrics *metricsServer
	ns      netns.NsHandle
	ifindex int
}

// openRunTarget checks and opens what --metrics-addr, --netns and the interface name
// before anything is loaded or attached, so their mistakes are usage errors (exit 2) that
// change nothing. Close releases them.
func openRunTarget(metricsAddr, nsArg, iface string) (_ *runTarget, err error) {
	t := &runTarget{ns: netns.None()}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
		}
	}()
	if t.metrics, err = listenMetrics(metricsAddr); err != nil {
		return nil, err
	}
	if t.ns, err = openNetns(nsArg); err != nil {
		return nil, err
	}
	if t.ifindex, err = findInterface(t.ns, nsArg, iface); err != nil {
		return nil, err
	}
	return t, nil
}

// Close stops the metrics server and closes the namespace.
func (t *runTarget) Close() error {
	err := t.metrics.Close()
	if t.ns >= 0 {
		err = errors.Join(err, t.ns.Close())
	}
	return err
}

// currentNetnsName names the namespace this process runs in: its /run/netns name when it
// has one (a lab host started with 'kedge lab exec'), else net:[inode].
func currentNetnsName() string {
	if name, _ := netnsx.NameOf("/proc/self/ns/net"); name != "" {
		return name
	}
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return ""
	}
	return fmt.Sprintf("net:[%d]", self.Ino)
}

// ---- --metrics-addr ----

// addMetricsFlag adds --metrics-addr, stored in *p.
func addMetricsFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "metrics-addr", "", "serve Prometheus metrics at http://`ADDR`/metrics (HOST:PORT, e.g. 127.0.0.1:9464)")
}

// metricsServer serves Prometheus metrics at /metrics. A nil *metricsServer (no
// --metrics-addr) serves nothing; its methods do nothing.
type metricsServer struct {
	ln  net.Listener
	srv *http.Server
}

// listenMetrics checks --metrics-addr and opens its listener ("": nil, nil). Commands call
// it before their slow start, so a bad or taken address fails at once; it listens in the
// network namespace kedge was started in, whatever --netns says.
func listenMetrics(addr string) (*metricsServer, error) {
	if addr == "" {
		return nil, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, usagef("--metrics-addr %q: want HOST:PORT, e.g. 127.0.0.1:9464", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	return &metricsServer{ln: ln}, nil
}

// Addr is where the server listens (the port chosen for :0).
func (m *metricsServer) Addr() net.Addr { return m.ln.Addr() }

// Serve starts serving, in the background, the metrics gathered from g (may be nil) and
// from cs, plus the Go runtime's and the process's.
func (m *metricsServer) Serve(g prometheus.Gatherer, cs ...prometheus.Collector) {
	if m == nil {
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(append(cs, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))...)
	gs := prometheus.Gatherers{reg}
	if g != nil {
		gs = append(gs, g)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gs, promhttp.HandlerOpts{}))
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("metrics server stopped", "err", err)
		}
	}()
	slog.Info("serving metrics", "url", "http://"+m.ln.Addr().String()+"/metrics")
}

// Close stops the server, letting scrapes in flight finish (at most 2 s).
func (m *metricsServer) Close() error {
	if m == nil {
		return nil
	}
	if m.srv == nil {
		return m.ln.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return m.srv.Shutdown(ctx)
}

// ---- running until a signal or --duration ----

// durationValue is --duration: a Go duration, checked when parsed (no negative ones).
type durationValue struct{ p *time.Duration }

func (d durationValue) String() string { return d.p.String() }
func (d durationValue) Type() string   { return "duration" }
func (d durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("%v is negative: use 0 (until Ctrl-C or SIGTERM) or a positive duration", v)
	}
	*d.p = v
	return nil
}

// addDurationFlag adds --duration to a long-running command: stop after this long, 0 (the
// default) runs until SIGINT or SIGTERM. what says what stopping means ("detach").
func addDurationFlag(cmd *cobra.Command, p *time.Duration, what string) {
	cmd.Flags().Var(durationValue{p}, "duration", what+" after this long (0: run until Ctrl-C or SIGTERM)")
}

// untilDone returns a context that ends at SIGINT or SIGTERM and, when d > 0, after d: what
// a long-running command runs under. Cancel releases it.
func untilDone(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	if d <= 0 {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); stop() }
}
