package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"gopkg.in/yaml.v3"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pping"
)

// Agent runs what a Config declares. Its units (one hedger per hedge entry, one monitor per
// pping entry) are attached by Apply and retried, and their interfaces checked, every
// Config.Retry by Run; Close detaches them all.
type Agent struct {
	log     *slog.Logger
	metrics *metrics

	mu     sync.Mutex // held while units change (starting a hedger takes a second or more)
	cfg    *Config
	hedges map[string]*hedgeUnit
	pings  map[string]*ppingUnit

	// status is what Units reports, published under mu whenever a unit changes, so scrapes
	// and probes never wait for a unit starting.
	statusMu sync.Mutex
	status   []UnitStatus
	applied  bool // a config has been applied: before that the agent is not ready

	// lastLoop is when Run's loop last ran (UnixNano); healthWindow how old it may be.
	lastLoop, healthWindow atomic.Int64
	// listenAddr is where the HTTP endpoint listens now (a string), for the status file.
	listenAddr atomic.Value
}

// New returns an agent with nothing attached yet; Apply attaches cfg's units.
func New(log *slog.Logger) *Agent {
	if log == nil {
		log = slog.Default()
	}
	a := &Agent{log: log, hedges: map[string]*hedgeUnit{}, pings: map[string]*ppingUnit{}}
	a.metrics = newMetrics(a)
	return a
}

// unit is what hedge and pping units share: where they run, whether they are attached and,
// if not, why.
type unit struct {
	kind, name, nsArg, iface string
	spec                     string // the config as written, marshalled: what reloads compare
	ns                       netns.NsHandle
	ifindex                  int
	err                      error // why it is not attached (nil: attached)
	since                    time.Time
}

func (u *unit) label() string { return u.kind + " " + key(u.nsArg, u.iface) }

// openNetns opens a unit's namespace: "" the agent's own, a path, or a name under /run/netns.
func openNetns(arg string) (netns.NsHandle, error) {
	h, err := netnsx.Open(arg)
	switch {
	case err == nil:
		return h, nil
	case strings.Contains(arg, "/"):
		return h, fmt.Errorf("open netns %s: %w", arg, err)
	}
	return h, fmt.Errorf("open netns %s: %w (see 'ip netns list')", arg, err)
}

func (u *unit) closeNetns() {
	if u.ns >= 0 {
		u.ns.Close()
	}
	u.ns = netns.None()
}

// present reports whether the unit's interface still is the one it attached to.
func (u *unit) present() error {
	idx, err := bpfx.IfIndex(u.ns, u.iface)
	if err != nil {
		return err
	}
	if idx != u.ifindex {
		return fmt.Errorf("interface %s was replaced (index %d, attached to %d)", u.iface, idx, u.ifindex)
	}
	return nil
}

type hedgeUnit struct {
	unit
	instance  int // tells its delay line apart from the other hedgers' (hedge.Options.Instance)
	cfg       HedgeConfig
	h         *hedge.Hedger
	collector prometheus.Collector
	stop      context.CancelFunc
	done      chan struct{}
}

type ppingUnit struct {
	unit
	cfg     PpingConfig
	m       *pping.Monitor
	metrics *pping.Metrics
	stop    context.CancelFunc
	done    chan struct{}
	runErr  chan error
}

func marshal(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v) // not reached for config types
	}
	return string(b)
}

// Apply makes the running units match cfg (already validated): units no longer declared
// are detached, new ones attached, changed ones updated in place where they can be (a
// hedger's services) or replaced; units whose config did not change are not touched. A
// unit that cannot attach now (its interface or namespace missing, ...) is reported by
// Ready and retried by Run. Apply returns the units' errors, for the log; cfg is applied
// either way.
func (a *Agent) Apply(cfg *Config) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cfg = cfg
	var errs []error
	want := map[string]bool{}
	for _, hc := range cfg.Hedge {
		k := hc.key()
		want[k] = true
		spec := marshal(hc)
		u := a.hedges[k]
		switch {
		case u == nil:
			u = &hedgeUnit{unit: unit{kind: "hedge", name: k, nsArg: hc.Netns, iface: hc.Interface, ns: netns.None()}, instance: a.freeInstance()}
			a.hedges[k] = u
			a.log.Info("hedger added", "interface", hc.Interface, "netns", hc.Netns, "services", len(hc.Services))
		case u.spec == spec:
			continue
		case u.h != nil:
			err := u.h.Update(cloneHedge(&hc.Config))
			if err == nil {
				u.spec, u.cfg = spec, hc
				a.log.Info("hedger updated in place", "interface", hc.Interface, "netns", hc.Netns, "services", len(hc.Services))
				continue
			}
			a.log.Info("hedger restarts", "interface", hc.Interface, "netns", hc.Netns, "why", err)
			a.stopHedge(u)
		}
		u.cfg, u.spec = hc, spec
		errs = append(errs, a.startHedge(u))
	}
	prune(a.hedges, want, func(u *hedgeUnit) {
		a.stopHedge(u)
		a.log.Info("hedger removed", "interface", u.iface, "netns", u.nsArg)
	})
	want = map[string]bool{}
	for _, pc := range cfg.Pping {
		k := pc.key()
		want[k] = true
		spec := marshal(pc)
		u := a.pings[k]
		switch {
		case u == nil:
			u = &ppingUnit{unit: unit{kind: "pping", name: k, nsArg: pc.Netns, iface: pc.Interface, ns: netns.None()}}
			a.pings[k] = u
			a.log.Info("monitor added", "interface", pc.Interface, "netns", pc.Netns)
		case u.spec == spec:
			continue
		default:
			a.log.Info("monitor restarts: its config changed", "interface", pc.Interface, "netns", pc.Netns)
			a.stopPping(u)
		}
		u.cfg, u.spec = pc, spec
		errs = append(errs, a.startPping(u))
	}
	prune(a.pings, want, func(u *ppingUnit) {
		a.stopPping(u)
		a.log.Info("monitor removed", "interface", u.iface, "netns", u.nsArg)
	})
	a.publish()
	a.statusMu.Lock()
	a.applied = true
	a.statusMu.Unlock()
	return errors.Join(errs...)
}

// fail records why u is not attached (logged when the reason changes).
func (a *Agent) fail(u *unit, err error) error {
	if u.err == nil || u.err.Error() != err.Error() {
		a.log.Warn("not attached; retrying", "unit", u.label(), "err", err)
	}
	u.err, u.since = err, time.Now()
	a.publish()
	return fmt.Errorf("%s: %w", u.label(), err)
}

func (a *Agent) attached(u *unit) {
	u.err, u.since = nil, time.Now()
	a.publish()
}

func (a *Agent) startHedge(u *hedgeUnit) error {
	var err error
	if u.ns, err = openNetns(u.nsArg); err != nil {
		return a.fail(&u.unit, err)
	}
	h, err := hedge.Start(cloneHedge(&u.cfg.Config), hedge.Options{Netns: u.ns, ServiceSlots: u.cfg.slots(), Instance: u.instance, Log: a.log})
	if err != nil {
		u.closeNetns()
		return a.fail(&u.unit, err)
	}
	u.h, u.ifindex = h, h.IfIndex
	u.collector = hedge.NewCollector(h)
	if err := a.metrics.register(&u.unit, u.collector); err != nil {
		a.log.Warn("hedger metrics not registered", "unit", u.label(), "err", err)
		u.collector = nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	u.stop, u.done = cancel, make(chan struct{})
	go func() {
		defer close(u.done)
		h.Watch(ctx, 10*time.Second)
	}()
	a.attached(&u.unit)
	return nil
}

// freeInstance is the lowest hedger instance number no unit has (1, 2, ...: the agent's
// delay lines never take the names of a `kedge hedge run`'s).
func (a *Agent) freeInstance() int {
	for n := 1; ; n++ {
		if !slices.ContainsFunc(slices.Collect(maps.Values(a.hedges)), func(u *hedgeUnit) bool { return u.instance == n }) {
			return n
		}
	}
}

func (a *Agent) stopHedge(u *hedgeUnit) {
	if u.stop != nil {
		u.stop()
		<-u.done
		u.stop = nil
	}
	if u.collector != nil {
		a.metrics.unregister(&u.unit, u.collector)
		u.collector = nil
	}
	if u.h != nil {
		if err := u.h.Close(); err != nil {
			a.log.Warn("detach hedger", "unit", u.label(), "err", err)
		}
		u.h = nil
	}
	u.closeNetns()
}

func (a *Agent) startPping(u *ppingUnit) error {
	cfg, err := u.cfg.monitorConfig()
	if err != nil {
		return a.fail(&u.unit, err) // validated before; not reached
	}
	if u.ns, err = openNetns(u.nsArg); err != nil {
		return a.fail(&u.unit, err)
	}
	if u.ifindex, err = bpfx.IfIndex(u.ns, u.iface); err != nil {
		u.closeNetns()
		return a.fail(&u.unit, fmt.Errorf("interface %s: %w", u.iface, err))
	}
	if cfg.KernelRTT {
		// On by default: where it cannot run, the monitor runs without it; asked for
		// explicitly (kernel_rtt: true), that is the unit's error.
		if _, err := pping.KernelRTTPreflight(cfg.Cgroup); err != nil {
			if u.cfg.KernelRTT != nil {
				u.closeNetns()
				return a.fail(&u.unit, err)
			}
			a.log.Warn("pping without the kernel's RTTs", "unit", u.label(), "reason", err)
			cfg.KernelRTT = false
		}
	}
	m, err := pping.Load(cfg)
	if err != nil {
		u.closeNetns()
		return a.fail(&u.unit, err)
	}
	if err := m.Attach(u.ns, u.ifindex, bpfx.TCAuto); err != nil {
		m.Close()
		u.closeNetns()
		return a.fail(&u.unit, err)
	}
	u.m, u.metrics = m, pping.NewMetrics(m, nil)
	a.metrics.addGatherer(&u.unit, u.metrics.Registry())
	ctx, cancel := context.WithCancel(context.Background())
	u.stop, u.done, u.runErr = cancel, make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(u.done)
		u.runErr <- m.Run(ctx, u.metrics)
	}()
	a.attached(&u.unit)
	return nil
}

func (a *Agent) stopPping(u *ppingUnit) {
	if u.stop != nil {
		u.stop()
		<-u.done
		u.stop = nil
	}
	a.metrics.removeGatherer(&u.unit)
	if u.m != nil {
		if err := u.m.Close(); err != nil {
			a.log.Warn("detach monitor", "unit", u.label(), "err", err)
		}
		u.m = nil
	}
	u.closeNetns()
}

// check detaches the units whose interface went away (or whose monitor stopped) and retries
// the units not attached.
func (a *Agent) check() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range sortedKeys(a.hedges) {
		u := a.hedges[k]
		if u.h != nil {
			if err := u.present(); err != nil {
				a.stopHedge(u)
				_ = a.fail(&u.unit, err)
			}
			continue
		}
		if err := a.startHedge(u); err == nil {
			a.log.Info("attached", "unit", u.label())
		}
	}
	for _, k := range sortedKeys(a.pings) {
		u := a.pings[k]
		if u.m != nil {
			err := u.present()
			if err == nil {
				select {
				case err = <-u.runErr:
					if err == nil {
						err = errors.New("monitor stopped")
					}
				default:
				}
			}
			if err != nil {
				a.stopPping(u)
				_ = a.fail(&u.unit, err)
			}
			continue
		}
		if err := a.startPping(u); err == nil {
			a.log.Info("attached", "unit", u.label())
		}
	}
}

// prune stops and forgets the units of m not in want.
func prune[U any](m map[string]U, want map[string]bool, stop func(U)) {
	for k, u := range m {
		if !want[k] {
			stop(u)
			delete(m, k)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// UnitStatus is one unit as /readyz and the metrics report it.
type UnitStatus struct {
	Kind      string    `json:"kind"`
	Interface string    `json:"interface"`
	Netns     string    `json:"netns"`
	Attached  bool      `json:"attached"`
	Error     string    `json:"error,omitempty"`
	Since     time.Time `json:"since"`
}

// publish snapshots the units for Units (a.mu held).
func (a *Agent) publish() {
	var out []UnitStatus
	add := func(u *unit) {
		st := UnitStatus{Kind: u.kind, Interface: u.iface, Netns: u.nsArg, Attached: u.err == nil && !u.since.IsZero(), Since: u.since}
		switch {
		case u.err != nil:
			st.Error = u.err.Error()
		case u.since.IsZero():
			st.Error = "not attached yet"
		}
		out = append(out, st)
	}
	for _, k := range sortedKeys(a.hedges) {
		add(&a.hedges[k].unit)
	}
	for _, k := range sortedKeys(a.pings) {
		add(&a.pings[k].unit)
	}
	a.statusMu.Lock()
	a.status = out
	a.statusMu.Unlock()
}

// Units reports every configured unit, hedgers first.
func (a *Agent) Units() []UnitStatus {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	return slices.Clone(a.status)
}

// Ready reports whether a config has been applied and every unit it declares is attached,
// and if not which are not.
func (a *Agent) Ready() (bool, []UnitStatus) {
	a.statusMu.Lock()
	applied := a.applied
	a.statusMu.Unlock()
	if !applied {
		return false, nil
	}
	var missing []UnitStatus
	for _, u := range a.Units() {
		if !u.Attached {
			missing = append(missing, u)
		}
	}
	return len(missing) == 0, missing
}

// Run retries and checks the units every Config.Retry until ctx ends (Apply first).
func (a *Agent) Run(ctx context.Context) {
	for {
		a.mu.Lock()
		retry := time.Duration(a.cfg.Retry)
		a.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		a.check()
	}
}

// Close detaches every unit.
func (a *Agent) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, u := range a.hedges {
		a.stopHedge(u)
		delete(a.hedges, k)
	}
	for k, u := range a.pings {
		a.stopPping(u)
		delete(a.pings, k)
	}
	a.publish()
}
