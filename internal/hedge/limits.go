package hedge

// The contract's sizes and sentinels (enum hedge_limits in bpf/include/hedge.h), as bpf2go
// generates them; short names for this package.
const (
	svcMax      = int(hedgeHedgeLimitsSVC_MAX)
	replicaMax  = int(hedgeHedgeLimitsREPLICA_MAX)
	replicaNone = uint8(hedgeHedgeLimitsREPLICA_NONE)
	histSubBits = int(hedgeHedgeLimitsHIST_SUB_BITS)
	histSub     = int(hedgeHedgeLimitsHIST_SUB)
	histBuckets = int(hedgeHedgeLimitsHIST_BUCKETS)
	histSlots   = int(hedgeHedgeLimitsHIST_SLOTS)
)
