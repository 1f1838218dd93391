package sg

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/nexthop"
	isg "github.com/kedge-dev/kedge/internal/sg"
	"github.com/vishvananda/netlink"
)

// Routes: the interface, each worker's next hop, and the maps that hold them.

// resolved is what resolve found: the interface, each worker's map entry and each further
// replica's (replicas[i]: shard i's, after Workers[i]).
type resolved struct {
	ifindex  int
	loopback bool
	workers  []isg.WorkerCfg
	replicas [][]isg.WorkerCfg
}

// resolve finds the interface and each worker's (and replica's) next-hop MAC, and the
// default local address. Runs inside the group's namespace.
func resolve(cfg *Config) (resolved, error) {
	var out resolved
	link, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return out, fmt.Errorf("find interface %s: %w (list them with 'ip link')", cfg.Interface, err)
	}
	attrs := link.Attrs()
	out.ifindex, out.loopback = attrs.Index, attrs.Flags&net.FlagLoopback != 0
	entry := func(what string, w netip.AddrPort) (isg.WorkerCfg, error) {
		addr := w.Addr().Unmap()
		hop, err := resolveWorker(addr, w, out.loopback)
		if err != nil {
			return isg.WorkerCfg{}, fmt.Errorf("resolve %s (%v): %w", what, w, err)
		}
		if hop.Ifindex != attrs.Index {
			return isg.WorkerCfg{}, fmt.Errorf("%s (%v) is routed through ifindex %d, not %s (%d): every worker must be reached through the group's interface", what, w, hop.Ifindex, cfg.Interface, attrs.Index)
		}
		if what == "worker 0" && !cfg.Local.Addr().IsValid() {
			if !hop.Src.IsValid() {
				return isg.WorkerCfg{}, fmt.Errorf("no source address towards worker 0 (%v): set Config.Local", w)
			}
			cfg.Local = netip.AddrPortFrom(hop.Src, cfg.Local.Port())
		}
		wc := isg.WorkerCfg{Port: bpfx.Htons(w.Port())}
		wc.Addr.In6U.U6Addr8 = netip.AddrFrom16(addr.As16()).As16()
		if addr.Is4() {
			wc.Addr.In6U.U6Addr8 = netip.AddrFrom16(v4mapped(addr)).As16()
		}
		copy(wc.Mac[:], hop.DstMAC) // none on a loopback interface
		return wc, nil
	}
	out.workers = make([]isg.WorkerCfg, len(cfg.Workers))
	for i, w := range cfg.Workers {
		if out.workers[i], err = entry(fmt.Sprintf("worker %d", i), w); err != nil {
			return out, err
		}
	}
	out.replicas = make([][]isg.WorkerCfg, len(cfg.Replicas))
	for i, reps := range cfg.Replicas {
		for _, r := range reps {
			wc, err := entry(fmt.Sprintf("replica of shard %d", i), r)
			if err != nil {
				return out, err
			}
			out.replicas[i] = append(out.replicas[i], wc)
		}
	}
	return out, nil
}

func v4mapped(a netip.Addr) [16]byte {
	var b [16]byte
	b[10], b[11] = 0xff, 0xff
	v := a.As4()
	copy(b[12:], v[:])
	return b
}

// resolveWorker finds the route to worker w (at addr) and, unless the group runs on a
// loopback interface, its next hop's MAC, asking the kernel to resolve it (a datagram to
// the worker) when it is not known yet.
func resolveWorker(addr netip.Addr, w netip.AddrPort, loopback bool) (nexthop.Hop, error) {
	deadline := time.Now().Add(3 * time.Second)
	for probed := false; ; {
		hop, err := nexthop.Resolve(nil, addr)
		if err == nil || loopback && hop.Ifindex != 0 {
			return hop, nil
		}
		if !errors.Is(err, nexthop.ErrNoNeighbour) {
			return hop, err
		}
		if time.Now().After(deadline) {
			return hop, fmt.Errorf("next hop %v has no MAC address (unreachable?): %w", hop.Via, err)
		}
		if !probed {
			nexthop.Probe(w) // the worker ignores an empty datagram
			probed = true
		}
		time.Sleep(10 * time.Millisecond) // polling the neighbour table with a deadline
	}
}

func (g *Group) fillMaps(r resolved) error {
	gc := isg.GroupCfg{
		Enabled:   1,
		Family:    4,
		Reduce:    g.cfg.Reduction.kernel(),
		Dtype:     g.cfg.kernelType(),
		Nworkers:  uint16(len(r.workers)),
		Elems:     uint16(g.cfg.Elems),
		SlotBase:  0,
		Nslots:    uint16(g.cfg.InFlight),
		Ifindex:   uint32(r.ifindex),
		GatherK:   uint32(g.cfg.GatherK),
		TimeoutNs: uint64(g.cfg.Timeout),
		CoordPort: bpfx.Htons(g.cfg.Local.Port()),
	}
	if r.loopback {
		gc.Flags |= isg.GroupFlagLoopback
	}
	if g.cfg.WakeSocket && !g.cfg.BusyPoll {
		gc.Flags |= isg.GroupFlagWakeSocket
	}
	if g.cfg.MultiPacket {
		gc.Flags |= isg.GroupFlagParts // PartBase 0: the group's slots start at 0
	}
	la := g.cfg.Local.Addr().Unmap()
	if la.Is4() {
		gc.CoordAddr.In6U.U6Addr8 = v4mapped(la)
	} else {
		gc.Family = 6
		gc.CoordAddr.In6U.U6Addr8 = la.As16()
	}
	if g.cfg.Group >= isg.GroupsMax {
		return fmt.Errorf("sg config: group id %d, want < %d", g.cfg.Group, isg.GroupsMax)
	}
	base := uint32(g.cfg.Group) * isg.WorkersMax
	for i, w := range r.workers {
		if err := g.objs.Workers.Put(base+uint32(i), &w); err != nil {
			return fmt.Errorf("write worker %d: %w", i, err)
		}
	}
	if base > 65535 {
		return fmt.Errorf("sg config: group id %d too large", g.cfg.Group)
	}
	gc.WorkerBase = uint16(base)
	if g.cfg.hasReplicas() {
		// ReplicaBase 0: the replicas map holds this group's shards only.
		gc.Flags |= isg.GroupFlagReplicas
		if g.cfg.ReplicaChoice == LowestLatency {
			gc.ReplicaChoice = isg.ChoiceLatency
		}
		if g.cfg.EjectBackoff > 0 {
			gc.JudgeNs, gc.EjectBaseNs, gc.EjectMaxNs = uint64(g.cfg.Timeout), uint64(g.cfg.EjectBackoff), uint64(g.cfg.EjectMaxBackoff)
		}
		for i := range r.workers {
			sh := isg.ShardRec{Nreplicas: 1}
			sh.Key[0] = base + uint32(i)
			if i < len(r.replicas) {
				for k, w := range r.replicas[i] {
					key := isg.ReplicaKey(uint32(i), k+1)
					if err := g.objs.Workers.Put(key, &w); err != nil {
						return fmt.Errorf("write replica %d of shard %d: %w", k+1, i, err)
					}
					sh.Key[k+1] = key
					sh.Nreplicas++
				}
			}
			if err := g.objs.Replicas.Put(uint32(i), &sh); err != nil {
				return fmt.Errorf("write shard %d: %w", i, err)
			}
		}
	}
	if g.cfg.Resend > 0 {
		b := g.cfg.ResendBudget
		gc.Flags |= isg.GroupFlagResend
		gc.ResendNs, gc.ResendMax = uint64(g.cfg.Resend), uint32(g.cfg.MaxResends)
		gc.ResendQuantileMilli = uint32(math.Round(g.cfg.ResendQuantile * 1000))
		gc.ResendMinNs = uint64(g.cfg.ResendMin)
		gc.BudgetRatioMilli = uint32(math.Round(b.Ratio * isg.CopyMilli))
		gc.BudgetCapMilli = uint64(b.Burst) * isg.CopyMilli
		// The bucket starts full: the first requests' re-sends are paid by the burst.
		if err := g.objs.Budgets.Put(uint32(g.cfg.Group), &isg.BudgetRec{TokensMilli: int64(gc.BudgetCapMilli)}); err != nil {
			return fmt.Errorf("write re-send budget: %w", err)
		}
	}
	if err := g.objs.Groups.Put(uint32(g.cfg.Group), &gc); err != nil {
		return fmt.Errorf("write group: %w", err)
	}
	return nil
}
