package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
	isg "github.com/kedge-dev/kedge/internal/sg"
	"github.com/kedge-dev/kedge/pkg/sg"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

func init() { register(newSgCmd) }

func newSgCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sg",
		Short: "Scatter-gather in the kernel: one send, replies reduced in XDP",
		Long: `kedge sg fans one request out to a group of workers in TC egress and reduces their
replies in XDP as they arrive; the application receives only the result (docs/sg.md).`,
		Example: `  kedge sg worker --listen 127.0.0.1:9000+16 &
  kedge sg scatter -i lo --workers 127.0.0.1:9000+16 --reduction sum
  kedge sg stats`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown sg command %q: use worker, scatter or stats (see '%s --help')", args[0], cmd.CommandPath())
			}
			return usagef("%s needs a command: worker, scatter or stats (see '%s --help')", cmd.CommandPath(), cmd.CommandPath())
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	cmd.AddCommand(newSgWorkerCmd(), newSgScatterCmd(), newSgStatsCmd())
	return cmd
}

// parseWorkers parses ADDR:PORT[+N] lists: "+N" adds N-1 more workers on the next ports.
func parseWorkers(specs []string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, spec := range specs {
		for _, s := range strings.Split(spec, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			n := 1
			if i := strings.LastIndexByte(s, '+'); i > 0 {
				v, err := strconv.Atoi(s[i+1:])
				if err != nil || v < 1 {
					return nil, usagef("worker %q: the count after '+' must be a positive number", s)
				}
				n, s = v, s[:i]
			}
			ap, err := netip.ParseAddrPort(s)
			if err != nil {
				return nil, usagef("worker %q: %w (want ADDR:PORT[+N], IPv6 as [ADDR]:PORT)", s, err)
			}
			if int(ap.Port())+n-1 > 65535 {
				return nil, usagef("worker %s+%d: ports beyond 65535", s, n)
			}
			for k := range n {
				out = append(out, netip.AddrPortFrom(ap.Addr(), ap.Port()+uint16(k)))
			}
		}
	}
	return out, nil
}

// parseReplicas turns --replicas lists (each a further replica of every one of n workers,
// in index order) into Config.Replicas (per shard).
func parseReplicas(sets []string, n int) ([][]netip.AddrPort, error) {
	if len(sets) == 0 {
		return nil, nil
	}
	out := make([][]netip.AddrPort, n)
	for _, set := range sets {
		rs, err := parseWorkers([]string{set})
		if err != nil {
			return nil, err
		}
		if len(rs) != n {
			return nil, usagef("--replicas %q: %d addresses for %d workers (one further replica per worker, in index order)", set, len(rs), n)
		}
		for i, r := range rs {
			out[i] = append(out[i], r)
		}
	}
	return out, nil
}

func parseValues(s string) ([]int64, error) {
	if s == "" {
		return nil, nil
	}
	var out []int64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, usagef("--values %q: %w", s, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func parseFloatValues(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, usagef("--values %q: %w", s, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// workerFloat is a float worker's wire form (--type float32/float64; zero for integers).
func workerFloat(t sg.ElemType, red string, fracBits int) (isg.FloatFormat, error) {
	if !t.IsFloat() {
		if fracBits != 0 {
			return isg.FloatFormat{}, usagef("--frac-bits is for float types (--type float32 or float64)")
		}
		return isg.FloatFormat{}, nil
	}
	r, err := sg.ParseReduction(red)
	if err != nil {
		return isg.FloatFormat{}, usagef("--reduction: %w", err)
	}
	if fracBits != 0 && r != sg.Sum && r != sg.Mean {
		return isg.FloatFormat{}, usagef("--frac-bits is for float sum and mean (the --reduction is %v)", r)
	}
	if _, err := sg.NewFloatEncoding(r, t, fracBits); err != nil {
		return isg.FloatFormat{}, usagef("--type %v --reduction %v --frac-bits %d: %w", t, r, fracBits, err)
	}
	f := isg.FloatFormat{Bits: isg.Float64, Reduce: uint8(r), FracBits: cmp.Or(fracBits, sg.DefaultFracBits)}
	if t == sg.Float32 {
		f.Bits = isg.Float32
	}
	if r == sg.Mean {
		f.Reduce = isg.RedSum // a mean is summed in the kernel
	}
	return f, nil
}

func newSgWorkerCmd() *cobra.Command {
	var (
		listen            []string
		typ, values, dist string
		red               string
		elems, fracBits   int
		delay, jitter     time.Duration
		loss, dup         float64
		status            uint16
		nsArg             string
		duration          time.Duration
		threads           int
		parts, maxDgram   int
		partLoss          float64
		straggle          float64
		strMin, strMax    time.Duration
		seed              uint64
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run sg workers (the reference implementation of the wire format)",
		Long: `Each --listen address is one worker with its own UDP socket. A worker answers every
request with a vector: --values if given, else element j = 1000*worker + j + id%997
(worker is the index the scatter wrote into the request); float vectors (--type
float32/float64) are --values or that divided by 3, negative for odd j, sent in the wire
form of the coordinator's --reduction (docs/sg.md, "Float reductions"): a sum's value
with no fixed-point form is answered with status 0xf1. Delay, loss, duplicates and
stragglers (--straggle: a request's reply is late, 20-50 ms by default, with this
probability) make it a lab worker; --seed makes their draws repeatable. The sockets are served by --threads event loops, each an OS
thread with its own epoll instance, answering in batches (recvmmsg/sendmmsg).
A reply larger than one datagram is sent as a multi-packet reply: --parts N splits
every reply into N parts, --max-datagram BYTES into as few as keep each datagram's UDP
payload within BYTES (the coordinator must take them: kedge sg scatter --multi-packet).`,
		Example: `  kedge sg worker --listen 127.0.0.1:9000+16 --type int64 --elems 4
  # 256 x int64 (2 KiB) per reply, in datagrams that fit an MTU of 1500; 1% of parts lost
  kedge sg worker --listen 10.77.0.2:9000+8 --elems 256 --max-datagram 1452 --part-loss 0.01
  kedge sg worker --netns w1 --listen 10.77.0.2:9000 --delay 1ms --jitter 2ms --dist exp --loss 0.01 --dup 0.05
  # 1% of replies 20-50 ms late, the same requests every run
  kedge sg worker --listen 127.0.0.1:9000+16 --straggle 0.01 --straggle-min 20ms --straggle-max 50ms --seed 1
  # float64 vectors for a coordinator's --reduction mean (fixed point, 32 fraction bits)
  kedge sg worker --listen 127.0.0.1:9000+4 --type float64 --reduction mean --elems 8
  # float32 maxima; a NaN wins the max
  kedge sg worker --listen 127.0.0.1:9000 --type float32 --reduction max --values 1.5,-inf,nan`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addrs, err := parseWorkers(listen)
			if err != nil {
				return err
			}
			if len(addrs) == 0 {
				return usagef("no --listen address (e.g. --listen 127.0.0.1:9000)")
			}
			t, err := sg.ParseElemType(typ)
			if err != nil {
				return usagef("--type: %w", err)
			}
			float, err := workerFloat(t, red, fracBits)
			if err != nil {
				return err
			}
			var vals []int64
			var fvals []float64
			if t.IsFloat() {
				fvals, err = parseFloatValues(values)
			} else {
				vals, err = parseValues(values)
			}
			if err != nil {
				return err
			}
			if _, err := float.Append(nil, fvals); err != nil {
				return usagef("--values %q: %w (docs/sg.md, \"Float reductions\")", values, err)
			}
			if n := max(len(vals), len(fvals)); n > 0 && !cmd.Flags().Changed("elems") {
				elems = n
			}
			if elems < 0 || elems > sg.MaxElems {
				return usagef("--elems %d: want 0..%d", elems, sg.MaxElems)
			}
			switch dist {
			case "fixed", "uniform", "exp":
			default:
				return usagef("--dist %q: want fixed, uniform or exp", dist)
			}
			if loss < 0 || loss > 1 || dup < 0 || dup > 1 {
				return usagef("--loss and --dup are probabilities (0..1)")
			}
			if threads < 0 {
				return usagef("--threads %d: want 0 (one per CPU the process may use) or more", threads)
			}
			if partLoss < 0 || partLoss > 1 {
				return usagef("--part-loss is a probability (0..1)")
			}
			if straggle < 0 || straggle > 1 {
				return usagef("--straggle is a probability (0..1)")
			}
			if straggle > 0 && (strMin <= 0 || strMax < strMin) {
				return usagef("--straggle-min %v, --straggle-max %v: want 0 < min <= max", strMin, strMax)
			}
			if seed == 0 {
				seed = uint64(time.Now().UnixNano())
			}
			ns, err := openNetns(nsArg)
			if err != nil {
				return err
			}
			if ns >= 0 {
				defer ns.Close()
			}
			ctx, cancel := untilDone(cmd.Context(), duration)
			defer cancel()
			wire := uint8(t)
			if t.IsFloat() {
				wire = float.WireType()
			}
			cfg := isg.WorkerConfig{Listen: addrs, Type: wire, Elems: elems, Values: vals, Float: float, FloatValues: fvals,
				Delay: delay, Jitter: jitter, Dist: dist, Loss: loss, Dup: dup, Status: status,
				Straggle: straggle, StraggleMin: strMin, StraggleMax: strMax, Seed: seed, Threads: threads, Parts: parts, MaxDatagram: maxDgram, PartLoss: partLoss}
			if n := cfg.NParts(); parts < 0 || maxDgram < 0 || n > sg.MaxParts || n > 1 && elems > 0 && !isg.ValidParts(elems, n) {
				return usagef("--parts %d / --max-datagram %d: a reply of %d elements in %d parts (want 1..%d parts, none empty: fewer parts or a larger --max-datagram)",
					parts, maxDgram, elems, n, sg.MaxParts)
			}
			var st isg.WorkerStats
			ready := make(chan struct{})
			go func() {
				<-ready
				fmt.Fprintf(cmd.ErrOrStderr(), "kedge sg worker: %d workers ready (%v ... %v)\n", len(addrs), addrs[0], addrs[len(addrs)-1])
			}()
			if err := netnsx.In(ns, func() error { return isg.RunWorkers(ctx, cfg, &st, ready) }); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kedge sg worker: requests=%d replies=%d lost=%d duplicated=%d straggled=%d malformed=%d\n",
				st.Requests.Load(), st.Replies.Load(), st.Dropped.Load(), st.Dups.Load(), st.Straggled.Load(), st.Malformed.Load())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&listen, "listen", nil, "worker address `ADDR:PORT[+N]` (+N: N workers on consecutive ports); repeatable")
	f.StringVar(&typ, "type", "int64", "element type: int32, int64, float32 or float64")
	f.StringVar(&red, "reduction", "sum", "float types: the coordinator's reduction (sum, mean, min, max, count or gather), which decides the float's wire form")
	f.IntVar(&fracBits, "frac-bits", 0, "float sum and mean: fraction bits of the fixed point (default 32; as the coordinator's --frac-bits)")
	f.IntVar(&elems, "elems", 4, "vector length")
	f.StringVar(&values, "values", "", "constant vector to answer (comma-separated; floats: nan, inf and -inf too); default: per worker and request")
	f.DurationVar(&delay, "delay", 0, "delay before each reply")
	f.DurationVar(&jitter, "jitter", 0, "scale of the random part of the delay (see --dist)")
	f.StringVar(&dist, "dist", "fixed", "delay distribution: fixed, uniform (delay + U[0,jitter]) or exp (delay + Exp(jitter))")
	f.Float64Var(&loss, "loss", 0, "probability of ignoring a request")
	f.Float64Var(&dup, "dup", 0, "probability of sending a reply twice")
	f.Uint16Var(&status, "status", 0, "status in every reply (non-zero: a worker error)")
	f.IntVar(&threads, "threads", 0, "event loops (OS threads, epoll + recvmmsg/sendmmsg) serving the sockets; 0 = one per CPU the process may use")
	f.IntVar(&parts, "parts", 0, "split every reply into N datagrams (a multi-packet reply; 0 or 1: one, unless --max-datagram)")
	f.IntVar(&maxDgram, "max-datagram", 0, "split replies into as few parts as keep each datagram's UDP payload within `BYTES` (1452 fits an MTU of 1500); 0: no split")
	f.Float64Var(&partLoss, "part-loss", 0, "probability of not sending one part of a multi-packet reply")
	f.Float64Var(&straggle, "straggle", 0, "probability that a reply is late by --straggle-min..--straggle-max (a straggler)")
	f.DurationVar(&strMin, "straggle-min", 20*time.Millisecond, "shortest extra delay of a straggling reply")
	f.DurationVar(&strMax, "straggle-max", 50*time.Millisecond, "longest extra delay of a straggling reply (uniform between)")
	f.Uint64Var(&seed, "seed", 0, "seed of the delay, loss, duplicate and straggler draws (each event loop adds its index); 0: from the clock")
	addNetnsFlag(cmd, &nsArg, "run the workers")
	addDurationFlag(cmd, &duration, "stop")
	return cmd
}

// scatterReport is kedge sg scatter's -o json output.
type scatterReport struct {
	Interface string      `json:"interface"`
	Local     string      `json:"local"`
	Tier      string      `json:"tier"`
	Workers   int         `json:"workers"`
	Reduction string      `json:"reduction"`
	Results   []sg.Result `json:"results"`
	Stats     sg.Stats    `json:"stats"`
}

func newSgScatterCmd() *cobra.Command {
	var (
		iface, nsArg, red, typ, payload, output, local string
		runDir                                         string
		workers                                        []string
		elems, need, count, gatherK, batch, firstBatch int
		fracBits                                       int
		timeout                                        time.Duration
		busyPoll, wakeSocket, multiPacket              bool
		metricsAddr                                    string
		replicaSets                                    []string
		replicaChoice                                  string
		ejectBackoff, ejectMax                         time.Duration
		resend                                         time.Duration
		maxResends, resendBurst                        int
		resendRatio, resendQuantile                    float64
		resendMin, pollSpin                            time.Duration
		pacerBackend                                   string
		userObject, userProg                           string
	)
	cmd := &cobra.Command{
		Use:   "scatter",
		Short: "Send requests to a group of workers and print the reduced results",
		Example: `  kedge sg scatter -i lo --workers 127.0.0.1:9000+16 --reduction sum --type int64 --elems 4
  kedge sg scatter --netns coord -i eth0 --workers 10.77.0.2:9000,10.77.0.3:9000 --reduction max --need 1 -o json
  kedge sg scatter -i lo --workers 127.0.0.1:9000+4 --reduction gather --elems 2 --count 10
  # the mean of float64 vectors (workers: kedge sg worker --type float64 --reduction mean)
  kedge sg scatter -i lo --workers 127.0.0.1:9000+4 --type float64 --reduction mean --elems 8
  # workers answering 256 x int64 in parts (kedge sg worker --max-datagram 1452)
  kedge sg scatter --netns coord -i eth0 --workers 10.77.0.2:9000+8 --elems 256 --multi-packet
  # the completing reply wakes the reader through the socket (each result's "reader": socket)
  kedge sg scatter -i lo --workers 127.0.0.1:9000+4 --count 100 --wake-socket -o json
  # 4 shards of 2 replicas each (a copy per shard, round robin; a dead replica is ejected)
  kedge sg scatter --netns coord -i eth0 --workers 10.77.0.2:9000+4 --replicas 10.77.0.3:9000+4 --count 100
  # a worker that has not answered after 20 ms gets its copy again (retries), up to 3 times
  kedge sg scatter --netns coord -i eth0 --workers 10.77.0.2:9000+8 --resend 20ms --max-resends 3 --count 100
  # the same with the delay at the 95th percentile of reply times, between 2 and 20 ms
  kedge sg scatter --netns coord -i eth0 --workers 10.77.0.2:9000+8 --resend 20ms --resend-quantile 0.95 --resend-min 2ms
  # shards of 2 replicas: a straggler's copy is hedged to the other replica after 10 ms
  kedge sg scatter --netns coord -i eth0 --workers 10.77.0.2:9000+4 --replicas 10.77.0.3:9000+4 --resend 10ms
  # a reduction of one's own, in C (docs/sg.md, "User reductions"): the 8 largest values
  kedge sg scatter -i lo --workers 127.0.0.1:9000+4 --reduction user --user-object topk.o --elems 8
  # a long run with its counters served to Prometheus (kedge_sg_*_total)
  kedge sg scatter -i lo --workers 127.0.0.1:9000+4 --count 1000000 --metrics-addr 127.0.0.1:9464`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			if iface == "" {
				return usagef("no --interface (-i): the interface the workers are reached through, e.g. -i lo")
			}
			ws, err := parseWorkers(workers)
			if err != nil {
				return err
			}
			if len(ws) == 0 {
				return usagef("no --workers (e.g. --workers 127.0.0.1:9000+4)")
			}
			r, err := sg.ParseReduction(red)
			if err != nil {
				return usagef("--reduction: %w", err)
			}
			t, err := sg.ParseElemType(typ)
			if err != nil {
				return usagef("--type: %w", err)
			}
			if count < 1 {
				return usagef("--count %d: want at least 1", count)
			}
			if busyPoll && wakeSocket {
				return usagef("--wake-socket and --busy-poll: pick one (the busy-polling reader needs no wake-up)")
			}
			spin, err := pollSpinFlag(cmd, pollSpin, busyPoll, wakeSocket)
			if err != nil {
				return err
			}
			reps, err := parseReplicas(replicaSets, len(ws))
			if err != nil {
				return err
			}
			choice, err := sg.ParseReplicaChoice(replicaChoice)
			if err != nil {
				return usagef("--replica-choice: %w", err)
			}
			cfg := sg.Config{Interface: iface, Netns: nsArg, Workers: ws, Replicas: reps, ReplicaChoice: choice, EjectBackoff: ejectBackoff, EjectMaxBackoff: ejectMax, Reduction: r, Type: t, FracBits: fracBits,
				Elems: elems, GatherK: gatherK, Need: need, Timeout: timeout, BusyPoll: busyPoll, PollSpin: spin, WakeSocket: wakeSocket, MultiPacket: multiPacket, ScatterBatch: batch, ScatterFirstBatch: firstBatch, StatusDir: runDir,
				Resend: resend, MaxResends: maxResends, ResendQuantile: resendQuantile, ResendMin: resendMin, PacerBackend: pacerBackend,
				UserReduction: sg.UserReduction{Object: userObject, Program: userProg}}
			if cmd.Flags().Changed("resend-ratio") || cmd.Flags().Changed("resend-burst") {
				if !cmd.Flags().Changed("resend-burst") {
					resendBurst = sg.DefaultResendBurst(len(ws))
				}
				cfg.ResendBudget = sg.ResendBudget{Ratio: resendRatio, Burst: resendBurst}
			}
			if local != "" {
				if cfg.Local, err = netip.ParseAddrPort(local); err != nil {
					return usagef("--local %q: %w", local, err)
				}
			}
			if err := cfg.Validate(); err != nil {
				return usageError{Err: err}
			}
			ns, err := openNetns(nsArg)
			if err != nil {
				return err
			}
			_, err = findInterface(ns, nsArg, iface)
			if ns >= 0 {
				ns.Close()
			}
			if err != nil {
				return err
			}
			metrics, err := listenMetrics(metricsAddr)
			if err != nil {
				return err
			}
			defer metrics.Close()
			g, err := sg.Open(cfg)
			if err != nil {
				var le *bpfx.LoadError
				if verbose && errors.As(err, &le) {
					fmt.Fprintln(cmd.ErrOrStderr(), le.Full())
				}
				return err
			}
			defer g.Close()
			metrics.Serve(nil, newSgCollector(g.Stats, g.InFlight, g.ResendState))
			rep := scatterReport{Interface: iface, Local: g.Local().String(), Tier: g.Tier(), Workers: len(ws), Reduction: r.String()}
			for range count {
				res, err := g.Scatter(cmd.Context(), []byte(payload))
				if err != nil {
					return err
				}
				rep.Results = append(rep.Results, res)
			}
			if rep.Stats, err = g.Stats(); err != nil {
				return err
			}
			return writeReport(cmd.OutOrStdout(), output, rep, func(w io.Writer) error {
				for _, res := range rep.Results {
					fmt.Fprintf(w, "request %#x: %s, %d/%d answered (need %d), kernel %v, round trip %v (%s)\n",
						res.ID, res.Status, res.Count, len(ws), res.Need, res.Kernel, res.RoundTrip, res.Reader)
					if res.Values != nil && res.Floats == nil {
						fmt.Fprintf(w, "  %s: %v\n", r, res.Values)
					}
					if res.Floats != nil {
						fmt.Fprintf(w, "  %s: %v\n", r, []float64(res.Floats))
					}
					if res.Overflow {
						fmt.Fprintf(w, "  overflow: a sum wrapped (float sums: use fewer --frac-bits)\n")
					}
					for _, gi := range res.Gathered {
						fmt.Fprintf(w, "  worker %d: %x\n", gi.Worker, gi.Payload)
					}
					if res.Count < len(ws) {
						fmt.Fprintf(w, "  answered: %v\n", res.Answered)
					}
					for _, p := range res.Partial {
						fmt.Fprintf(w, "  worker %d: parts %v of %d arrived (in the aggregate, not answered)\n", p.Worker, p.Parts, p.NParts)
					}
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&iface, "interface", "i", "", "interface the workers are reached through")
	f.StringSliceVar(&workers, "workers", nil, "workers in index order: `ADDR:PORT[+N]`, comma-separated or repeated")
	f.StringArrayVar(&replicaSets, "replicas", nil, "a further replica of every worker (shard), in index order: `ADDR:PORT[+N],...` as many as --workers; repeat for a third and fourth")
	f.StringVar(&replicaChoice, "replica-choice", "rr", "replicas: rr (round robin by request) or latency (the lowest estimated median reply time)")
	f.DurationVar(&ejectBackoff, "eject-backoff", time.Second, "replicas: a replica that leaves a copy unanswered for --timeout gets no copies for this long, doubled per ejection in a row; negative: never eject")
	f.DurationVar(&ejectMax, "eject-max-backoff", 30*time.Second, "replicas: the longest back-off")
	f.DurationVar(&resend, "resend", 0, "send a worker that has not answered after this its copy again, from the kernel: to the next replica of its shard (a hedge) or the same worker (a retry); 0: off (docs/sg.md, \"Re-sends\")")
	f.IntVar(&maxResends, "max-resends", 0, "rounds of re-sends per request, --resend apart (with replicas and an adaptive delay, half the delay after a round; default 1)")
	f.Float64Var(&resendQuantile, "resend-quantile", 0, "re-sends: an adaptive delay, this quantile of the group's reply times (e.g. 0.95) estimated in the kernel, between --resend-min and --resend")
	f.DurationVar(&resendMin, "resend-min", 0, "re-sends: the adaptive delay's floor (default --resend / 10)")
	f.Float64Var(&resendRatio, "resend-ratio", 0.1, "re-send budget: copies re-sent per copy scattered")
	f.IntVar(&resendBurst, "resend-burst", 0, "re-send budget: copies that may be re-sent beyond the ratio (default max(16, 8 x workers))")
	f.StringVar(&pacerBackend, "pacer-backend", "auto", "re-sends: the pacer's delay line: auto, edt, netem or conveyor (docs/pacer.md)")
	f.StringVar(&local, "local", "", "coordinator socket ADDR:PORT (default: the route's source address, any port)")
	f.StringVar(&red, "reduction", "sum", "sum, min, max, count, gather, mean or user (--user-object)")
	f.StringVar(&userObject, "user-object", "", "reduction user: the BPF object of a reduction written in C against bpf/include/sg_user.h (docs/sg.md, \"User reductions\")")
	f.StringVar(&userProg, "user-prog", "", "reduction user: its program in --user-object (default: the object's only XDP program)")
	f.StringVar(&typ, "type", "int64", "element type: int32, int64, float32 or float64 (floats: docs/sg.md, \"Float reductions\")")
	f.IntVar(&fracBits, "frac-bits", 0, "float sum and mean: fraction bits of the fixed point the workers send (default 32: |x| < 2^31, resolution 2^-32)")
	f.IntVar(&elems, "elems", 4, "vector length (gather: payload bytes = elems * type size)")
	f.IntVar(&gatherK, "gather-k", 0, "gather: keep the first K payloads (default: as many as fit)")
	f.IntVar(&need, "need", 0, "replies that complete a request: 0 = all, 1 = any, N = N of M")
	f.DurationVar(&timeout, "timeout", 100*time.Millisecond, "request deadline (enforced in the kernel)")
	f.StringVar(&payload, "payload", "kedge", "request payload (opaque to kedge)")
	f.IntVar(&count, "count", 1, "requests to send, one after the other")
	f.IntVar(&batch, "scatter-batch", 0, "most copies one run of the scatter program sends before it hands the request on (default 64; docs/sg.md, \"Batches\")")
	f.IntVar(&firstBatch, "scatter-first-batch", 0, "copies of the first run (default 8); later runs double it up to --scatter-batch")
	f.BoolVar(&busyPoll, "busy-poll", false, "spin on the result ring instead of sleeping in epoll")
	addPollSpinFlag(cmd, &pollSpin)
	f.BoolVar(&multiPacket, "multi-packet", false, "take multi-packet replies (vectors larger than one datagram, up to 32 parts; not with gather; docs/sg.md)")
	f.BoolVar(&wakeSocket, "wake-socket", false, "let the reply that completes a request wake the reader through the coordinator socket "+
		"instead of the ring buffer's wake-up (docs/sg.md, \"Delivery\")")
	addMetricsFlag(cmd, &metricsAddr)
	f.StringVar(&runDir, "run-dir", runstate.Dir, "directory of the coordinators' status files")
	_ = f.MarkHidden("run-dir")
	addNetnsFlag(cmd, &nsArg, "the interface and the coordinator socket are")
	addOutputFlag(cmd, &output)
	return cmd
}

// addPollSpinFlag adds --poll-spin, Config.PollSpin of the commands that open a group.
func addPollSpinFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "poll-spin", sg.DefaultPollSpin, fmt.Sprintf("how long the result reader polls the ring for the next result while requests are outstanding "+
		"before it sleeps (lower latency, more CPU); 0 or negative: off, the reader sleeps until the ring wakes it; at most %v (docs/sg.md, \"Delivery\")", sg.MaxPollSpin))
}

// pollSpinFlag is --poll-spin as Config.PollSpin: 0 or negative is off (-1); a spin is
// refused beside the readers that ignore it.
func pollSpinFlag(cmd *cobra.Command, d time.Duration, busyPoll, wakeSocket bool) (time.Duration, error) {
	if cmd.Flags().Changed("poll-spin") && d > 0 {
		switch {
		case busyPoll:
			return 0, usagef("--poll-spin with --busy-poll: the busy-polling reader always spins")
		case wakeSocket:
			return 0, usagef("--poll-spin with --wake-socket: the reader the socket wakes does not poll")
		case d > sg.MaxPollSpin:
			return 0, usagef("--poll-spin %v: want at most %v (longer: --busy-poll)", d, sg.MaxPollSpin)
		}
	}
	if d <= 0 {
		return -1, nil
	}
	return d, nil
}

func newSgStatsCmd() *cobra.Command {
	var output, runDir string
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Counters of running sg coordinators (kedge sg scatter, pkg/sg groups with a StatusDir)",
		Example: `  kedge sg stats
  kedge sg stats -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			sts, err := isg.ReadStatuses(runDir)
			if err != nil {
				return err
			}
			type entry struct {
				isg.Status
				Stats sg.Stats `json:"stats"`
			}
			entries := []entry{}
			for _, st := range sts {
				e := entry{Status: st}
				if err := json.Unmarshal(st.Stats, &e.Stats); err != nil {
					return fmt.Errorf("read counters of owner %s: %w", st.Owner, err)
				}
				entries = append(entries, e)
			}
			return writeReport(cmd.OutOrStdout(), output, entries, func(w io.Writer) error {
				if len(entries) == 0 {
					fmt.Fprintln(w, "no running sg coordinator (start one with 'kedge sg scatter')")
					return nil
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PID\tINTERFACE\tWORKERS\tREQUESTS\tCONTINUED\tCOMPLETED\tTIMEOUTS\tREPLIES\tDUPLICATES\tLATE\tSTALE\tMALFORMED\tUNREGISTERED\tSLOT_BUSY")
				for _, e := range entries {
					s := e.Stats
					fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", e.PID, e.Interface, e.Workers, s.Requests, s.Continued, s.Completed, s.Timeouts,
						s.Replies, s.Duplicates, s.Late, s.Stale, s.Malformed+s.BadVersion+s.BadLength, s.Unregistered, s.SlotBusy)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&runDir, "run-dir", runstate.Dir, "directory of the coordinators' status files")
	_ = cmd.Flags().MarkHidden("run-dir")
	addOutputFlag(cmd, &output)
	return cmd
}

// sgCollector serves a group's counters (sg.Stats, docs/sg.md) as kedge_sg_<name>_total,
// its requests in flight as kedge_sg_requests_in_flight and its re-send state
// (sg.ResendState: delay, estimate, budget) as gauges.
type sgCollector struct {
	stats    func() (sg.Stats, error)
	inFlight func() int
	resend   func() (sg.ResendState, error)
	names    []string // json names of sg.Stats, in field order
	counters []*prometheus.Desc
	gauge    *prometheus.Desc
	delay    *prometheus.Desc
	estimate *prometheus.Desc
	budget   *prometheus.Desc
}

func newSgCollector(stats func() (sg.Stats, error), inFlight func() int, resend func() (sg.ResendState, error)) *sgCollector {
	c := &sgCollector{stats: stats, inFlight: inFlight, resend: resend,
		gauge: prometheus.NewDesc("kedge_sg_requests_in_flight", "Requests whose slot is in use (Scatter called, result not read yet).", nil, nil),
		delay: prometheus.NewDesc("kedge_sg_resend_delay_seconds",
			"The delay a round of re-sends is due after: the estimate clamped to [resend-min, resend], or resend (docs/sg.md).", nil, nil),
		estimate: prometheus.NewDesc("kedge_sg_resend_estimate_seconds",
			"The kernel's estimate of the re-send quantile of reply times, unclamped (0: none yet or no quantile).", nil, nil),
		budget: prometheus.NewDesc("kedge_sg_resend_budget_copies", "Re-sent copies the budget would pay for now.", nil, nil)}
	t := reflect.TypeOf(sg.Stats{})
	for i := range t.NumField() {
		name := t.Field(i).Tag.Get("json")
		c.names = append(c.names, name)
		metric := name
		if base, ok := strings.CutSuffix(name, "_ns"); ok {
			metric = base + "_seconds" // served in seconds (Prometheus' base unit)
		}
		c.counters = append(c.counters, prometheus.NewDesc("kedge_sg_"+metric+"_total",
			"sg data-plane counter "+name+" (bpf/include/sg.h struct sg_stats, docs/sg.md).", nil, nil))
	}
	return c
}

func (c *sgCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	ch <- c.gauge
	ch <- c.delay
	ch <- c.estimate
	ch <- c.budget
}

func (c *sgCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.gauge, prometheus.GaugeValue, float64(c.inFlight()))
	if rs, err := c.resend(); err != nil {
		for _, d := range []*prometheus.Desc{c.delay, c.estimate, c.budget} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
	} else {
		ch <- prometheus.MustNewConstMetric(c.delay, prometheus.GaugeValue, rs.Delay.Seconds())
		ch <- prometheus.MustNewConstMetric(c.estimate, prometheus.GaugeValue, rs.Estimate.Seconds())
		ch <- prometheus.MustNewConstMetric(c.budget, prometheus.GaugeValue, rs.Budget)
	}
	st, err := c.stats()
	if err != nil {
		for _, d := range c.counters {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	v := reflect.ValueOf(st)
	for i, d := range c.counters {
		x := float64(v.Field(i).Uint())
		if strings.HasSuffix(c.names[i], "_ns") {
			x /= 1e9
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, x)
	}
}
