package hedge

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/strictyaml"
)

// Config is what `kedge hedge run` is given (YAML, or flags for one service).
//
//	interface: eth0
//	delay_line: {backend: auto}        # auto | conveyor | netem | edt
//	services:
//	  - name: chaos
//	    address: 198.18.0.12:9999       # where clients send
//	    replicas: [198.18.0.13:9999]    # hedge targets besides address (optional)
//	    request_id: {offset: 0, length: 4, order: big}
//	    delay: 10ms                     # or {quantile: 0.95, min: 1ms, max: 50ms}
//	    budget: {ratio: 0.05, burst: 10}   # mode: window (10s) or bucket
//	    replica_choice: rr              # rr | p50
//	    max_hedges: 1                   # 1..4
type Config struct {
	Interface      string          `yaml:"interface"`
	DelayLine      DelayLineConfig `yaml:"delay_line"`
	Services       []ServiceConfig `yaml:"services"`
	ScoreboardSize uint32          `yaml:"scoreboard_size"`
	TTL            Duration        `yaml:"ttl"`  // scoreboard entry lifetime (default 5s)
	Tick           Duration        `yaml:"tick"` // adaptive-delay refresh and GC period (default 3s)
	Mark           uint32          `yaml:"mark"` // skb mark for hedges (default 0x6b650000)
}

// DelayLineConfig selects and tunes the delay line.
type DelayLineConfig struct {
	Backend string `yaml:"backend"` // auto | conveyor | netem | edt
	// Period is the conveyor/netem transit time; a clone goes round until its deadline is
	// within Period/2. Default: the smallest delay any service can ask for.
	Period Duration `yaml:"period"`
	// RateMbit and FillerBytes tune the conveyor: the spread of its transit time is about
	// FillerBytes*8/Rate, its cost about Rate/(FillerBytes*8) filler frames per second.
	RateMbit    int `yaml:"rate_mbit"`
	FillerBytes int `yaml:"filler_bytes"`
}

// ServiceConfig declares one hedged service.
type ServiceConfig struct {
	Name string `yaml:"name"`
	// Protocol is a preset (ProtocolDNS, ProtocolMemcachedUDP) that sets RequestID, the
	// hedgeable rule and the default port; ProtocolGeneric (the default) takes RequestID as
	// given and hedges every request unless Hedgeable says otherwise.
	Protocol  string        `yaml:"protocol"`
	Address   string        `yaml:"address"`
	Replicas  []string      `yaml:"replicas"`
	RequestID RequestIDSpec `yaml:"request_id"`
	// Hedgeable: the requests that may be hedged, any of these alternatives (nil: the
	// protocol's rule; none: every request).
	Hedgeable []HedgeRule `yaml:"hedgeable"`
	// Ejection is the replica judgement (default on: EjectionSpec).
	Ejection EjectionSpec `yaml:"ejection"`
	Delay    DelaySpec    `yaml:"delay"`
	Budget   BudgetSpec   `yaml:"budget"`
	// ReplicaChoice is how a hedge's replica is chosen among those the request has not been
	// sent to: ReplicaRR (default) or ReplicaP50 (docs/hedging.md, Replica choice).
	ReplicaChoice string `yaml:"replica_choice"`
	// MaxHedges is how many hedges one request may cause, each after a further delay and to
	// another replica (1..MaxHedgesLimit; default 1).
	MaxHedges int `yaml:"max_hedges"`
	// StoreLimit: requests with at most this many bytes of UDP payload take the stored path
	// (nil: the largest payload of the interface's MTU, at most MaxStoreLimit, set by Start;
	// 0: every request is cloned).
	StoreLimit *int           `yaml:"store_limit"`
	addr       netip.AddrPort // parsed
	replicas   []netip.AddrPort
}

// RequestIDSpec locates the request id in the UDP payload (same place in the response).
// A zero Length means the default, DefaultIDLength; the config file and the flags refuse an
// explicit 0.
type RequestIDSpec struct {
	Offset int    `yaml:"offset"`
	Length int    `yaml:"length"`
	Order  string `yaml:"order"` // big | little
}

// String renders the spec as `kedge hedge status` shows it: "offset 0, 4 bytes, big-endian".
func (r RequestIDSpec) String() string {
	return fmt.Sprintf("offset %d, %d bytes, %s-endian", r.Offset, r.Length, r.Order)
}

// requestIDYAML is a request_id mapping as written (a nil Length: not given).
type requestIDYAML struct {
	Offset int    `yaml:"offset"`
	Length *int   `yaml:"length"`
	Order  string `yaml:"order"`
}

// YAMLShape gives strictyaml the keys of a request_id mapping.
func (RequestIDSpec) YAMLShape() any { return requestIDYAML{} }

func (r *RequestIDSpec) UnmarshalYAML(n *yaml.Node) error {
	var raw requestIDYAML
	if err := n.Decode(&raw); err != nil {
		return err
	}
	*r = RequestIDSpec{Offset: raw.Offset, Order: raw.Order}
	if raw.Length != nil {
		if *raw.Length == 0 {
			return fmt.Errorf("line %d: request_id.length 0: use 1..8 bytes (omit it for %d)", n.Line, DefaultIDLength)
		}
		r.Length = *raw.Length
	}
	return nil
}

// Defaults shared by the config file and the flags of `kedge hedge run`.
const (
	// DefaultDelay is the hedge delay of a service that does not set one.
	DefaultDelay = 10 * time.Millisecond
	// DefaultIDLength is the request id's length in bytes when request_id.length is not set.
	DefaultIDLength = 4
)

// DelaySpec is a fixed delay ("10ms") or a quantile of recent latencies with clamps. The
// zero DelaySpec (no delay in the config) means DefaultDelay.
type DelaySpec struct {
	Fixed      time.Duration
	Quantile   float64
	Min, Max   time.Duration
	MinSamples int
}

// DefaultMark is the skb mark hedges carry unless the config sets one: hedging's entry in the
// mark registry (bpf/include/marks.h, "ke" in its top bytes).
const DefaultMark = uint32(hedgeKedgeMarkKEDGE_MARK_HEDGE)

// The range of a hedge delay (fixed, or an adaptive delay's clamps).
const minDelay, maxDelay, delayRange = 200 * time.Microsecond, 10 * time.Second, "200us..10s"

// minFillerBytes is the smallest filler the pacer takes (a filler must hold a tick
// frame); maxFillerBytes the largest conveyor filler frame measured to circulate.
const minFillerBytes, maxFillerBytes = 128, 3600

// BudgetSpec limits hedges to Ratio of requests plus Burst (docs/hedging.md, Budget): over
// a sliding Window (Mode "window", the default) or with a token bucket (Mode "bucket").
type BudgetSpec struct {
	Mode   string   `yaml:"mode"`   // window | bucket
	Ratio  float64  `yaml:"ratio"`  // hedges per request
	Burst  int      `yaml:"burst"`  // bucket size, or the window's floor
	Window Duration `yaml:"window"` // window mode: the sliding window (default 10s)
}

// Budget modes.
const (
	BudgetWindow = "window"
	BudgetBucket = "bucket"
)

// DefaultBudgetWindow is the window mode's default window (Finagle's 10 s).
const DefaultBudgetWindow = 10 * time.Second

// DefaultBudgetMode is the window: a stall's requests are covered by the whole window's
// requests and waiting requests hold nothing (docs/hedging.md, Budget).
const DefaultBudgetMode = BudgetWindow

// Replica choices (enum replica_choice in bpf/include/hedge.h).
const (
	ReplicaRR  = "rr"
	ReplicaP50 = "p50"
)

// MaxHedgesLimit is the most hedges a request may cause (MAX_HEDGES in bpf/include/hedge.h).
const MaxHedgesLimit = int(hedgeHedgeLimitsMAX_HEDGES)

// Duration is a time.Duration read from YAML as "10ms".
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (use e.g. 10ms, 1.5s)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// delayYAML is an adaptive delay's mapping as written.
type delayYAML struct {
	Quantile   float64  `yaml:"quantile"`
	Min        Duration `yaml:"min"`
	Max        Duration `yaml:"max"`
	MinSamples int      `yaml:"min_samples"`
}

// YAMLShape gives strictyaml the keys of an adaptive delay's mapping.
func (DelaySpec) YAMLShape() any { return delayYAML{} }

func (d *DelaySpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		v, err := time.ParseDuration(n.Value)
		if err != nil {
			return fmt.Errorf("line %d: delay %q is neither a duration (10ms) nor {quantile, min, max}", n.Line, n.Value)
		}
		if v <= 0 {
			// Not "required": the zero DelaySpec is the default, so say what is wrong here.
			return fmt.Errorf("line %d: delay %v out of range: use %s (omit it for %v)", n.Line, v, delayRange, DefaultDelay)
		}
		*d = DelaySpec{Fixed: v}
		return nil
	}
	var raw delayYAML
	if err := n.Decode(&raw); err != nil {
		return err
	}
	*d = DelaySpec{Quantile: raw.Quantile, Min: time.Duration(raw.Min), Max: time.Duration(raw.Max), MinSamples: raw.MinSamples}
	return nil
}

// String renders the delay as in the config.
func (d DelaySpec) String() string {
	if d.Quantile == 0 {
		return d.Fixed.String()
	}
	return fmt.Sprintf("p%g [%v, %v]", d.Quantile*100, d.Min, d.Max)
}

// Backends (the pacer's), in order of preference.
const (
	BackendEDT      = pacer.BackendEDT
	BackendNetem    = pacer.BackendNetem
	BackendConveyor = pacer.BackendConveyor
	BackendAuto     = pacer.BackendAuto
)

// LoadConfig reads and validates a YAML config file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var c Config
	if err := strictyaml.Decode(b, &c); err != nil {
		if errors.Is(err, strictyaml.ErrEmpty) {
			return nil, fmt.Errorf("config %s is empty: declare an interface and its services (docs/hedging.md has every key)", path)
		}
		return nil, fmt.Errorf("parse config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &c, nil
}

// Validate fills defaults and rejects what cannot work, saying what to change.
func (c *Config) Validate() error {
	if c.Interface == "" {
		return errors.New("interface is required: the client-side interface requests leave through (e.g. eth0)")
	}
	if len(c.Services) == 0 {
		return errors.New("no services: declare at least one under 'services'")
	}
	if len(c.Services) > svcMax {
		return fmt.Errorf("%d services, at most %d are supported", len(c.Services), svcMax)
	}
	switch c.DelayLine.Backend {
	case "":
		c.DelayLine.Backend = BackendAuto
	case BackendAuto, BackendConveyor, BackendNetem, BackendEDT:
	default:
		return fmt.Errorf("delay_line.backend %q unknown: use auto, conveyor, netem or edt", c.DelayLine.Backend)
	}
	if c.DelayLine.RateMbit == 0 {
		c.DelayLine.RateMbit = 100
	}
	if c.DelayLine.FillerBytes == 0 {
		c.DelayLine.FillerBytes = 1514
	}
	// Frames of up to 3600 bytes circulate; 4500 and more did not (the hedger then fails
	// to start with "fillers are not circulating"), so larger values are refused here.
	if c.DelayLine.FillerBytes < minFillerBytes || c.DelayLine.FillerBytes > maxFillerBytes {
		return fmt.Errorf("delay_line.filler_bytes %d out of range: use %d..%d", c.DelayLine.FillerBytes, minFillerBytes, maxFillerBytes)
	}
	if c.DelayLine.RateMbit < 1 || c.DelayLine.RateMbit > 10000 {
		return fmt.Errorf("delay_line.rate_mbit %d out of range: use 1..10000", c.DelayLine.RateMbit)
	}
	if c.ScoreboardSize == 0 {
		c.ScoreboardSize = 65536
	}
	if c.TTL == 0 {
		c.TTL = Duration(5 * time.Second)
	}
	if c.Tick == 0 {
		c.Tick = Duration(3 * time.Second)
	}
	if c.Mark == 0 {
		c.Mark = DefaultMark
	}
	seen := map[netip.AddrPort]string{}
	shortest := time.Duration(0)
	for i := range c.Services {
		s := &c.Services[i]
		if err := s.validate(i); err != nil {
			return err
		}
		if other, dup := seen[s.addr]; dup {
			return fmt.Errorf("services %q and %q share address %s", other, s.Name, s.addr)
		}
		seen[s.addr] = s.Name
		d := s.Delay.Fixed
		if s.Delay.Quantile > 0 {
			d = s.Delay.Min
		}
		if shortest == 0 || d < shortest {
			shortest = d
		}
		if time.Duration(c.TTL) < 2*s.maxDelay() {
			return fmt.Errorf("ttl %v is shorter than twice service %q's largest delay %v: raise ttl", time.Duration(c.TTL), s.Name, s.maxDelay())
		}
	}
	if c.DelayLine.Period == 0 {
		c.DelayLine.Period = Duration(shortest)
	}
	if p := time.Duration(c.DelayLine.Period); p < 200*time.Microsecond || p > 10*time.Second {
		return fmt.Errorf("delay_line.period %v out of range: use 200us..10s", p)
	}
	return nil
}

func (s *ServiceConfig) maxDelay() time.Duration {
	if s.Delay.Quantile > 0 {
		return s.Delay.Max
	}
	return s.Delay.Fixed
}

func (s *ServiceConfig) validate(i int) error {
	if s.Name == "" {
		s.Name = fmt.Sprintf("svc%d", i)
	}
	where := fmt.Sprintf("service %q", s.Name)
	if err := s.validateProtocol(where); err != nil {
		return err
	}
	var err error
	if s.addr, err = netip.ParseAddrPort(s.Address); err != nil {
		return fmt.Errorf("%s: address %q: want ip:port (e.g. 198.18.0.12:9999 or [2001:db8::12]:9999)", where, s.Address)
	}
	s.addr = netip.AddrPortFrom(s.addr.Addr().Unmap(), s.addr.Port())
	s.replicas = []netip.AddrPort{s.addr}
	for _, r := range s.Replicas {
		ap, err := netip.ParseAddrPort(r)
		if err != nil {
			return fmt.Errorf("%s: replica %q: want ip:port", where, r)
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if ap.Addr().Is4() != s.addr.Addr().Is4() {
			return fmt.Errorf("%s: replica %s and address %s differ in IP family", where, ap, s.addr)
		}
		if ap != s.addr {
			s.replicas = append(s.replicas, ap)
		}
	}
	if len(s.replicas) > replicaMax {
		return fmt.Errorf("%s: %d replicas, at most %d", where, len(s.replicas), replicaMax)
	}
	if err := s.validateStore(where); err != nil {
		return err
	}
	r := &s.RequestID
	if r.Length == 0 {
		r.Length = DefaultIDLength
	}
	if r.Length < 1 || r.Length > 8 {
		return fmt.Errorf("%s: request_id.length %d: use 1..8 bytes", where, r.Length)
	}
	if r.Offset < 0 || r.Offset > maxRuleOffset {
		return fmt.Errorf("%s: request_id.offset %d: use 0..%d", where, r.Offset, maxRuleOffset)
	}
	switch r.Order {
	case "":
		r.Order = "big"
	case "big", "little":
	default:
		return fmt.Errorf("%s: request_id.order %q: use big or little", where, r.Order)
	}
	d := &s.Delay
	if d.Quantile == 0 && d.Fixed == 0 {
		d.Fixed = DefaultDelay
	}
	switch {
	case d.Quantile == 0 && (d.Fixed < minDelay || d.Fixed > maxDelay):
		return fmt.Errorf("%s: delay %v out of range: use %s", where, d.Fixed, delayRange)
	case d.Quantile != 0 && (d.Quantile <= 0 || d.Quantile >= 1):
		return fmt.Errorf("%s: delay.quantile %g: use a fraction in (0, 1), e.g. 0.95", where, d.Quantile)
	case d.Quantile != 0 && (d.Min < minDelay || d.Max < d.Min || d.Max > maxDelay):
		return fmt.Errorf("%s: delay needs 200us <= min <= max <= 10s (got min %v, max %v)", where, d.Min, d.Max)
	}
	if d.Quantile != 0 && d.MinSamples == 0 {
		d.MinSamples = 100
	}
	switch s.ReplicaChoice {
	case "":
		s.ReplicaChoice = ReplicaRR
	case ReplicaRR, ReplicaP50:
	default:
		return fmt.Errorf("%s: replica_choice %q: use rr (round robin) or p50 (lowest recent median latency)", where, s.ReplicaChoice)
	}
	if s.MaxHedges == 0 {
		s.MaxHedges = 1
	}
	if s.MaxHedges < 1 || s.MaxHedges > MaxHedgesLimit {
		return fmt.Errorf("%s: max_hedges %d: use 1..%d (omit it for 1)", where, s.MaxHedges, MaxHedgesLimit)
	}
	// Each hedge goes to a replica the request has not been sent to; a service with one
	// address hedges to that address, as often as max_hedges says.
	if n := len(s.replicas); n > 1 && s.MaxHedges > n-1 {
		return fmt.Errorf("%s: max_hedges %d but %d other replica(s): each hedge goes to a different one; "+
			"lower max_hedges to %d or add replicas", where, s.MaxHedges, n-1, n-1)
	}
	if err := s.Ejection.validate(); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	b := &s.Budget
	if b.Ratio == 0 && b.Burst == 0 {
		b.Ratio, b.Burst = 0.05, 10
	}
	switch b.Mode {
	case "":
		b.Mode = DefaultBudgetMode
	case BudgetWindow, BudgetBucket:
	default:
		return fmt.Errorf("%s: budget.mode %q: use window or bucket", where, b.Mode)
	}
	if b.Mode == BudgetWindow && b.Window == 0 {
		b.Window = Duration(DefaultBudgetWindow)
	}
	if w := time.Duration(b.Window); b.Mode == BudgetWindow && (w < time.Second || w > time.Hour) {
		return fmt.Errorf("%s: budget.window %v: use 1s..1h", where, w)
	}
	if b.Mode == BudgetBucket && b.Window != 0 {
		return fmt.Errorf("%s: budget.window is for mode window: remove it, or use mode window", where)
	}
	if b.Ratio < 0 || b.Ratio > 1 {
		return fmt.Errorf("%s: budget.ratio %g: use 0..1 (hedges per request; 0.05 = 5%% extra load)", where, b.Ratio)
	}
	if b.Burst < 1 || b.Burst > 100000 {
		return fmt.Errorf("%s: budget.burst %d: use 1..100000", where, b.Burst)
	}
	return nil
}
