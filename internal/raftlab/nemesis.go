package raftlab

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// FaultKinds are the faults the nemesis can inject; each lasts one period, then is healed.
var FaultKinds = []string{
	"partition",        // a random minority cut off from the rest (both directions)
	"partition-leader", // the leader alone on one side
	"oneway-leader",    // the leader hears nobody (its own packets still go out)
	"net",              // every node link: 5% loss, 5% duplication, 30% of packets 2-10 ms late (reordering)
	"kill",             // kill -9 a random node; restarted when healed
	"kill-leader",      // kill -9 the leader; restarted when healed
	"pause",            // SIGSTOP a random node; SIGCONT when healed
	"starve",           // pin a random node to one CPU with 3 spinners there
}

// ParseFaults checks a comma-separated list of fault kinds ("all" = every kind).
func ParseFaults(s string) ([]string, error) {
	if s == "all" {
		return FaultKinds, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(FaultKinds, f) {
			return nil, fmt.Errorf("unknown fault %q: use %s or all", f, strings.Join(FaultKinds, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

// FaultEvent is one injected fault, for the run's report.
type FaultEvent struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
	Start  int64  `json:"start"` // history clock (ns)
	End    int64  `json:"end"`
}

// Nemesis injects faults from kinds in turn (random order) until ctx ends: each for period,
// then healed, then period/2 of calm. It returns the events; on return everything is
// healed and every node runs again.
func (c *Cluster) Nemesis(ctx context.Context, kinds []string, period time.Duration, h *History) ([]FaultEvent, error) {
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var events []FaultEvent
	var errs []error
	for i := 0; ctx.Err() == nil && len(kinds) > 0; i++ {
		if err := c.checkRunning(); err != nil {
			errs = append(errs, err)
			break
		}
		kind := kinds[r.IntN(len(kinds))]
		ev := FaultEvent{Kind: kind, Start: h.Now()}
		undo, detail, err := c.inject(ctx, kind, r)
		ev.Detail = detail
		if err != nil {
			errs = append(errs, fmt.Errorf("inject %s: %w", kind, err))
			break
		}
		sleep(ctx, period)
		errs = append(errs, undo())
		ev.End = h.Now()
		events = append(events, ev)
		sleep(ctx, period/2)
	}
	return events, errors.Join(errs...)
}

// checkRunning fails when a node's process ended without being killed (a crash).
func (c *Cluster) checkRunning() error {
	for _, n := range c.Nodes {
		if c.PID(n.ID) != 0 && !c.Running(n.ID) {
			b, _ := os.ReadFile(c.LogPath(n.ID))
			if len(b) > 1500 {
				b = b[len(b)-1500:]
			}
			return fmt.Errorf("node %d exited on its own; the end of %s:\n%s", n.ID, c.LogPath(n.ID), b)
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (c *Cluster) nodeNames(ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = NodeName(id)
	}
	return out
}

func (c *Cluster) allIDs() []int {
	ids := make([]int, len(c.Nodes))
	for i := range ids {
		ids[i] = i + 1
	}
	return ids
}

// inject applies one fault and returns how to heal it and a description.
func (c *Cluster) inject(ctx context.Context, kind string, r *rand.Rand) (undo func() error, detail string, err error) {
	ids := c.allIDs()
	heal := func() error { return c.Faults.Heal() }
	leader := func() int {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		id, _ := c.WaitLeader(lctx, nil)
		if id == 0 {
			id = ids[r.IntN(len(ids))]
		}
		return id
	}
	switch kind {
	case "partition":
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		k := 1 + r.IntN((len(ids)-1)/2)
		minority, majority := ids[:k], ids[k:]
		err = c.Faults.Partition(c.nodeNames(minority), c.nodeNames(majority))
		return heal, fmt.Sprintf("%v | %v", minority, majority), err
	case "partition-leader":
		l := leader()
		others := slices.DeleteFunc(ids, func(i int) bool { return i == l })
		err = c.Faults.Partition(c.nodeNames([]int{l}), c.nodeNames(others))
		return heal, fmt.Sprintf("leader %d | %v", l, others), err
	case "oneway-leader":
		l := leader()
		others := slices.DeleteFunc(ids, func(i int) bool { return i == l })
		err = c.Faults.Set(lab.LinkFault{Partition: true}, lab.OneWay(c.nodeNames(others), []string{NodeName(l)})...)
		return heal, fmt.Sprintf("%v -/-> leader %d", others, l), err
	case "net":
		f := lab.LinkFault{Loss: 0.05, Dup: 0.05, Delay: 2 * time.Millisecond, Jitter: 8 * time.Millisecond, DelayShare: 0.3}
		err = c.Faults.Set(f, lab.OneWay(c.nodeNames(ids), c.nodeNames(ids))...)
		return heal, f.String(), err
	case "kill", "kill-leader":
		id := ids[r.IntN(len(ids))]
		if kind == "kill-leader" {
			id = leader()
		}
		if err := c.Kill(id); err != nil {
			return nil, "", err
		}
		return func() error { return c.Start(id) }, fmt.Sprintf("node %d", id), nil
	case "pause":
		id := ids[r.IntN(len(ids))]
		pid := c.PID(id)
		if err := lab.Pause(pid); err != nil {
			return nil, "", err
		}
		return func() error { return lab.Resume(pid) }, fmt.Sprintf("node %d", id), nil
	case "starve":
		id := ids[r.IntN(len(ids))]
		s, err := lab.Starve(c.PID(id), runtime.NumCPU()-1, 3)
		if err != nil {
			return nil, "", err
		}
		return s.Stop, fmt.Sprintf("node %d on cpu %d, 3 spinners", id, s.CPU), nil
	}
	return nil, "", fmt.Errorf("unknown fault %q", kind)
}
