// Command raftkv is the smallest application of pkg/raft/kernelpaths: a replicated
// key-value map on go.etcd.io/raft/v3 whose transport and kernel paths come from the public
// package only. It keeps its own write-ahead log (wal.go), its own state machine and its
// own HTTP API; everything kernelpaths asks of it is in its Ready loop (loop), in the order
// of the package's contract.
//
//	raftkv --id 1 --members 1=10.0.0.1:7000,2=10.0.0.2:7000,3=10.0.0.3:7000 \
//	    --http 10.0.0.1:8080 --data /var/lib/raftkv
//
//	curl -X PUT --data-binary v http://10.0.0.1:8080/kv/k   # 204 once applied here
//	curl http://10.0.0.1:8080/kv/k                           # linearizable (ReadIndex)
//	curl http://10.0.0.1:8080/status                         # {"id":1,"leader":2,"term":3,...}
//
// Writes and reads may go to any node (etcd-raft forwards them to the leader). Answers:
// 204/200/404 are results; 503 means the request did not take effect (no leader known, or
// the proposal was dropped); 504 means it may have (the wait timed out). It does no
// snapshots: its log grows without bound - an example, not a store.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "raftkv:", err)
		os.Exit(1)
	}
}

// Raft timing: 10 ms ticks, a 100 ms election timeout, a heartbeat per tick.
const (
	tick           = 10 * time.Millisecond
	electionTicks  = 10
	heartbeatTicks = 1
	requestTimeout = 2 * time.Second
)

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("raftkv", flag.ContinueOnError)
	id := fs.Uint64("id", 0, "this node's raft id (one of --members)")
	members := fs.String("members", "", "every member as id=ip:port (the raft address, UDP and TCP), comma-separated")
	httpAddr := fs.String("http", "", "client API address host:port")
	dataDir := fs.String("data", "", "data directory (the write-ahead log)")
	paths := fs.String("kernel-paths", "auto", "kernel paths: auto (where the kernel allows), on, or off")
	if err := fs.Parse(args); err != nil {
		return err
	}
	peers, err := parseMembers(*members)
	if err != nil {
		return err
	}
	if *id == 0 || *httpAddr == "" || *dataDir == "" {
		return errors.New("--id, --members, --http and --data are required")
	}
	mode, ok := map[string]kernelpaths.Mode{"auto": kernelpaths.Auto, "on": kernelpaths.On, "off": kernelpaths.Off}[*paths]
	if !ok {
		return fmt.Errorf("--kernel-paths %q: use auto, on or off", *paths)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// Storage first: etcd-raft reads it at start.
	st := raft.NewMemoryStorage()
	wal, fresh, err := openWAL(*dataDir, st)
	if err != nil {
		return err
	}
	defer wal.Close()

	// The offload: the transport and the kernel paths (kernelpaths.Config's timing is
	// raft.Config's, contract rule 1).
	off, err := kernelpaths.Open(kernelpaths.Config{ClusterID: 0x6b76, ID: *id, Peers: peers,
		Tick: tick, ElectionTicks: electionTicks, HeartbeatTicks: heartbeatTicks,
		Follower: mode, LeaderHeartbeats: mode})
	if err != nil {
		return err
	}
	rc := &raft.Config{ID: *id, ElectionTick: electionTicks, HeartbeatTick: heartbeatTicks, Storage: st,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, PreVote: true, CheckQuorum: true, ReadOnlyOption: raft.ReadOnlySafe}
	var rn raft.Node
	if fresh {
		var rp []raft.Peer
		for _, p := range peers {
			rp = append(rp, raft.Peer{ID: p.ID})
		}
		rn = raft.StartNode(rc, rp)
	} else {
		rn = raft.RestartNode(rc)
	}
	if err := off.Start(rn, st); err != nil {
		rn.Stop()
		off.Close()
		return err
	}
	kv := &store{id: *id, rn: rn, off: off, data: map[string]string{}, writes: map[uint64]chan struct{}{},
		reads: map[uint64]*read{}}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		rn.Stop()
		off.Close()
		return err
	}
	srv := &http.Server{Handler: kv.handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	slog.Info("raftkv: serving", "id", *id, "http", ln.Addr().String(), "kernel_paths", off.Mode())

	loopErr := kv.loop(ctx, wal) // until ctx ends or the storage fails
	srv.Close()
	// Contract rule 7: Close after the loop, before Stop.
	err = errors.Join(loopErr, off.Close())
	rn.Stop()
	return err
}

func parseMembers(s string) ([]kernelpaths.Peer, error) {
	var peers []kernelpaths.Peer
	for _, m := range strings.Split(s, ",") {
		ids, addr, ok := strings.Cut(strings.TrimSpace(m), "=")
		id, err := strconv.ParseUint(ids, 10, 64)
		if !ok || err != nil || id == 0 {
			return nil, fmt.Errorf("--members: %q is not id=ip:port", m)
		}
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("--members: %q: %w", m, err)
		}
		peers = append(peers, kernelpaths.Peer{ID: id, Addr: ap})
	}
	return peers, nil
}

// store is the state machine and what waits on it.
type store struct {
	id  uint64
	rn  raft.Node
	off *kernelpaths.Offload

	mu      sync.Mutex
	data    map[string]string
	applied uint64
	writes  map[uint64]chan struct{} // proposal id -> closed when applied here
	reads   map[uint64]*read         // read id -> its ReadIndex
}

type read struct {
	index uint64 // 0 until the ReadState came
	done  chan struct{}
}

// command is an entry's payload.
type command struct {
	ID    uint64 `json:"id"`
	Key   string `json:"key"`
	Value string `json:"value"`
}

// loop is the Ready loop, the one goroutine that persists, sends and applies (contract
// rules 4 and 5).
func (s *store) loop(ctx context.Context, wal *wal) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.off.Tick(ctx) // instead of rn.Tick()
		case w := <-s.off.Wakeups():
			s.off.Wake(ctx, w)
		case rd := <-s.rn.Ready():
			s.off.Send(s.off.BeforeSave(&rd)) // a leader's appends overlap its own fsync
			if err := wal.Save(rd.HardState, rd.Entries, rd.MustSync); err != nil {
				return err // nothing of this Ready may go out now
			}
			s.off.AfterSave(&rd) // durable: the kernel may answer for the new term
			s.off.Send(rd.Messages)
			if err := s.apply(rd.CommittedEntries); err != nil {
				return err
			}
			s.readStates(rd.ReadStates)
			s.rn.Advance()
			s.off.Advanced()
		}
	}
}

func (s *store) apply(ents []*pb.Entry) error {
	for _, e := range ents {
		switch e.GetType() {
		case pb.EntryNormal:
			var c command
			if len(e.GetData()) > 0 && json.Unmarshal(e.GetData(), &c) == nil {
				s.mu.Lock()
				s.data[c.Key] = c.Value
				if ch := s.writes[c.ID]; ch != nil {
					close(ch)
					delete(s.writes, c.ID)
				}
				s.mu.Unlock()
			}
		case pb.EntryConfChange:
			var cc pb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return fmt.Errorf("decode conf change %d: %w", e.GetIndex(), err)
			}
			s.off.SetConfState(s.rn.ApplyConfChange(&cc)) // contract rule 6
		}
		s.mu.Lock()
		s.applied = e.GetIndex()
		s.mu.Unlock()
	}
	return nil
}

func (s *store) readStates(rss []raft.ReadState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range rss {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		if r := s.reads[binary.BigEndian.Uint64(rs.RequestCtx)]; r != nil && r.index == 0 {
			r.index = rs.Index
		}
	}
	for id, r := range s.reads {
		if r.index != 0 && r.index <= s.applied {
			close(r.done)
			delete(s.reads, id)
		}
	}
}

var (
	errNoLeader = errors.New("no leader known")
	errTimeout  = errors.New("timed out")
)

func newID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}

func (s *store) put(ctx context.Context, key, value string) error {
	c := command{ID: newID(), Key: key, Value: value}
	data, _ := json.Marshal(c)
	done := make(chan struct{})
	s.mu.Lock()
	s.writes[c.ID] = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.writes, c.ID)
		s.mu.Unlock()
	}()
	if s.rn.Status().Lead == raft.None {
		return errNoLeader
	}
	if err := s.rn.Propose(ctx, data); err != nil {
		if errors.Is(err, raft.ErrProposalDropped) {
			return errNoLeader
		}
		return errTimeout
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return errTimeout
	}
}

// get reads key linearizably: a ReadIndex, then the map once it is applied up to the index.
// etcd-raft drops a read request while there is no leader: it is asked again every
// election timeout.
func (s *store) get(ctx context.Context, key string) (string, bool, error) {
	if s.rn.Status().Lead == raft.None {
		return "", false, errNoLeader
	}
	id := newID()
	r := &read{done: make(chan struct{})}
	s.mu.Lock()
	s.reads[id] = r
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.reads, id)
		s.mu.Unlock()
	}()
	retry := time.NewTicker(electionTicks * tick)
	defer retry.Stop()
	for {
		if err := s.rn.ReadIndex(ctx, binary.BigEndian.AppendUint64(nil, id)); err != nil {
			return "", false, errTimeout
		}
		select {
		case <-r.done:
			s.mu.Lock()
			defer s.mu.Unlock()
			v, ok := s.data[key]
			return v, ok, nil
		case <-retry.C:
		case <-ctx.Done():
			return "", false, errTimeout
		}
	}
}

func (s *store) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /kv/{key}", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		if err := s.put(ctx, r.PathValue("key"), string(b)); err != nil {
			httpError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /kv/{key}", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		v, ok, err := s.get(ctx, r.PathValue("key"))
		switch {
		case err != nil:
			httpError(w, err)
		case !ok:
			http.Error(w, "not found", http.StatusNotFound)
		default:
			io.WriteString(w, v)
		}
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		st := s.rn.Status()
		json.NewEncoder(w).Encode(map[string]any{"id": s.id, "leader": st.Lead, "term": st.GetTerm(),
			"state": st.RaftState.String(), "kernel_paths": s.off.Mode()})
	})
	return mux
}

func httpError(w http.ResponseWriter, err error) {
	code := http.StatusGatewayTimeout // may have taken effect
	if errors.Is(err, errNoLeader) {
		code = http.StatusServiceUnavailable // did not
	}
	http.Error(w, err.Error(), code)
}
