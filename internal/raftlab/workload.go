package raftlab

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Workload is what the recording clients do.
type Workload struct {
	Clients int // concurrent clients (default 4)
	Keys    int // keys they share (default 3: contention is the point)
	// KeyPrefix starts every key. The model assumes the keys are absent when the run
	// starts: give each run on one cluster its own prefix.
	KeyPrefix string
	Timeout   time.Duration // per operation; expiry makes a write's outcome unknown (default 1s)
	// Nodes the clients may ask (nil: all). Each op goes to a random one of them.
	Nodes []int
	// Ops ends each client after this many operations (0: run until the context ends).
	Ops int
}

func (w *Workload) defaults() {
	if w.Clients <= 0 {
		w.Clients = 4
	}
	if w.Keys <= 0 {
		w.Keys = 3
	}
	if w.Timeout <= 0 {
		w.Timeout = time.Second
	}
}

// Run runs the workload against c until ctx ends (or every client did w.Ops operations),
// recording into h. The mix: 50% get, 25% put, 20% cas (expecting the value this client
// last saw for the key), 5% del. Values are unique ("<client>.<n>"), so a read names the
// write it saw. A client whose operation had an unknown outcome carries on under a new
// client id, as its old id's operation may still be pending forever.
func (c *Cluster) Run(ctx context.Context, w Workload, h *History) {
	w.defaults()
	nodes := w.Nodes
	if nodes == nil {
		for _, n := range c.Nodes {
			nodes = append(nodes, n.ID)
		}
	}
	var wg sync.WaitGroup
	for i := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.client(ctx, w, nodes, i, h)
		}()
	}
	wg.Wait()
}

func (c *Cluster) client(ctx context.Context, w Workload, nodes []int, idx int, h *History) {
	cl := NewClient(c.Client, w.Timeout)
	defer cl.Close()
	r := rand.New(rand.NewPCG(uint64(idx), uint64(time.Now().UnixNano())))
	id := idx
	seen := map[string]string{}
	for n := 0; w.Ops == 0 || n < w.Ops; n++ {
		if ctx.Err() != nil {
			return
		}
		key := fmt.Sprintf("%sk%d", w.KeyPrefix, r.IntN(w.Keys))
		node := nodes[r.IntN(len(nodes))]
		op := Op{Client: id, Key: key, Node: node}
		switch x := r.IntN(100); {
		case x < 50:
			op.Kind = Get
		case x < 75:
			op.Kind, op.Value = Put, fmt.Sprintf("%d.%d", idx, n)
		case x < 95:
			op.Kind, op.Value = CAS, fmt.Sprintf("%d.%d", idx, n)
			if v, ok := seen[key]; ok {
				op.Expect = v
			} else {
				op.ExpectAbsent = true
			}
		default:
			op.Kind = Del
		}
		opCtx, cancel := context.WithTimeout(context.Background(), w.Timeout)
		op.Call = h.Now()
		Do(opCtx, cl, c.Node(node).ClientAddr, &op)
		op.Return = h.Now()
		cancel()
		h.Add(op)
		switch {
		case op.Out.Unknown:
			id += w.Clients
			delete(seen, key)
		case op.Out.Err != "":
			// refused (no leader, node down): back off a little so a dead node is not hammered
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(5+r.IntN(10)) * time.Millisecond):
			}
		case op.Kind == Get && op.Out.Found, op.Kind == CAS && !op.Out.OK && op.Out.Found:
			seen[key] = op.Out.Value
		case op.Kind == Get, op.Kind == Del, op.Kind == CAS && !op.Out.OK:
			delete(seen, key)
		default: // put, successful cas
			seen[key] = op.Value
		}
	}
}
