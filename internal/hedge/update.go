package hedge

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

// ErrRestart is returned (wrapped, with what changed) by Update for a config it cannot apply
// to a running hedger: the caller closes the hedger and starts a new one.
var ErrRestart = errors.New("the change needs a restart of the hedger")

// Update applies cfg to the running hedger without detaching it: services added, removed
// or changed (matched by name) are written into the maps; services whose config did not
// change are not touched, and every service that stays keeps its slot and so its counters.
// A new service takes a free slot (Options.ServiceSlots sizes them); a slot freed by a
// removed service is reused only after the scoreboard TTL, so no entry of the old service
// can match the new one. A changed interface, delay line, scoreboard, ttl, tick or mark, a
// change that turns the clone path on or off, or a service with a delay shorter than the
// running delay line's period (when the config leaves the period to its default) returns
// ErrRestart and changes nothing. cfg is validated; on success it becomes h.Config.
func (h *Hedger) Update(cfg *Config) error {
	derivedPeriod := cfg.DelayLine.Period == 0
	if err := cfg.Validate(); err != nil {
		return err
	}
	noCarry, err := resolveStoreLimits(cfg, h.netns, h.IfIndex)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.Config
	// A derived period (the shortest delay) may stay as it runs while every delay is at
	// least that long: carried clones then recirculate a little more, none leaves late.
	if derivedPeriod && cfg.DelayLine.Period >= old.DelayLine.Period {
		cfg.DelayLine.Period = old.DelayLine.Period
	}
	if what := restartNeeded(old, cfg); what != "" {
		return fmt.Errorf("%w: %s changed", ErrRestart, what)
	}
	if noCarry != h.noCarry {
		return fmt.Errorf("%w: the clone path is needed now or no more (store_limit against the interface's MTU)", ErrRestart)
	}

	// Plan: which old service each new one is (by name) and the slot it gets.
	oldIdx := map[string]int{}
	for i, s := range old.Services {
		oldIdx[s.Name] = i
	}
	slots := make([]uint32, len(cfg.Services))
	used := map[uint32]bool{}
	kept := map[string]bool{}
	for i, s := range cfg.Services {
		if j, ok := oldIdx[s.Name]; ok {
			slots[i] = h.slot(j)
			used[slots[i]] = true
			kept[s.Name] = true
		}
	}
	now := time.Now()
	ttl := time.Duration(old.TTL)
	fresh := map[uint32]bool{}
	for i, s := range cfg.Services {
		if kept[s.Name] {
			continue
		}
		slot, ok := h.freeSlot(used, now, ttl)
		if !ok {
			return fmt.Errorf("%w: no free service slot for %q (%d slots, those of removed services are free again %v after removal)",
				ErrRestart, s.Name, h.capacity, ttl)
		}
		slots[i], used[slot], fresh[slot] = slot, true, true
	}

	// Apply: first take the removed and changed services' addresses out of the maps (so an
	// address that moves between services is never claimed twice), then write the new and
	// changed ones; unchanged services are not touched.
	changed := func(i int) bool {
		j, ok := oldIdx[cfg.Services[i].Name]
		return !ok || !reflect.DeepEqual(old.Services[j], cfg.Services[i])
	}
	for j := range old.Services {
		s := &old.Services[j]
		i := slices.IndexFunc(cfg.Services, func(n ServiceConfig) bool { return n.Name == s.Name })
		if i >= 0 && !changed(i) {
			continue
		}
		if err := h.unmapService(s); err != nil {
			return err
		}
		if i < 0 {
			if err := h.disableSlot(h.slot(j)); err != nil {
				return err
			}
			h.freed[h.slot(j)] = now
		}
	}
	for i := range cfg.Services {
		if !changed(i) {
			continue
		}
		s := &cfg.Services[i]
		newState := fresh[slots[i]]
		if !newState {
			o := old.Services[oldIdx[s.Name]]
			newState = o.Budget != s.Budget || !slices.Equal(o.replicas, s.replicas)
		}
		if _, reused := h.freed[slots[i]]; reused && fresh[slots[i]] {
			if err := h.resetSlot(slots[i]); err != nil {
				return err
			}
			delete(h.freed, slots[i])
		}
		if err := h.writeService(slots[i], s, newState); err != nil {
			return err
		}
	}
	h.Config, h.slots = cfg, slots
	h.log.Info("hedger updated", "interface", cfg.Interface, "services", len(cfg.Services), "slots", h.capacity)
	return nil
}

// restartNeeded names the first hedger-wide setting that differs ("" when none does).
func restartNeeded(a, b *Config) string {
	switch {
	case a.Interface != b.Interface:
		return "interface"
	case a.DelayLine != b.DelayLine:
		return "delay_line"
	case a.ScoreboardSize != b.ScoreboardSize:
		return "scoreboard_size"
	case a.TTL != b.TTL:
		return "ttl"
	case a.Tick != b.Tick:
		return "tick"
	case a.Mark != b.Mark:
		return "mark"
	}
	return ""
}

// slot is the slot of Config.Services[i] (slot i for a hedger that never updated).
func (h *Hedger) slot(i int) uint32 {
	if i < len(h.slots) {
		return h.slots[i]
	}
	return uint32(i)
}

// freeSlot picks a slot that is not used and was never used, or was freed at least ttl ago.
func (h *Hedger) freeSlot(used map[uint32]bool, now time.Time, ttl time.Duration) (uint32, bool) {
	if h.freed == nil {
		h.freed = map[uint32]time.Time{}
	}
	for s := range uint32(h.capacity) {
		if used[s] {
			continue
		}
		if t, ok := h.freed[s]; !ok || now.Sub(t) >= ttl {
			if !ok && slices.Contains(h.slots, s) {
				continue // in use by a service being replaced in this update
			}
			return s, true
		}
	}
	return 0, false
}

// unmapService removes s's address and its replicas' from the lookup maps.
func (h *Hedger) unmapService(s *ServiceConfig) (err error) {
	// Raised even when a delete fails: the entries deleted before it must not stay cached.
	defer func() { err = errors.Join(err, h.bumpLookupGen()) }()
	for _, ap := range s.replicas {
		if err := h.objs.Replicas.Delete(hedgeSvcKey{A: svcAddr(ap)}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove replica %s of %s: %w", ap, s.Name, err)
		}
	}
	if err := h.objs.Services.Delete(hedgeSvcKey{A: svcAddr(s.addr)}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove service %s: %w", s.Name, err)
	}
	return nil
}

// disableSlot turns a removed service's slot off: its timer work and response matching stop.
func (h *Hedger) disableSlot(idx uint32) error {
	if err := h.objs.SvcCfgs.Put(idx, hedgeSvcCfg{}); err != nil {
		return fmt.Errorf("disable service slot %d: %w", idx, err)
	}
	return nil
}

// resetSlot zeroes what a slot's previous service left: counters, histograms, store ring.
func (h *Hedger) resetSlot(idx uint32) error {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	if err := h.objs.Stats.Put(idx, make([]hedgeHedgeStats, ncpu)); err != nil {
		return fmt.Errorf("reset counters of slot %d: %w", idx, err)
	}
	for k := range uint32(histSlots + 1) {
		if err := h.objs.LatHist.Put(idx*uint32(histSlots+1)+k, hedgeKhist{}); err != nil {
			return fmt.Errorf("reset latency histogram of slot %d: %w", idx, err)
		}
	}
	for k := range uint32(2) {
		if err := h.objs.DlPrecision.Put(idx*2+k, hedgeKhist{}); err != nil {
			return fmt.Errorf("reset precision histogram of slot %d: %w", idx, err)
		}
	}
	rings := h.objs.StoreRing.MaxEntries() / uint32(2*storeRing)
	if idx >= rings {
		return nil
	}
	// Its store ring and its park ring (bpf/hedge/store.h).
	for _, ring := range []uint32{idx, rings + idx} {
		var heads hedgeStorePos
		if err := h.objs.StoreHeads.Put(ring, heads); err != nil {
			return fmt.Errorf("reset store ring of slot %d: %w", idx, err)
		}
		var cell hedgeHstore
		for k := range uint32(storeRing) {
			if err := h.objs.StoreRing.Put(ring*uint32(storeRing)+k, &cell); err != nil {
				return fmt.Errorf("reset store ring of slot %d: %w", idx, err)
			}
			if err := h.objs.StoreLaps.Put(ring*uint32(storeRing)+k, hedgeStoreLap{}); err != nil {
				return fmt.Errorf("reset store ring of slot %d: %w", idx, err)
			}
		}
	}
	return nil
}
