package pacer

import (
	"encoding/binary"
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
	// Tick is struct pacer_tick, a tick frame's payload.
	Tick = pacerPacerTick
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

// Tick frames' fixed parts (bpf/pacer/frame.h): an Ethernet header, an IPv4 header without
// options, then struct pacer_tick.
const (
	ethHeaderLen  = 14
	ipv4HeaderLen = 20
	ethPIPv4      = 0x0800
)

// tickMAC is both addresses of a tick frame (pacer_write_tick): locally administered,
// "kpace".
var tickMAC = [6]byte{0x02, 'k', 'p', 'a', 'c', 'e'}

// TickFrame returns the frame pacer_enter makes of a tick request for t (bpf/pacer/frame.h,
// pacer_write_tick), n bytes long (at least the headers and t; the rest zero): Ethernet,
// IPv4 with protocol PACER_IPPROTO, no addresses and its header checksum, then t. It is
// what a consumer's tick program receives, for the consumer's BPF_PROG_TEST_RUN fixtures;
// TestTickFrameMatchesEnter pins it to pacer_enter's output.
func TickFrame(t Tick, n int) []byte {
	payload, err := binary.Append(nil, binary.NativeEndian, t)
	if err != nil {
		panic(fmt.Sprintf("encode struct pacer_tick: %v", err)) // a fixed-size struct of integers
	}
	n = max(n, ethHeaderLen+ipv4HeaderLen+len(payload))
	b := make([]byte, n)
	copy(b[0:6], tickMAC[:])
	copy(b[6:12], tickMAC[:])
	binary.BigEndian.PutUint16(b[12:], ethPIPv4)
	ip := b[ethHeaderLen : ethHeaderLen+ipv4HeaderLen]
	ip[0] = 0x45 // version 4, 5 words
	binary.BigEndian.PutUint16(ip[2:], uint16(n-ethHeaderLen))
	ip[9] = byte(pacerPacerConstsPACER_IPPROTO)
	binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip))
	copy(b[ethHeaderLen+ipv4HeaderLen:], payload)
	return b
}

// ipv4Checksum is the header checksum of an IPv4 header whose check field is zero.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
