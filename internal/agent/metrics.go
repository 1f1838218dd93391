package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/kedge-dev/kedge/internal/version"
)

// metrics is the agent's registry: its own metrics, the Go runtime's and the process's, every
// hedger's collector (registered with the labels netns and interface) and every monitor's
// registry (gathered with the same labels added).
//
//	kedge_agent_info{revision}                        1
//	kedge_agent_config_reloads_total{result}          reloads: success or failure (rejected)
//	kedge_agent_config_last_reload_successful         1 when the last reload was applied
//	kedge_agent_config_last_reload_success_timestamp_seconds
//	kedge_agent_unit_attached{kind,netns,interface}   1 attached, 0 not (retried)
//	kedge_agent_ready                                 1 when every unit is attached
type metrics struct {
	reg     *prometheus.Registry
	reloads *prometheus.CounterVec
	lastOK  prometheus.Gauge
	lastTS  prometheus.Gauge

	mu        sync.Mutex
	gatherers map[*unit]prometheus.Gatherer
}

var (
	unitDesc  = prometheus.NewDesc("kedge_agent_unit_attached", "Whether a configured hedger or monitor is attached (1) or waiting to be retried (0).", []string{"kind", "netns", "interface"}, nil)
	readyDesc = prometheus.NewDesc("kedge_agent_ready", "Whether every configured hedger and monitor is attached (what /readyz says).", nil, nil)
)

func newMetrics(a *Agent) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kedge_agent_config_reloads_total",
			Help: "Config reloads (SIGHUP or a change of the file), by result: success, or failure (the config was rejected and the running one kept).",
		}, []string{"result"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kedge_agent_config_last_reload_successful",
			Help: "1 when the last config load was applied, 0 when it was rejected.",
		}),
		lastTS: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kedge_agent_config_last_reload_success_timestamp_seconds",
			Help: "When a config was last applied (Unix time).",
		}),
		gatherers: map[*unit]prometheus.Gatherer{},
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kedge_agent_info", Help: "The agent's build: revision is the commit.",
		ConstLabels: prometheus.Labels{"revision": version.Revision()},
	})
	info.Set(1)
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	m.reg.MustRegister(m.reloads, m.lastOK, m.lastTS, info, unitCollector{a},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// reloaded records the result of a config load.
func (m *metrics) reloaded(ok bool) {
	if ok {
		m.reloads.WithLabelValues("success").Inc()
		m.lastOK.Set(1)
		m.lastTS.Set(float64(time.Now().UnixNano()) / 1e9)
		return
	}
	m.reloads.WithLabelValues("failure").Inc()
	m.lastOK.Set(0)
}

func unitLabels(u *unit) prometheus.Labels {
	return prometheus.Labels{"netns": u.nsArg, "interface": u.iface}
}

func (m *metrics) register(u *unit, c prometheus.Collector) error {
	return prometheus.WrapRegistererWith(unitLabels(u), m.reg).Register(c)
}

func (m *metrics) unregister(u *unit, c prometheus.Collector) {
	prometheus.WrapRegistererWith(unitLabels(u), m.reg).Unregister(c)
}

func (m *metrics) addGatherer(u *unit, g prometheus.Gatherer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gatherers[u] = labelled{g, unitLabels(u)}
}

func (m *metrics) removeGatherer(u *unit) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.gatherers, u)
}

// Gather collects the agent's registry and every monitor's.
func (m *metrics) Gather() ([]*dto.MetricFamily, error) {
	m.mu.Lock()
	gs := prometheus.Gatherers{m.reg}
	for _, g := range m.gatherers {
		gs = append(gs, g)
	}
	m.mu.Unlock()
	return gs.Gather()
}

// labelled adds constant labels to every metric a gatherer returns.
type labelled struct {
	g      prometheus.Gatherer
	labels prometheus.Labels
}

func (l labelled) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := l.g.Gather()
	for _, mf := range mfs {
		for _, mt := range mf.Metric {
			for name, value := range l.labels {
				mt.Label = append(mt.Label, &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)})
			}
		}
	}
	return mfs, err
}

// unitCollector reports kedge_agent_unit_attached and kedge_agent_ready at each scrape.
type unitCollector struct{ a *Agent }

func (c unitCollector) Describe(ch chan<- *prometheus.Desc) { ch <- unitDesc; ch <- readyDesc }

func (c unitCollector) Collect(ch chan<- prometheus.Metric) {
	ready := 1.0
	for _, u := range c.a.Units() {
		v := 0.0
		if u.Attached {
			v = 1
		} else {
			ready = 0
		}
		ch <- prometheus.MustNewConstMetric(unitDesc, prometheus.GaugeValue, v, u.Kind, u.Netns, u.Interface)
	}
	ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, ready)
}

// Server serves /metrics, /healthz and /readyz.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen opens the agent's HTTP listener on addr (HOST:PORT).
func Listen(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return &Server{ln: ln}, nil
}

// Addr is where the server listens.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves the agent's endpoints in the background:
//
//	/metrics  Prometheus metrics of the agent and everything it runs
//	/healthz  200 while the agent's loop is alive
//	/readyz   200 when every configured unit is attached, else 503 with the ones that are
//	          not and why (JSON)
func (s *Server) Serve(a *Agent) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.alive(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ready, missing := a.Ready()
		w.Header().Set("Content-Type", "application/json")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(struct {
			Ready    bool         `json:"ready"`
			Missing  []UnitStatus `json:"not_attached,omitempty"`
			Units    int          `json:"units"`
			Revision string       `json:"revision"`
		}{ready, missing, len(a.Units()), version.Revision()})
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("agent http server stopped", "err", err)
		}
	}()
}

// Close stops the server (scrapes in flight get up to 2 s).
func (s *Server) Close() error {
	if s.srv == nil {
		return s.ln.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
