package pacer

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The contract's types (bpf/include/pacer.h), generated once here by bpf2go. Consumers'
// BPF_PROG_TEST_RUN fixtures use them to set a pacer_cfg and read the shared maps of a
// collection loaded without a running pacer.
type (
	// Config is struct pacer_config: pacer_cfg, in the pacer's object and every consumer's.
	Config = pacerPacerConfig
	// State is struct pacer_state, the value of pacer_arming.
	State = pacerPacerState
	// RawStats is struct pacer_stats, one CPU's counters in pacer_counters.
	RawStats = pacerPacerStats
	// Ctl is struct pacer_ctl (conveyor filler control, the pacer's own).
	Ctl = pacerPacerCtl
)

// TickMagic is PACER_TICK_MAGIC, the first word of a tick frame's payload.
const TickMagic = uint64(pacerPacerMagicPACER_TICK_MAGIC)

// The maps a consumer's collection shares with the pacer (bpf/include/pacer_client.h).
const (
	MapState    = "pacer_arming"
	MapCounters = "pacer_counters"
	varConfig   = "pacer_cfg"
)

// Client is what a consumer's collection (one that includes bpf/include/pacer_client.h)
// shares with a pacer: the values of pacer_cfg, and the pacer's maps that replace the
// collection's own pacer_arming and pacer_counters. A running pacer hands it out
// (Pacer.Client); a fixture without one makes it from a Config alone (no Maps: the
// collection keeps its own copies).
type Client struct {
	Config Config
	Maps   map[string]*ebpf.Map
}

// Client returns what a consumer binds its collection to (Client.Bind) before loading it.
func (p *Pacer) Client() Client {
	return Client{Config: p.config(), Maps: map[string]*ebpf.Map{
		MapState: p.objs.PacerArming, MapCounters: p.objs.PacerCounters,
	}}
}

// Config returns the pacer_cfg the pacer runs with (and binds consumers to).
func (p *Pacer) Config() Config { return p.config() }

// Bind writes c.Config as pacer_cfg into spec and adds c.Maps to opts' map replacements
// (opts may be nil when c has no maps). Call it before loading the collection.
func (c Client) Bind(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) error {
	v, ok := spec.Variables[varConfig]
	if !ok {
		return errors.New("bind to the pacer: the collection has no pacer_cfg (does it include pacer_client.h?)")
	}
	if err := v.Set(c.Config); err != nil {
		return fmt.Errorf("bind to the pacer: set pacer_cfg: %w", err)
	}
	if len(c.Maps) == 0 {
		return nil
	}
	if opts == nil {
		return errors.New("bind to the pacer: no collection options to add the pacer's maps to")
	}
	if opts.MapReplacements == nil {
		opts.MapReplacements = map[string]*ebpf.Map{}
	}
	for name, m := range c.Maps {
		if _, ok := spec.Maps[name]; !ok {
			return fmt.Errorf("bind to the pacer: the collection has no map %s (does it include pacer_client.h?)", name)
		}
		opts.MapReplacements[name] = m
	}
	return nil
}
