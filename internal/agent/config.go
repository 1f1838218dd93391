// Package agent is `kedge agent`: one long-running process that keeps the host-level
// capabilities attached as one config file says - hedged services (per interface and
// network namespace, several at once) and pping monitors - serves one Prometheus endpoint
// with /healthz and /readyz, and applies a changed config without detaching what did not
// change. docs/deploy.md describes its use; the config keys are documented on Config.
package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/pping"
	"github.com/kedge-dev/kedge/internal/strictyaml"
)

// DefaultPath is where the agent reads its config unless told otherwise.
const DefaultPath = "/etc/kedge/kedge.yaml"

// Config is the agent's config file (kedge.yaml):
//
//	listen: 127.0.0.1:9464          # /metrics, /healthz, /readyz
//	log: {level: info, format: text}  # format: text | json
//	retry: 5s                       # how often what is not attached is retried and
//	                                # attachments are checked
//	hedge:                          # hedgers: one per interface (and namespace)
//	  - interface: eth0
//	    netns: ""                   # a name under /run/netns or a path; "": the agent's own
//	    service_slots: 8            # services it can take without a restart (default: 4 more than configured)
//	    delay_line: {backend: auto}
//	    services:                   # as in `kedge hedge run --config` (docs/hedging.md)
//	      - name: dns
//	        address: 10.96.0.10:53
//	        replicas: [10.244.1.5:53, 10.244.2.7:53]
//	        request_id: {offset: 0, length: 2}
//	        delay: 10ms
//	pping:                          # latency monitors: one per interface (and namespace)
//	  - interface: eth0
//	    netns: ""
//	    tcp: true                   # tcp, icmp, dns, quic: the identifiers tracked (default all)
//	    quic_ports: [443]           # UDP ports whose traffic is QUIC (spin bit)
//	    kernel_rtt: true            # the kernel's RTTs of the namespace's TCP sockets (default on)
//	    cgroup: ""                  # whose sockets: a cgroup2 directory ("": the root, every process)
//	    udp_services: ["9999:0:4"]  # PORT:OFFSET:LEN[:le|be]
//	    aggregate: 10s              # per-subnet histograms every 10 s
//	    prefix_v4: 24
//	    prefix_v6: 48
type Config struct {
	Listen string        `yaml:"listen"`
	Log    LogConfig     `yaml:"log"`
	Retry  Duration      `yaml:"retry"`
	Hedge  []HedgeConfig `yaml:"hedge"`
	Pping  []PpingConfig `yaml:"pping"`
}

// LogConfig selects the log level (debug, info, warn, error) and format (text, json).
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// HedgeConfig is one hedger: hedge.Config (interface, delay line, services, ...) plus
// where it runs and how many services it is sized for.
type HedgeConfig struct {
	Netns        string `yaml:"netns"`
	ServiceSlots int    `yaml:"service_slots"`
	hedge.Config `yaml:",inline"`
}

// PpingConfig is one latency monitor.
type PpingConfig struct {
	Interface   string   `yaml:"interface"`
	Netns       string   `yaml:"netns"`
	TCP         *bool    `yaml:"tcp"`
	ICMP        *bool    `yaml:"icmp"`
	DNS         *bool    `yaml:"dns"`
	QUIC        *bool    `yaml:"quic"`
	QUICPorts   []uint16 `yaml:"quic_ports"`
	KernelRTT   *bool    `yaml:"kernel_rtt"`
	Cgroup      string   `yaml:"cgroup"`
	UDPServices []string `yaml:"udp_services"`
	RateLimit   Duration `yaml:"rate_limit"`
	Aggregate   Duration `yaml:"aggregate"`
	PrefixV4    *int     `yaml:"prefix_v4"`
	PrefixV6    *int     `yaml:"prefix_v6"`
	AggTimeout  Duration `yaml:"aggregate_timeout"`
	IngressHook string   `yaml:"ingress_hook"`
	Local       bool     `yaml:"include_local"`
	MaxFlows    int      `yaml:"max_flows"`
}

// Duration is a time.Duration written as "10s".
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (use e.g. 500ms, 10s)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// Defaults.
const (
	DefaultListen = "127.0.0.1:9464"
	DefaultRetry  = 5 * time.Second
	// spareSlots is how many services a hedger takes beyond its configured ones without a
	// restart, unless service_slots says otherwise (each slot costs about 2 MiB of kernel
	// memory for its store ring).
	spareSlots = 4
	// maxServiceSlots is the hedger's limit (SVC_MAX in bpf/include/hedge.h).
	maxServiceSlots = 64
)

// ErrInvalid marks a config that does not validate (the caller keeps the running one):
// errors.Is(err, ErrInvalid) holds for Load's and Parse's validation errors.
var ErrInvalid = errors.New("invalid config")

// invalidError is a validation error of the config file named Name.
type invalidError struct {
	Name string
	Err  error
}

func (e *invalidError) Error() string        { return "config " + e.Name + ": " + e.Err.Error() }
func (e *invalidError) Unwrap() error        { return e.Err }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

// Load reads and validates the config file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, b)
}

// Parse decodes and validates a config (name names it in messages).
func Parse(name string, b []byte) (*Config, error) {
	var c Config
	if err := strictyaml.Decode(b, &c); err != nil {
		if errors.Is(err, strictyaml.ErrEmpty) {
			err = errors.New("the file is empty: declare what to run under 'hedge' and 'pping' (docs/deploy.md has an example)")
		}
		return nil, &invalidError{name, err}
	}
	if err := c.Validate(); err != nil {
		return nil, &invalidError{name, err}
	}
	return &c, nil
}

// Validate fills in defaults and checks everything that can be checked without root:
// each hedger's and monitor's settings, and no two on the same interface. A config that
// declares nothing is valid (the packaged default): the agent then serves its endpoints
// and waits for a reload.
func (c *Config) Validate() error {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen %q: want HOST:PORT, e.g. 127.0.0.1:9464 or :9464", c.Listen)
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		return err
	}
	switch c.Log.Format {
	case "":
		c.Log.Format = "text"
	case "text", "json":
	default:
		return fmt.Errorf("log.format %q: use text or json", c.Log.Format)
	}
	if c.Retry == 0 {
		c.Retry = Duration(DefaultRetry)
	}
	if r := time.Duration(c.Retry); r < 100*time.Millisecond || r > time.Hour {
		return fmt.Errorf("retry %v: use 100ms..1h", r)
	}
	seen := map[string]int{}
	for i := range c.Hedge {
		h := &c.Hedge[i]
		where := fmt.Sprintf("hedge[%d]", i)
		if h.Interface != "" {
			where = fmt.Sprintf("hedge[%d] (%s)", i, h.key())
		}
		if j, dup := seen[h.key()]; dup {
			return fmt.Errorf("%s: hedge[%d] is on the same interface: put both's services in one", where, j)
		}
		seen[h.key()] = i
		if h.ServiceSlots < 0 || h.ServiceSlots > maxServiceSlots {
			return fmt.Errorf("%s: service_slots %d: use 0 (default) or up to %d", where, h.ServiceSlots, maxServiceSlots)
		}
		if h.ServiceSlots != 0 && h.ServiceSlots < len(h.Services) {
			return fmt.Errorf("%s: service_slots %d is fewer than its %d services", where, h.ServiceSlots, len(h.Services))
		}
		cfg := cloneHedge(&h.Config)
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		names := map[string]bool{}
		for _, s := range cfg.Services {
			if names[s.Name] {
				return fmt.Errorf("%s: two services named %q: names must differ (they key the metrics and reloads)", where, s.Name)
			}
			names[s.Name] = true
		}
	}
	seen = map[string]int{}
	for i := range c.Pping {
		p := &c.Pping[i]
		where := fmt.Sprintf("pping[%d]", i)
		if p.Interface == "" {
			return fmt.Errorf("%s: interface is required (e.g. eth0)", where)
		}
		where = fmt.Sprintf("pping[%d] (%s)", i, p.key())
		if j, dup := seen[p.key()]; dup {
			return fmt.Errorf("%s: pping[%d] is on the same interface", where, j)
		}
		seen[p.key()] = i
		if _, err := p.monitorConfig(); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// slots is the hedger's service slots.
func (h *HedgeConfig) slots() int {
	if h.ServiceSlots > 0 {
		return h.ServiceSlots
	}
	return min(len(h.Services)+spareSlots, maxServiceSlots)
}

func key(netns, iface string) string {
	if netns == "" {
		return iface
	}
	return netns + "/" + iface
}

func (h *HedgeConfig) key() string { return key(h.Netns, h.Interface) }
func (p *PpingConfig) key() string { return key(p.Netns, p.Interface) }

// cloneHedge deep-copies a hedge config (hedge.Config.Validate and hedge.Start fill in
// defaults in place; the agent keeps the config as written to compare on reload).
func cloneHedge(c *hedge.Config) *hedge.Config {
	out := *c
	out.Services = slices.Clone(c.Services)
	for i := range out.Services {
		s := &out.Services[i]
		s.Replicas = slices.Clone(s.Replicas)
		s.Hedgeable = slices.Clone(s.Hedgeable)
		if s.StoreLimit != nil {
			v := *s.StoreLimit
			s.StoreLimit = &v
		}
	}
	return &out
}

// monitorConfig turns the monitor's keys into pping.Config on ePPing's defaults.
func (p *PpingConfig) monitorConfig() (pping.Config, error) {
	cfg := pping.DefaultConfig()
	flag := func(b *bool, def bool) bool {
		if b == nil {
			return def
		}
		return *b
	}
	cfg.TCP, cfg.ICMP, cfg.DNS = flag(p.TCP, true), flag(p.ICMP, true), flag(p.DNS, true)
	cfg.QUIC = flag(p.QUIC, true)
	if len(p.QUICPorts) > 0 {
		cfg.QUICPorts = p.QUICPorts
	}
	if p.KernelRTT != nil && *p.KernelRTT && !cfg.TCP {
		return cfg, errors.New("kernel_rtt measures TCP sockets: set tcp too, or leave kernel_rtt out")
	}
	cfg.KernelRTT = cfg.TCP && flag(p.KernelRTT, true)
	cfg.Cgroup = p.Cgroup
	for _, s := range p.UDPServices {
		svc, err := pping.ParseService(s)
		if err != nil {
			return cfg, fmt.Errorf("udp_services: %w", err)
		}
		cfg.Services = append(cfg.Services, svc)
	}
	if p.RateLimit != 0 {
		cfg.RateLimit = time.Duration(p.RateLimit)
	}
	cfg.Aggregate = 10 * time.Second
	if p.Aggregate != 0 {
		cfg.Aggregate = time.Duration(p.Aggregate)
	}
	if cfg.Aggregate < 100*time.Millisecond {
		return cfg, fmt.Errorf("aggregate %v: use 100ms or more (the per-subnet histograms are read this often)", cfg.Aggregate)
	}
	if p.PrefixV4 != nil {
		cfg.AggPrefixV4 = *p.PrefixV4
	}
	if p.PrefixV6 != nil {
		cfg.AggPrefixV6 = *p.PrefixV6
	}
	if p.AggTimeout != 0 {
		cfg.AggTimeout = time.Duration(p.AggTimeout)
	}
	if p.IngressHook != "" {
		h, err := pping.ParseIngressHook(p.IngressHook)
		if err != nil {
			return cfg, fmt.Errorf("ingress_hook: %w", err)
		}
		cfg.IngressHook = h
	}
	cfg.IncludeLocal = p.Local
	cfg.MaxFlows = p.MaxFlows
	if err := cfg.Validate(); err != nil {
		return cfg, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return cfg, nil
}
