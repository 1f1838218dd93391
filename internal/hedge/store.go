package hedge

import (
	"fmt"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/vishvananda/netns"
)

// The stored path (bpf/hedge/store.h, docs/hedging.md): a request whose UDP payload is at
// most a service's store limit is stored in the kernel and its hedge is built from the
// stored bytes at a pacer tick; a larger one is cloned into the delay line.
const (
	// DefaultStoreLimit is the store limit of a service that sets none where the interface's
	// MTU is unknown (a hedger loaded without Start: the fixtures). Start gives such a
	// service the largest UDP payload the interface's MTU allows, at most MaxStoreLimit
	// (resolveStoreLimits): then nothing needs the clone path and the pacer carries nothing.
	DefaultStoreLimit = 512
	// MaxStoreLimit is the largest payload a store cell holds (STORE_PAYLOAD_MAX).
	MaxStoreLimit = int(hedgeHedgeLimitsSTORE_PAYLOAD_MAX)
	// storeRing is the cells of each service's store ring (STORE_RING).
	storeRing = int(hedgeHedgeLimitsSTORE_RING)
)

// storeLimit returns the service's store limit (DefaultStoreLimit when unset and not
// resolved by Start).
func (s *ServiceConfig) storeLimit() int {
	if s.StoreLimit == nil {
		return DefaultStoreLimit
	}
	return *s.StoreLimit
}

func (s *ServiceConfig) validateStore(where string) error {
	if s.StoreLimit == nil {
		return nil // Start derives it from the interface's MTU
	}
	if n := *s.StoreLimit; n < 0 || n > MaxStoreLimit {
		return fmt.Errorf("%s: store_limit %d out of range: use 0..%d bytes of UDP payload (0: clone every request, no stored path)",
			where, n, MaxStoreLimit)
	}
	return nil
}

// UDP and IP header bytes: the largest UDP payload an unfragmented datagram carries is the
// MTU minus these.
const udp4Overhead, udp6Overhead = 20 + 8, 40 + 8

// resolveStoreLimits gives every service without a store limit the largest UDP payload an
// unfragmented datagram on the interface (index ifx in ns) carries, at most MaxStoreLimit,
// and says whether every service's limit now covers it. Then no request needs the clone
// path (fragments are passed unhedged anyway) and the pacer runs without carry: on the
// conveyor no filler frames circulate at all. A request the store still cannot take (ring
// full, IPv4 options, a UDP GSO super-packet) is then not hedged. A limit set below the
// MTU's payload keeps the clone path for larger requests and for a full ring.
func resolveStoreLimits(cfg *Config, ns netns.NsHandle, ifx int) (covers bool, err error) {
	h, err := bpfx.NetlinkHandle(ns)
	if err != nil {
		return false, err
	}
	defer h.Close()
	l, err := h.LinkByIndex(ifx)
	if err != nil {
		return false, fmt.Errorf("read the MTU of %s: %w", cfg.Interface, err)
	}
	mtu := l.Attrs().MTU
	covers = true
	for i := range cfg.Services {
		s := &cfg.Services[i]
		largest := mtu - udp6Overhead
		if s.addr.Addr().Is4() {
			largest = mtu - udp4Overhead
		}
		if s.StoreLimit == nil {
			v := max(min(largest, MaxStoreLimit), 0)
			s.StoreLimit = &v
		}
		if s.storeLimit() < largest {
			covers = false
		}
	}
	return covers, nil
}

// storeLimits lists the services' store limits for the start log (one per service).
func storeLimits(cfg *Config) []int {
	out := make([]int, len(cfg.Services))
	for i := range cfg.Services {
		out[i] = cfg.Services[i].storeLimit()
	}
	return out
}
