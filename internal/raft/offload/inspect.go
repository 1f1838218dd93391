package offload

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/netnsx"
)

// Inspection is the kernel's side of a running follower, read from outside its process (a
// stopped process cannot answer): what the program counted, the last heartbeat it answered and
// the state the node last mirrored.
type Inspection struct {
	ProgID       uint32
	Counters     map[string]uint64
	Heartbeat    Heartbeat
	Term, Leader uint64
	AliveUntil   time.Duration // CLOCK_MONOTONIC
}

// Inspect finds the follower program attached to ifname in ns (-1: the caller's namespace)
// and reads its maps.
func Inspect(ns netns.NsHandle, ifname string) (*Inspection, error) {
	var id uint32
	err := netnsx.In(ns, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("find %s: %w", ifname, err)
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			id = x.ProgId
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, fmt.Errorf("inspect %s: no XDP program attached", ifname)
	}
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return nil, fmt.Errorf("open XDP program %d: %w", id, err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("program %d info: %w", id, err)
	}
	ids, _ := info.MapIDs()
	maps := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range maps {
			m.Close()
		}
	}()
	for _, mid := range ids {
		m, err := ebpf.NewMapFromID(mid)
		if err != nil {
			return nil, fmt.Errorf("open map %d of program %d: %w", mid, id, err)
		}
		mi, err := m.Info()
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("map %d info: %w", mid, err)
		}
		maps[mi.Name] = m
	}
	stats, hbm, stm := maps["follower_stats"], maps["follower_hb"], maps["follower_state"]
	if stats == nil || hbm == nil || stm == nil {
		return nil, fmt.Errorf("inspect %s: program %d (%s) is not kedge's raft follower program", ifname, id, info.Name)
	}
	in := &Inspection{ProgID: id, Counters: map[string]uint64{}}
	cs, err := readStats(stats)
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		in.Counters[c.Name] = c.Value
	}
	var hb raftxdpRaftxHb
	var st raftxdpRaftxState
	if err := errors.Join(hbm.LookupWithFlags(uint32(0), &hb, ebpf.LookupLock),
		stm.LookupWithFlags(uint32(0), &st, ebpf.LookupLock)); err != nil {
		return nil, fmt.Errorf("read follower maps: %w", err)
	}
	in.Heartbeat = heartbeatOf(hb)
	in.Term, in.Leader, in.AliveUntil = st.Term, st.Leader, time.Duration(st.AliveUntilNs)
	return in, nil
}
