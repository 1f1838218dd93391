package hedge

import "github.com/kedge-dev/kedge/internal/hist"

// The contract's sizes and sentinels (enum hedge_limits in bpf/include/hedge.h), as bpf2go
// generates them; short names for this package.
const (
	svcMax      = int(hedgeHedgeLimitsSVC_MAX)
	replicaMax  = int(hedgeHedgeLimitsREPLICA_MAX)
	replicaNone = uint8(hedgeHedgeLimitsREPLICA_NONE)
	histBuckets = int(hedgeHedgeLimitsHIST_BUCKETS)
	histSlots   = int(hedgeHedgeLimitsHIST_SLOTS)
	budgetSlots = int(hedgeHedgeLimitsBUDGET_SLOTS)
)

// histLayout is the latency and precision histograms' layout (bpf/include/hist.h's
// arguments in bpf/hedge/timer.h), in microseconds.
var histLayout = hist.Layout{
	SubBits:  uint(hedgeHedgeLimitsHIST_SUB_BITS),
	MinShift: uint(hedgeHedgeLimitsHIST_MIN_SHIFT),
	Buckets:  histBuckets,
}
