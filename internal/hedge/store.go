package hedge

import "fmt"

// The stored path (bpf/hedge/store.h, docs/hedging.md): a request whose UDP payload is at
// most a service's store limit is stored in the kernel and its hedge is built from the
// stored bytes at a pacer tick; a larger one is cloned into the delay line.
const (
	// DefaultStoreLimit is the store limit of a service that sets none (bytes of UDP payload).
	DefaultStoreLimit = 512
	// MaxStoreLimit is the largest payload a store cell holds (STORE_PAYLOAD_MAX).
	MaxStoreLimit = int(hedgeHedgeLimitsSTORE_PAYLOAD_MAX)
	// storeRing is the cells of each service's store ring (STORE_RING).
	storeRing = int(hedgeHedgeLimitsSTORE_RING)
)

// storeLimit returns the service's store limit (validated: the default filled in).
func (s *ServiceConfig) storeLimit() int {
	if s.StoreLimit == nil {
		return DefaultStoreLimit
	}
	return *s.StoreLimit
}

func (s *ServiceConfig) validateStore(where string) error {
	if s.StoreLimit == nil {
		v := DefaultStoreLimit
		s.StoreLimit = &v
	}
	if n := *s.StoreLimit; n < 0 || n > MaxStoreLimit {
		return fmt.Errorf("%s: store_limit %d out of range: use 0..%d bytes of UDP payload (0: clone every request, no stored path)",
			where, n, MaxStoreLimit)
	}
	return nil
}
