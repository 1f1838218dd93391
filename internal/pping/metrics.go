package pping

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// promBuckets are every second edge of the kernel histogram from 2^promMinShift ns
// (1.024 us) to 2^histMaxShift ns (68.7 s): four per power of two (1, 1.25, 1.5, 1.75 x 2^e),
// so a per-subnet histogram converts exactly and histogram_quantile() interpolates within
// buckets at most 25 % of their lower edge wide (p50 and p99 per subnet from PromQL).
var promBuckets = func() []float64 {
	var b []float64
	for e := promMinShift; e < histMaxShift; e++ {
		for q := range uint64(promPerOctave) {
			b = append(b, float64(uint64(1)<<e+q<<(e-2))/1e9)
		}
	}
	return append(b, float64(uint64(1)<<histMaxShift)/1e9)
}()

const (
	promMinShift  = 10 // 1.024 us: below it the samples land in the first bucket
	promPerOctave = 4
)

// Metrics is a Sink that records RTT samples and aggregation reports as Prometheus
// histograms and forwards everything to the next sink. It also exports the monitor's
// counters on every scrape.
type Metrics struct {
	next Sink
	reg  *prometheus.Registry
	rtt  *prometheus.HistogramVec

	timeout time.Duration // drop a subnet after this long without traffic (0: never)

	mu       sync.Mutex
	subnets  map[subnetKey]*SubnetStats // cumulative per prefix and side (aggregation mode)
	lastSeen map[subnetKey]time.Time    // report time of each one's last traffic
}

type subnetKey struct {
	prefix string
	side   Side
}

// NewMetrics registers the monitor's metrics; next receives everything (may be nil).
func NewMetrics(m *Monitor, next Sink) *Metrics {
	mt := &Metrics{
		next: next,
		reg:  prometheus.NewRegistry(),
		rtt: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kedge_pping_rtt_seconds",
			Help:    "RTT samples measured passively, by protocol, identifier and source (tsval, icmp, dns, udp, quic, kernel).",
			Buckets: promBuckets,
		}, []string{"protocol", "id_type", "source"}),
		timeout:  m.cfg.AggTimeout,
		subnets:  map[subnetKey]*SubnetStats{},
		lastSeen: map[subnetKey]time.Time{},
	}
	mt.reg.MustRegister(mt.rtt, &counterCollector{m: m}, &subnetCollector{mt: mt})
	return mt
}

// Event records an RTT sample.
func (mt *Metrics) Event(ev Event) error {
	if e, ok := ev.(*RTTEvent); ok {
		mt.rtt.WithLabelValues(e.Flow.Protocol(), e.Flow.IDType.String(), e.Flow.IDType.Source()).Observe(e.RTT.Seconds())
	}
	if mt.next == nil {
		return nil
	}
	return mt.next.Event(ev)
}

// Aggregate adds a report to the cumulative per-subnet traffic and histograms, and drops the
// subnets that had no traffic for the aggregation timeout (their series end, as ePPing
// forgets idle subnets), so the exported series stay bounded by the active subnets.
func (mt *Metrics) Aggregate(rep *AggReport) error {
	mt.mu.Lock()
	for i := range rep.Subnets {
		s := &rep.Subnets[i]
		k := subnetKey{s.name(), s.Side}
		sum := mt.subnets[k]
		if sum == nil {
			sum = &SubnetStats{}
			mt.subnets[k] = sum
		}
		sum.Merge(s)
		if s.Rx.Packets()+s.Tx.Packets()+s.Count > 0 {
			mt.lastSeen[k] = rep.Time
		}
	}
	if mt.timeout > 0 {
		for name := range mt.subnets {
			if seen, ok := mt.lastSeen[name]; !ok || rep.Time.Sub(seen) > mt.timeout {
				if !ok {
					mt.lastSeen[name] = rep.Time // created without traffic: start its clock
					continue
				}
				delete(mt.subnets, name)
				delete(mt.lastSeen, name)
			}
		}
	}
	mt.mu.Unlock()
	if mt.next == nil {
		return nil
	}
	return mt.next.Aggregate(rep)
}

// Flush flushes the next sink.
func (mt *Metrics) Flush() error {
	if f, ok := mt.next.(flusher); ok {
		return f.Flush()
	}
	return nil
}

// Serve serves /metrics on addr until ctx is done. It returns once the listener is open
// (the address it listens on, useful with port 0) and serves in the background.
func (mt *Metrics) Serve(ctx context.Context, addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(mt.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("pping: metrics server", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { srv.Close() })
	return ln.Addr(), nil
}

// Registry is the registry the metrics live in (for tests and embedding).
func (mt *Metrics) Registry() *prometheus.Registry { return mt.reg }

// counterCollector exports struct pp_counters on every scrape.
type counterCollector struct{ m *Monitor }

var counterDesc = prometheus.NewDesc("kedge_pping_counter_total",
	"pping's per-hook packet counters (struct pp_counters in bpf/include/pping.h).",
	[]string{"hook", "counter"}, nil)

func (c *counterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- counterDesc }

func (c *counterCollector) Collect(ch chan<- prometheus.Metric) {
	all, err := c.m.Counters()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(counterDesc, err)
		return
	}
	for _, h := range Hooks {
		fields, err := CounterFields(&all[h])
		if err != nil {
			ch <- prometheus.NewInvalidMetric(counterDesc, err)
			return
		}
		for _, f := range fields {
			ch <- prometheus.MustNewConstMetric(counterDesc, prometheus.CounterValue, float64(f.Value), h.String(), f.Name)
		}
	}
}

// subnetCollector exports the cumulative per-subnet traffic and histograms of aggregation
// mode.
type subnetCollector struct{ mt *Metrics }

var (
	subnetDesc = prometheus.NewDesc("kedge_pping_subnet_rtt_seconds",
		"RTTs aggregated in the kernel per subnet and side of the interface (aggregation mode), since start.",
		[]string{"prefix", "side"}, nil)
	subnetPktsDesc  = prometheus.NewDesc("kedge_pping_subnet_packets_total", subnetPktsHelp, []string{"prefix", "side", "direction", "traffic"}, nil)
	subnetBytesDesc = prometheus.NewDesc("kedge_pping_subnet_bytes_total", subnetBytesHelp, []string{"prefix", "side", "direction", "traffic"}, nil)
)

const (
	subnetPktsHelp = "IP packets per subnet (aggregation mode), since start: side remote (the endpoint beyond the interface) or local, " +
		"direction rx (arrived on the interface) or tx (left through it); " +
		"traffic tcp_ts (TCP with timestamps, measured), tcp_nots (other TCP) or other."
	subnetBytesHelp = "Bytes (whole frames) of the packets in kedge_pping_subnet_packets_total."
)

func (c *subnetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- subnetDesc
	ch <- subnetPktsDesc
	ch <- subnetBytesDesc
}

func (c *subnetCollector) Collect(ch chan<- prometheus.Metric) {
	c.mt.mu.Lock()
	defer c.mt.mu.Unlock()
	for key, s := range c.mt.subnets {
		prefix, side := key.prefix, key.side.String()
		for _, d := range []struct {
			name string
			t    *Traffic
		}{{"rx", &s.Rx}, {"tx", &s.Tx}} {
			for _, k := range []struct {
				name        string
				pkts, bytes uint64
			}{{"tcp_ts", d.t.TcpTsPkts, d.t.TcpTsBytes}, {"tcp_nots", d.t.TcpNotsPkts, d.t.TcpNotsBytes}, {"other", d.t.OtherPkts, d.t.OtherBytes}} {
				ch <- prometheus.MustNewConstMetric(subnetPktsDesc, prometheus.CounterValue, float64(k.pkts), prefix, side, d.name, k.name)
				ch <- prometheus.MustNewConstMetric(subnetBytesDesc, prometheus.CounterValue, float64(k.bytes), prefix, side, d.name, k.name)
			}
		}
		if s.Count == 0 {
			continue
		}
		ch <- prometheus.MustNewConstHistogram(subnetDesc, s.Count, float64(s.Sum)/1e9, promCumulative(&s.Histogram), prefix, side)
	}
}

// promCumulative converts a kernel histogram into Prometheus's cumulative buckets: every
// promBuckets edge is a kernel bucket edge, so each count is exact.
func promCumulative(h *Histogram) map[float64]uint64 {
	buckets := make(map[float64]uint64, len(promBuckets))
	var cum uint64
	b := 0
	for _, edge := range promBuckets {
		limit := uint64(math.Round(edge * 1e9))
		for ; b < HistBins && HistLayout.Lower(b) < limit; b++ {
			cum += h.Bins[b]
		}
		buckets[edge] = cum
	}
	return buckets
}
