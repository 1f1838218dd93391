// Package pping is the control plane of kedge's passive RTT monitor (kedge pping): it
// loads bpf/pping, attaches it to an interface (TC ingress and egress) in a network
// namespace, reads RTT and flow events from the ring buffer, runs garbage collection
// in user space, collects the double-buffered per-subnet histograms, and formats
// all of it as ePPing does (standard, json, jsonl, ppviz). docs/pping.md describes the
// data flow.
package pping

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// Service is a UDP service measured through its request id (bpf/include/reqid.h): a
// datagram to Port is a request, one from Port a response, and both carry an id of Len
// bytes at Offset from the start of the UDP payload.
type Service struct {
	Port         uint16
	Offset       uint16
	Len          uint8
	LittleEndian bool
}

// ParseService parses PORT:OFFSET:LEN[:le|be] (kedge hedge's request-id description).
func ParseService(s string) (Service, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 3 || len(parts) > 4 {
		return Service{}, fmt.Errorf("parse service %q: want PORT:OFFSET:LEN[:le|be]", s)
	}
	var nums [3]uint64
	for i, limit := range []int{16, 16, 8} {
		v, err := strconv.ParseUint(parts[i], 10, limit)
		if err != nil {
			return Service{}, fmt.Errorf("parse service %q: %w", s, err)
		}
		nums[i] = v
	}
	svc := Service{Port: uint16(nums[0]), Offset: uint16(nums[1]), Len: uint8(nums[2])}
	if len(parts) == 4 {
		switch parts[3] {
		case "le":
			svc.LittleEndian = true
		case "be":
		default:
			return Service{}, fmt.Errorf("parse service %q: byte order must be le or be", s)
		}
	}
	return svc, svc.validate()
}

func (s Service) validate() error {
	if s.Port == 0 {
		return fmt.Errorf("service port must not be 0")
	}
	if s.Len < 1 || s.Len > 8 {
		return fmt.Errorf("service %d: request id length must be 1..8 bytes, not %d", s.Port, s.Len)
	}
	return nil
}

// IngressHook is where the ingress program runs.
type IngressHook int

const (
	// IngressTC is a TC program (TCX or clsact, as egress).
	IngressTC IngressHook = iota
	// IngressXDP is an XDP program (native, falling back to generic): it sees a frame before
	// the stack builds an skb, so its timestamps are earlier and its cost lower.
	IngressXDP
)

// IngressHooks lists the names ParseIngressHook accepts.
var IngressHooks = []string{"tc", "xdp"}

func (h IngressHook) String() string {
	if h >= 0 && int(h) < len(IngressHooks) {
		return IngressHooks[h]
	}
	return fmt.Sprintf("IngressHook(%d)", int(h))
}

// ParseIngressHook parses "tc" or "xdp".
func ParseIngressHook(s string) (IngressHook, error) {
	if i := slices.Index(IngressHooks, s); i >= 0 {
		return IngressHook(i), nil
	}
	return 0, fmt.Errorf("unknown ingress hook %q (want tc or xdp)", s)
}

// Config is what the monitor measures and how. DefaultConfig gives ePPing's defaults.
type Config struct {
	// IngressHook selects the ingress program: TC (default) or XDP. Egress is always TC.
	IngressHook IngressHook
	// XDPMode is how the XDP ingress program attaches: native falling back to generic
	// (XDPAuto, the default), or only one of them (ePPing's -x).
	XDPMode bpfx.XDPMode

	// Identifiers to track. UDP services are tracked when Services is not empty, QUIC's
	// spin bit on QUICPorts when QUIC is set.
	TCP, ICMP, DNS bool
	Services       []Service
	QUIC           bool
	QUICPorts      []uint16

	// KernelRTT reports the RTTs the kernel's TCP stack measures for the sockets of the
	// monitored interface's namespace (source "kernel"), through a sock_ops program on
	// Cgroup: the cgroup2 directory whose processes' sockets are seen ("": the cgroup2
	// hierarchy's root, every process of the host). See docs/pping.md.
	KernelRTT bool
	Cgroup    string

	// Sampling: at most one stored identifier per flow direction every RateLimit, or, when
	// RTTRate > 0, every RTTRate x the flow's RTT (min RTT, or smoothed with UseSRTT).
	RateLimit time.Duration
	RTTRate   float64
	UseSRTT   bool

	IncludeLocal bool // also measure flows towards this host seen at ingress (-l)
	IncludeSYN   bool // start flows at the SYN (-s); default: at the first data packet
	// HostACKs makes the pure ACKs this host's sockets send requests too, so an endpoint
	// receiving data (a download) measures its flows' RTTs; ePPing never times pure ACKs.
	HostACKs bool

	// Aggregation (-a): per-subnet histograms reported every Aggregate instead of
	// per-sample events. Prefix lengths: IPv4 0..32, IPv6 0..64.
	Aggregate   time.Duration
	AggPrefixV4 int
	AggPrefixV6 int
	AggByDst    bool // key subnets by the reply's destination instead of its source
	// AggTimeout drops a subnet from the cumulative Prometheus series after this long
	// without traffic (ePPing's --aggregate-timeout); 0 keeps every subnet.
	AggTimeout time.Duration

	// Garbage collection.
	CleanupInterval  time.Duration // how often the GC iterators run; 0 disables them
	TSMinLifetime    time.Duration // an unmatched identifier lives clamp(8 srtt, min, max)
	TSMaxLifetime    time.Duration
	FlowLifetime     time.Duration // idle TCP direction
	DgramLifetime    time.Duration // idle ICMP/DNS/UDP direction
	UnopenedLifetime time.Duration // direction never answered

	MaxFlows   int  // flow table size (pkt_ts holds twice as many identifiers); 0: default
	MaxSubnets int  // subnets per aggregation buffer and family; 0: default
	Debug      bool // bpf_printk traces (read them from /sys/kernel/tracing/trace_pipe)

	// noFastPath sends every packet through the general parser (tests: the fast path must
	// give the same results).
	noFastPath bool
}

// DefaultConfig returns ePPing's defaults - TCP, ICMP and DNS, 100 ms rate limit, local
// flows and SYNs excluded, per-sample events, cleanup every second - and, beyond ePPing,
// QUIC's spin bit on UDP port 443 and pure ACKs of this host's own sockets timed
// (HostACKs). The kernel RTT source is off here: it attaches to a cgroup, which a caller
// chooses (kedge pping and the agent switch it on, on the cgroup2 root by default).
func DefaultConfig() Config {
	return Config{
		TCP: true, ICMP: true, DNS: true, QUIC: true,
		QUICPorts:        []uint16{DefaultQUICPort},
		HostACKs:         true,
		RateLimit:        100 * time.Millisecond,
		AggPrefixV4:      24,
		AggTimeout:       30 * time.Second,
		AggPrefixV6:      48,
		CleanupInterval:  time.Second,
		TSMinLifetime:    time.Second,
		TSMaxLifetime:    10 * time.Second,
		FlowLifetime:     300 * time.Second,
		DgramLifetime:    30 * time.Second,
		UnopenedLifetime: 30 * time.Second,
	}
}

// DefaultQUICPort is the UDP port QUIC traffic is recognised on unless configured.
const DefaultQUICPort = 443

// MaxQUICPorts is PP_MAX_QUIC_PORTS in bpf/include/pping.h.
const MaxQUICPorts = int(ppingPpConstsPP_MAX_QUIC_PORTS)

// DefaultMaxFlows is PP_MAX_FLOWS in bpf/include/pping.h.
const DefaultMaxFlows = int(ppingPpConstsPP_MAX_FLOWS)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.IngressHook != IngressTC && c.IngressHook != IngressXDP {
		errs = append(errs, fmt.Errorf("ingress hook %v: want tc or xdp", c.IngressHook))
	}
	if !c.TCP && !c.ICMP && !c.DNS && len(c.Services) == 0 && !c.QUIC && !c.KernelRTT {
		errs = append(errs, errors.New("nothing to track: enable TCP, ICMP, DNS, QUIC, the kernel's RTTs or a UDP service"))
	}
	if c.QUIC && (len(c.QUICPorts) == 0 || len(c.QUICPorts) > MaxQUICPorts) {
		errs = append(errs, fmt.Errorf("QUIC needs 1 to %d ports, not %d", MaxQUICPorts, len(c.QUICPorts)))
	}
	quicSeen := map[uint16]bool{}
	for _, p := range c.QUICPorts {
		if p == 0 {
			errs = append(errs, errors.New("QUIC port 0: use a port from 1 to 65535"))
		}
		if quicSeen[p] {
			errs = append(errs, fmt.Errorf("QUIC port %d given twice", p))
		}
		quicSeen[p] = true
	}
	if c.RateLimit < 0 || c.RateLimit > 7*24*time.Hour {
		errs = append(errs, fmt.Errorf("rate limit %v out of range [0, 7 days]", c.RateLimit))
	}
	if c.RTTRate < 0 || c.RTTRate > 10000 || math.IsNaN(c.RTTRate) {
		errs = append(errs, fmt.Errorf("rtt rate %v out of range [0, 10000]", c.RTTRate))
	}
	if c.Aggregate < 0 {
		errs = append(errs, fmt.Errorf("aggregation interval %v is negative", c.Aggregate))
	}
	if c.AggTimeout < 0 {
		errs = append(errs, fmt.Errorf("aggregation timeout %v is negative", c.AggTimeout))
	}
	if c.XDPMode != bpfx.XDPAuto && c.IngressHook != IngressXDP {
		errs = append(errs, errors.New("an XDP mode applies only to the XDP ingress hook (--ingress-hook xdp)"))
	}
	if c.AggPrefixV4 < 0 || c.AggPrefixV4 > 32 {
		errs = append(errs, fmt.Errorf("IPv4 aggregation prefix /%d out of range [0, 32]", c.AggPrefixV4))
	}
	if c.AggPrefixV6 < 0 || c.AggPrefixV6 > 64 {
		errs = append(errs, fmt.Errorf("IPv6 aggregation prefix /%d out of range [0, 64] (keys hold the first 64 bits)", c.AggPrefixV6))
	}
	if c.CleanupInterval < 0 {
		errs = append(errs, fmt.Errorf("cleanup interval %v is negative", c.CleanupInterval))
	}
	if c.TSMinLifetime > c.TSMaxLifetime {
		errs = append(errs, fmt.Errorf("timestamp lifetime min %v above max %v", c.TSMinLifetime, c.TSMaxLifetime))
	}
	if c.MaxFlows < 0 || c.MaxFlows > 1<<24 {
		errs = append(errs, fmt.Errorf("max flows %d out of range [1, %d]", c.MaxFlows, 1<<24))
	}
	if c.MaxSubnets < 0 || c.MaxSubnets > 1<<20 {
		errs = append(errs, fmt.Errorf("max subnets %d out of range [1, %d]", c.MaxSubnets, 1<<20))
	}
	if len(c.Services) > maxServices {
		errs = append(errs, fmt.Errorf("%d UDP services, at most %d", len(c.Services), maxServices))
	}
	seen := map[uint16]bool{}
	for _, s := range c.Services {
		if err := s.validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[s.Port] {
			errs = append(errs, fmt.Errorf("UDP service port %d given twice", s.Port))
		}
		if c.QUIC && quicSeen[s.Port] {
			errs = append(errs, fmt.Errorf("UDP port %d is both a service and a QUIC port", s.Port))
		}
		seen[s.Port] = true
	}
	return errors.Join(errs...)
}

// maxServices is PP_MAX_SERVICES in bpf/include/pping.h.
const maxServices = int(ppingPpConstsPP_MAX_SERVICES)

const fixpointShift = int(ppingPpConstsPP_FIXPOINT_SHIFT)

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// bpfConfig converts c to the kernel's struct pp_config; tick is the kernel's jiffy (0:
// unknown, the programs then read the ns clock for every rate-limit test).
func (c Config) bpfConfig(tick time.Duration) ppingPpConfig {
	v4mask := uint32(0)
	if c.AggPrefixV4 > 0 {
		v4mask = ^uint32(0) << (32 - c.AggPrefixV4)
	}
	v6mask := uint64(0)
	if c.AggPrefixV6 > 0 {
		v6mask = ^uint64(0) << (64 - c.AggPrefixV6)
	}
	var quic [MaxQUICPorts]uint16
	if c.QUIC {
		for i, p := range c.QUICPorts {
			quic[i] = bpfx.Htons(p)
		}
	}
	return ppingPpConfig{
		JiffyNs:            uint64(tick),
		QuicPorts:          quic,
		TrackQuic:          b2u(c.QUIC),
		TrackKernel:        b2u(c.KernelRTT),
		NoFastPath:         b2u(c.noFastPath),
		RateLimitNs:        uint64(c.RateLimit),
		RttRate:            uint64(c.RTTRate * (1 << fixpointShift)),
		TsMinLifetimeNs:    uint64(c.TSMinLifetime),
		TsMaxLifetimeNs:    uint64(c.TSMaxLifetime),
		FlowLifetimeNs:     uint64(c.FlowLifetime),
		DgramLifetimeNs:    uint64(c.DgramLifetime),
		UnopenedLifetimeNs: uint64(c.UnopenedLifetime),
		// The kernel ANDs masks with addresses as they sit in memory (network order) and
		// reads them as little-endian words (bpfel), so byte-swap the host-order masks.
		V4PrefixMask: bits.ReverseBytes32(v4mask),
		V6PrefixMask: bits.ReverseBytes64(v6mask),
		TrackTcp:     b2u(c.TCP),
		TrackIcmp:    b2u(c.ICMP),
		TrackDns:     b2u(c.DNS),
		TrackUdp:     b2u(len(c.Services) > 0),
		Localfilt:    b2u(!c.IncludeLocal),
		SkipSyn:      b2u(!c.IncludeSYN),
		UseSrtt:      b2u(c.UseSRTT),
		PushEvents:   b2u(c.Aggregate == 0),
		Aggregate:    b2u(c.Aggregate > 0),
		AggByDst:     b2u(c.AggByDst),
		Debug:        b2u(c.Debug),
		HostAcks:     b2u(c.HostACKs),
	}
}
