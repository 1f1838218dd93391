package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/client"
	"github.com/kedge-dev/kedge/internal/raft/config"
	"github.com/kedge-dev/kedge/internal/raft/rafttest"
	pb "go.etcd.io/raft/v3/raftpb"
)

// freeAddr returns a loopback host:port free for both UDP and TCP right now.
func freeAddr(t *testing.T) string { return rafttest.FreeAddr(t).String() }

type cluster struct {
	t      *testing.T
	cfgs   []*config.Config
	nodes  map[uint64]*Node
	cancel map[uint64]context.CancelFunc
	errs   map[uint64]chan error
	hooks  map[uint64]func(msgs []*pb.Message, saving []*pb.Entry) // beforeSend per node, set before Run
}

func newCluster(t *testing.T, size int, tweak func(*config.Config)) *cluster {
	c := &cluster{t: t, nodes: map[uint64]*Node{}, cancel: map[uint64]context.CancelFunc{}, errs: map[uint64]chan error{}}
	var peers []config.Peer
	for i := 1; i <= size; i++ {
		peers = append(peers, config.Peer{ID: uint64(i), Raft: freeAddr(t), Client: freeAddr(t)})
	}
	base := t.TempDir()
	for i := 1; i <= size; i++ {
		cfg := &config.Config{ClusterID: 42, ID: uint64(i), DataDir: fmt.Sprintf("%s/n%d", base, i), Peers: peers,
			RequestTimeout: 3 * time.Second, ElectionTicks: 30} // 300 ms: see newProcCluster
		if tweak != nil {
			tweak(cfg)
		}
		cfg.Defaults()
		if err := cfg.Check(); err != nil {
			t.Fatal(err)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	for i := 1; i <= size; i++ {
		c.start(uint64(i))
	}
	t.Cleanup(func() {
		for id := range c.nodes {
			c.stop(id)
		}
	})
	return c
}

func (c *cluster) start(id uint64) {
	c.t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	n, err := New(c.cfgs[id-1], Options{Log: log})
	if err != nil {
		c.t.Fatalf("start node %d: %v", id, err)
	}
	n.beforeSend = c.hooks[id]
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- n.Run(ctx) }()
	c.nodes[id], c.cancel[id], c.errs[id] = n, cancel, ch
}

func (c *cluster) stop(id uint64) {
	c.t.Helper()
	c.cancel[id]()
	if err := <-c.errs[id]; err != nil {
		c.t.Errorf("node %d: %v", id, err)
	}
	delete(c.nodes, id)
}

func (c *cluster) client(ids ...uint64) *client.Client {
	cl := &client.Client{}
	for _, id := range ids {
		cl.Endpoints = append(cl.Endpoints, c.cfgs[id-1].Self().Client)
	}
	return cl
}

// waitLeader polls until every running node agrees on one leader.
func (c *cluster) waitLeader() uint64 {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var lead uint64
		agree := true
		for _, n := range c.nodes {
			s := n.Status()
			if s.Leader == 0 || (lead != 0 && s.Leader != lead) {
				agree = false
				break
			}
			lead = s.Leader
		}
		if agree && lead != 0 {
			if _, ok := c.nodes[lead]; ok {
				return lead
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatal("no leader within 10s")
	return 0
}

// retry repeats op while it fails without effect (no leader right now: 503, outcome none);
// any other error, or an unknown outcome, fails the test.
func retry[T any](t *testing.T, what string, op func() (T, error)) T {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r, err := op()
		var e *client.Error
		if err == nil || !errors.As(err, &e) || e.Outcome != api.OutcomeNone || time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClusterKV(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.waitLeader()
	ctx := context.Background()
	follower := lead%3 + 1
	// Writes through a follower (forwarded proposal) and reads on every node.
	fc := c.client(follower)
	if r := retry(t, "put via follower", func() (api.WriteResponse, error) { return fc.Put(ctx, "a", "1") }); !r.OK {
		t.Fatalf("put via follower: %+v", r)
	}
	for id := uint64(1); id <= 3; id++ {
		g := retry(t, "get", func() (api.GetResponse, error) { return c.client(id).Get(ctx, "a") })
		if !g.Found || g.Value != "1" {
			t.Fatalf("get on node %d: %+v", id, g)
		}
	}
	if r := retry(t, "cas", func() (api.WriteResponse, error) { return fc.CAS(ctx, "a", "0", false, "2") }); r.OK || r.Value != "1" {
		t.Fatalf("cas with wrong expectation: %+v", r)
	}
	if r := retry(t, "cas", func() (api.WriteResponse, error) { return fc.CAS(ctx, "a", "1", false, "2") }); !r.OK {
		t.Fatalf("cas: %+v", r)
	}
	if r := retry(t, "cas", func() (api.WriteResponse, error) { return fc.CAS(ctx, "b", "", true, "new") }); !r.OK {
		t.Fatalf("cas absent: %+v", r)
	}
	if r := retry(t, "delete", func() (api.WriteResponse, error) { return c.client(lead).Delete(ctx, "a") }); !r.OK || !r.Found {
		t.Fatalf("delete: %+v", r)
	}
	if g := retry(t, "get", func() (api.GetResponse, error) { return fc.Get(ctx, "a") }); g.Found {
		t.Fatalf("get after delete: %+v", g)
	}
}

// TestHTTPErrors: malformed requests are refused with a JSON error that says the write did
// not happen; /metrics serves the node's series.
func TestHTTPErrors(t *testing.T) {
	c := newCluster(t, 1, nil)
	c.waitLeader()
	base := "http://" + c.cfgs[0].Self().Client
	cases := []struct {
		method, path, body string
		status             int
	}{
		{"PUT", "/v1/kv/" + strings.Repeat("k", api.MaxKey+1), `{"value":"x"}`, 400},
		{"PUT", "/v1/kv/a", `{"value":`, 400},
		{"PUT", "/v1/kv/a", `{"value":"x","extra":1}`, 400},
		{"PUT", "/v1/kv/a", `{"value":"` + strings.Repeat("v", api.MaxValue+1) + `"}`, 400},
		{"POST", "/v1/cas/a", `{"expect":1}`, 400},
		{"GET", "/v1/nope", ``, 404},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		derr := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.status || derr != nil || e.Error == "" || e.Outcome != api.OutcomeNone {
			t.Errorf("%s %.40s: %d %+v (%v), want %d with a JSON error, outcome none", tc.method, tc.path, resp.StatusCode, e, derr, tc.status)
		}
	}
	// Nothing of the above was applied.
	if g := retry(t, "get", func() (api.GetResponse, error) { return c.client(1).Get(context.Background(), "a") }); g.Found {
		t.Fatalf("a refused write was applied: %+v", g)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"kedge_raft_term 2", "kedge_raft_is_leader 1", "kedge_raft_wal_fsync_seconds_count",
		`kedge_raft_reads_total{result="ok"} 1`, `kedge_raft_transport_dropped_total{reason="cluster"} 0`} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
}
