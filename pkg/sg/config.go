package sg

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

// Validate checks c and fills its defaults (Open calls it).
func (c *Config) Validate() error {
	if c.PollSpin == 0 {
		c.PollSpin = DefaultPollSpin
	}
	switch {
	case c.Interface == "":
		return errors.New("sg config: no interface (set Config.Interface)")
	case len(c.Workers) == 0 || len(c.Workers) > MaxWorkers:
		return fmt.Errorf("sg config: %d workers, want 1..%d", len(c.Workers), MaxWorkers)
	case c.Reduction < Sum || c.Reduction > User:
		return fmt.Errorf("sg config: unknown reduction %d", c.Reduction)
	case c.Type < Int32 || c.Type > Float64:
		return fmt.Errorf("sg config: unknown element type %d", c.Type)
	case c.Need < 0 || c.Need > len(c.Workers):
		return fmt.Errorf("sg config: need %d of %d workers", c.Need, len(c.Workers))
	case c.InFlight < 0 || c.InFlight > MaxInFlight:
		return fmt.Errorf("sg config: in-flight limit %d, want 1..%d", c.InFlight, MaxInFlight)
	case c.PollSpin > MaxPollSpin:
		return fmt.Errorf("sg config: poll spin %v, want at most %v (negative: off; longer: BusyPoll)", c.PollSpin, MaxPollSpin)
	case c.ScatterBatch < 0 || c.ScatterBatch > MaxScatterBatch:
		return fmt.Errorf("sg config: scatter batch %d, want 1..%d", c.ScatterBatch, MaxScatterBatch)
	case c.ScatterFirstBatch < 0 || c.ScatterFirstBatch > cmp.Or(c.ScatterBatch, isg.DefaultBatch):
		return fmt.Errorf("sg config: first scatter batch %d, want 1..%d (the scatter batch)", c.ScatterFirstBatch, cmp.Or(c.ScatterBatch, isg.DefaultBatch))
	}
	if c.Reduction != Count && (c.Elems < 1 || c.Elems > MaxElems) {
		return fmt.Errorf("sg config: %d elements, want 1..%d", c.Elems, MaxElems)
	}
	if c.MultiPacket && c.Reduction == Gather {
		return errors.New("sg config: gather takes single-packet replies only (unset MultiPacket)")
	}
	if c.MultiPacket && c.Reduction == Mean {
		return errors.New("sg config: mean takes single-packet replies only: a partial reply's parts would be summed but not counted (unset MultiPacket, or use Sum)")
	}
	if err := c.validateFloat(); err != nil {
		return err
	}
	if err := c.validateUser(); err != nil {
		return err
	}
	v4 := c.Workers[0].Addr().Unmap().Is4()
	for i, w := range c.Workers {
		if !w.IsValid() || w.Port() == 0 {
			return fmt.Errorf("sg config: worker %d (%v) has no address or port", i, w)
		}
		if w.Addr().Unmap().Is4() != v4 {
			return fmt.Errorf("sg config: worker %d (%v) is not of worker 0's family: a group is all IPv4 or all IPv6", i, w)
		}
	}
	if err := c.validateReplicas(v4); err != nil {
		return err
	}
	if c.Reduction == Gather {
		per := c.Elems * c.Type.Size()
		fit := min(AggBytes/per, MaxGatherK)
		if c.GatherK == 0 {
			c.GatherK = fit
		}
		if c.GatherK < 1 || c.GatherK > fit {
			return fmt.Errorf("sg config: gather %d payloads of %d bytes; at most %d fit", c.GatherK, per, fit)
		}
	}
	if c.Timeout == 0 {
		c.Timeout = 100 * time.Millisecond
	}
	if c.InFlight == 0 {
		c.InFlight = 256
	}
	return c.validateResend()
}

// validateFloat checks FracBits and fills its default.
func (c *Config) validateFloat() error {
	sums := c.Type.IsFloat() && (c.Reduction == Sum || c.Reduction == Mean)
	switch {
	case !sums && c.FracBits != 0:
		return fmt.Errorf("sg config: FracBits %d for a %v %v group: fraction bits are for float32/float64 sum and mean only", c.FracBits, c.Type, c.Reduction)
	case !sums:
		return nil
	case c.FracBits == 0:
		c.FracBits = DefaultFracBits
	case c.FracBits < MinFracBits || c.FracBits > MaxFracBits:
		return fmt.Errorf("sg config: FracBits %d, want %d..%d (fraction bits of the fixed-point sum; docs/sg.md, \"Float reductions\")", c.FracBits, MinFracBits, MaxFracBits)
	}
	return nil
}

// validateUser checks a user reduction's settings.
func (c *Config) validateUser() error {
	u := c.UserReduction
	switch {
	case c.Reduction != User && u != (UserReduction{}):
		return fmt.Errorf("sg config: a user reduction object (%s) for a %v group: set Reduction: User (--reduction user)", u.Object, c.Reduction)
	case c.Reduction != User:
		return nil
	case u.Object == "":
		return errors.New("sg config: reduction user needs its object (Config.UserReduction.Object, --user-object); " + isg.UserBuildHint)
	case c.Type.IsFloat():
		return fmt.Errorf("sg config: a user reduction takes int32 or int64 vectors, not %v", c.Type)
	case c.MultiPacket:
		return errors.New("sg config: a user reduction takes single-packet replies only (unset MultiPacket)")
	case c.Resend != 0:
		return errors.New("sg config: a user reduction does not take re-sends (unset Resend)")
	}
	return nil
}

// validateResend checks the re-send settings and fills their defaults.
func (c *Config) validateResend() error {
	switch {
	case c.Resend < 0:
		return fmt.Errorf("sg config: re-send delay %v is negative (0: no re-sends)", c.Resend)
	case c.Resend == 0:
		return nil
	case c.Resend >= c.Timeout:
		return fmt.Errorf("sg config: re-send delay %v not below the timeout %v: the round would come after the request expired", c.Resend, c.Timeout)
	case c.MultiPacket:
		return errors.New("sg config: re-sends take single-packet replies only (unset MultiPacket or Resend)")
	case c.MaxResends < 0 || c.MaxResends > MaxResendRounds:
		return fmt.Errorf("sg config: %d rounds of re-sends, want 1..%d", c.MaxResends, MaxResendRounds)
	case c.ResendBudget.Ratio < 0 || c.ResendBudget.Ratio > 100 || math.IsNaN(c.ResendBudget.Ratio):
		return fmt.Errorf("sg config: re-send budget ratio %v, want 0..100 (copies re-sent per copy scattered)", c.ResendBudget.Ratio)
	case c.ResendBudget.Burst < 0 || c.ResendBudget.Burst > 1<<30:
		return fmt.Errorf("sg config: re-send budget burst %d, want 0..%d", c.ResendBudget.Burst, 1<<30)
	case c.ResendQuantile < 0 || c.ResendQuantile >= 1 || math.IsNaN(c.ResendQuantile):
		return fmt.Errorf("sg config: re-send quantile %v, want 0 (a fixed delay) or between 0 and 1, e.g. 0.95", c.ResendQuantile)
	case c.ResendMin < 0 || c.ResendMin > c.Resend:
		return fmt.Errorf("sg config: re-send floor %v, want 0..%v (the re-send delay, the adaptive delay's ceiling)", c.ResendMin, c.Resend)
	}
	if c.ResendQuantile > 0 && c.ResendMin == 0 {
		c.ResendMin = c.Resend / 10
	}
	switch c.PacerBackend {
	case "", "auto", "edt", "netem", "conveyor":
	default:
		return fmt.Errorf("sg config: pacer backend %q, want auto, edt, netem or conveyor", c.PacerBackend)
	}
	if c.MaxResends == 0 {
		c.MaxResends = 1
	}
	if c.ResendBudget == (ResendBudget{}) {
		c.ResendBudget = ResendBudget{Ratio: 0.1, Burst: DefaultResendBurst(len(c.Workers))}
	}
	return nil
}

// validateReplicas checks Replicas and fills the back-off defaults.
func (c *Config) validateReplicas(v4 bool) error {
	if len(c.Replicas) > len(c.Workers) {
		return fmt.Errorf("sg config: replicas for %d shards, but %d workers (Replicas[i] are further replicas of Workers[i])", len(c.Replicas), len(c.Workers))
	}
	for i, reps := range c.Replicas {
		if len(reps)+1 > MaxReplicas {
			return fmt.Errorf("sg config: shard %d has %d replicas, at most %d", i, len(reps)+1, MaxReplicas)
		}
		seen := map[netip.AddrPort]bool{c.Workers[i]: true}
		for _, r := range reps {
			switch {
			case !r.IsValid() || r.Port() == 0:
				return fmt.Errorf("sg config: replica %v of shard %d has no address or port", r, i)
			case r.Addr().Unmap().Is4() != v4:
				return fmt.Errorf("sg config: replica %v of shard %d is not of worker 0's family: a group is all IPv4 or all IPv6", r, i)
			case seen[r]:
				return fmt.Errorf("sg config: shard %d names %v twice", i, r)
			}
			seen[r] = true
		}
	}
	if c.ReplicaChoice < RoundRobin || c.ReplicaChoice > LowestLatency {
		return fmt.Errorf("sg config: unknown replica choice %d", c.ReplicaChoice)
	}
	if c.EjectBackoff == 0 {
		c.EjectBackoff = time.Second
	}
	if c.EjectMaxBackoff == 0 {
		c.EjectMaxBackoff = max(30*time.Second, c.EjectBackoff)
	}
	if c.EjectBackoff > 0 && c.EjectMaxBackoff < c.EjectBackoff {
		return fmt.Errorf("sg config: eject max back-off %v below the back-off %v", c.EjectMaxBackoff, c.EjectBackoff)
	}
	return nil
}

// hasReplicas: some shard has more than one replica.
func (c *Config) hasReplicas() bool {
	for _, r := range c.Replicas {
		if len(r) > 0 {
			return true
		}
	}
	return false
}
