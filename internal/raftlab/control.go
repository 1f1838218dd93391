package raftlab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// A persistent lab cluster (`kedge raft lab up`) is owned by a supervisor process that
// keeps the nodes, the fault fabric and its delay line; the other commands talk to it over
// a unix socket in the cluster's directory, one JSON request and one JSON response per
// connection.

// Files in a persistent cluster's directory.
const (
	ControlSocket = "control.sock"
	ReadyFile     = "ready.json" // written when the cluster is up: the Info
	SupervisorLog = "supervisor.log"
)

// Request is one control command.
type Request struct {
	Op       string        `json:"op"` // status, partition, oneway, net, heal, kill, start, pause, resume, starve, unstarve, stall, unstall, down
	Groups   [][]int       `json:"groups,omitempty"`
	From     []int         `json:"from,omitempty"`
	To       []int         `json:"to,omitempty"`
	Node     int           `json:"node,omitempty"` // 0 with kill/pause/starve/stall: the current leader
	Fault    lab.LinkFault `json:"fault,omitempty"`
	Spinners int           `json:"spinners,omitempty"`
	// WriteIOPS: stall's limit on the node's disk writes per second (0: StallIOPS).
	WriteIOPS int `json:"write_iops,omitempty"`
}

// NodeInfo describes one node for status output.
type NodeInfo struct {
	ID         int     `json:"id"`
	Host       string  `json:"host"`
	Netns      string  `json:"netns"`
	PID        int     `json:"pid"`
	Raft       string  `json:"raft"`
	Client     string  `json:"client"`
	Paused     bool    `json:"paused,omitempty"`
	Starved    bool    `json:"starved,omitempty"`
	Stalled    bool    `json:"stalled,omitempty"`
	Status     *Status `json:"status,omitempty"`
	Unanswered string  `json:"unanswered,omitempty"`
}

// Info is a cluster's description (ready.json, and part of every response).
type Info struct {
	Name         string           `json:"name"`
	Dir          string           `json:"dir"`
	Config       string           `json:"config"`
	Supervisor   int              `json:"supervisor_pid"`
	Owner        string           `json:"owner"` // the supervisor's runstate owner (cleanup judges it)
	ClientNetns  string           `json:"client_netns"`
	DelayBackend string           `json:"delay_backend"`
	Nodes        []NodeInfo       `json:"nodes"`
	Rules        []lab.LinkRule   `json:"rules"`
	Fabric       *lab.FabricStats `json:"fabric,omitempty"`
	Events       []string         `json:"events,omitempty"`
}

// Response answers a Request.
type Response struct {
	Error string `json:"error,omitempty"`
	Done  string `json:"done,omitempty"`
	Info  *Info  `json:"info,omitempty"`
}

// Supervisor serves a persistent cluster's control socket.
type Supervisor struct {
	C *Cluster

	mu      sync.Mutex
	paused  map[int]bool
	starved map[int]*lab.Starver
	stalled map[int]*lab.DiskStall
	down    chan struct{}
	once    sync.Once
}

// NewSupervisor wraps an Up cluster.
func NewSupervisor(c *Cluster) *Supervisor {
	return &Supervisor{C: c, paused: map[int]bool{}, starved: map[int]*lab.Starver{}, stalled: map[int]*lab.DiskStall{}, down: make(chan struct{})}
}

// Down is closed when a "down" request arrived.
func (s *Supervisor) Down() <-chan struct{} { return s.down }

// Serve listens on the control socket until ctx ends; it writes the ready file first.
func (s *Supervisor) Serve(ctx context.Context) error {
	sock := filepath.Join(s.C.Spec.Dir, ControlSocket)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on control socket: %w", err)
	}
	defer ln.Close()
	if err := s.writeReady(s.info(ctx, false)); err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept control connection: %w", err)
		}
		go s.handle(ctx, conn)
	}
}

func (s *Supervisor) handle(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	var req Request
	var resp Response
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&req); err != nil {
		resp.Error = fmt.Sprintf("decode request: %v", err)
	} else if done, err := s.do(ctx, req); err != nil {
		resp.Error = err.Error()
	} else {
		resp.Done = done
		resp.Info = s.info(ctx, true)
		if err := s.writeReady(resp.Info); err != nil { // node pids change with kill/start
			resp.Error = err.Error()
		}
	}
	_ = json.NewEncoder(conn).Encode(resp)
	if req.Op == "down" && resp.Error == "" {
		s.once.Do(func() { close(s.down) })
	}
}

// writeReady writes the ready file: the cluster's description with the node pids, which
// 'kedge raft lab down' uses when the supervisor is gone.
func (s *Supervisor) writeReady(info *Info) error {
	b, _ := json.MarshalIndent(info, "", " ")
	tmp := filepath.Join(s.C.Spec.Dir, ReadyFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write ready file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.C.Spec.Dir, ReadyFile)); err != nil {
		return fmt.Errorf("write ready file: %w", err)
	}
	return nil
}

func (s *Supervisor) node(ctx context.Context, id int) (int, error) {
	if id == 0 {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return s.C.WaitLeader(lctx, nil)
	}
	if s.C.Node(id) == nil {
		return 0, fmt.Errorf("no node %d: the cluster has nodes 1-%d", id, len(s.C.Nodes))
	}
	return id, nil
}

// stopped is the one node that is not running (the one "start killed" means).
func (s *Supervisor) stopped() (int, error) {
	var down []int
	for id := 1; id <= len(s.C.Nodes); id++ {
		if s.C.PID(id) == 0 {
			down = append(down, id)
		}
	}
	switch len(down) {
	case 0:
		return 0, errors.New("every node is running: nothing to start")
	case 1:
		return down[0], nil
	}
	return 0, fmt.Errorf("nodes %v are down: name the one to start", down)
}

func (s *Supervisor) do(ctx context.Context, req Request) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.C
	switch req.Op {
	case "status", "down":
		return req.Op, nil
	case "heal":
		return "healed every link", c.Faults.Heal()
	case "partition":
		if len(req.Groups) < 2 {
			return "", errors.New("partition needs at least two groups of nodes")
		}
		groups := make([][]string, len(req.Groups))
		for i, g := range req.Groups {
			groups[i] = c.nodeNames(g)
		}
		return fmt.Sprintf("partitioned %v", req.Groups), c.Faults.Partition(groups...)
	case "oneway":
		return fmt.Sprintf("cut %v -> %v", req.From, req.To),
			c.Faults.Set(lab.LinkFault{Partition: true}, lab.OneWay(c.nodeNames(req.From), c.nodeNames(req.To))...)
	case "net":
		from, to := req.From, req.To
		if len(from) == 0 {
			from = c.allIDs()
		}
		if len(to) == 0 {
			to = c.allIDs()
		}
		return fmt.Sprintf("%v -> %v: %s", from, to, req.Fault), c.Faults.Set(req.Fault, lab.OneWay(c.nodeNames(from), c.nodeNames(to))...)
	}
	var id int
	var err error
	if req.Op == "start" && req.Node == 0 {
		id, err = s.stopped()
	} else {
		id, err = s.node(ctx, req.Node)
	}
	if err != nil {
		return "", err
	}
	switch req.Op {
	case "kill":
		delete(s.paused, id)
		if st := s.starved[id]; st != nil {
			_ = st.Stop()
			delete(s.starved, id)
		}
		if st := s.stalled[id]; st != nil {
			delete(s.stalled, id)
			if err := c.Kill(id); err != nil {
				return "", err
			}
			return fmt.Sprintf("killed node %d (kill -9)", id), st.Stop()
		}
		return fmt.Sprintf("killed node %d (kill -9)", id), c.Kill(id)
	case "start":
		if err := c.Start(id); err != nil {
			return "", err
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return fmt.Sprintf("started node %d", id), c.WaitReady(rctx, id)
	case "pause":
		s.paused[id] = true
		return fmt.Sprintf("paused node %d (SIGSTOP)", id), lab.Pause(c.PID(id))
	case "resume":
		delete(s.paused, id)
		return fmt.Sprintf("resumed node %d (SIGCONT)", id), lab.Resume(c.PID(id))
	case "starve":
		if s.starved[id] != nil {
			return "", fmt.Errorf("node %d is starved already", id)
		}
		n := req.Spinners
		if n == 0 {
			n = 3
		}
		st, err := lab.Starve(c.PID(id), runtime.NumCPU()-1, n)
		if err != nil {
			return "", err
		}
		s.starved[id] = st
		return fmt.Sprintf("starving node %d: pinned to cpu %d with %d spinners", id, st.CPU, n), nil
	case "unstarve":
		st := s.starved[id]
		if st == nil {
			return "", fmt.Errorf("node %d is not starved", id)
		}
		delete(s.starved, id)
		return fmt.Sprintf("node %d no longer starved", id), st.Stop()
	case "stall":
		if s.stalled[id] != nil {
			return "", fmt.Errorf("node %d's disk is stalled already", id)
		}
		st, err := c.StallDisk(id, req.WriteIOPS)
		if err != nil {
			return "", err
		}
		s.stalled[id] = st
		return fmt.Sprintf("stalled node %d's disk: %d writes/s to %s", id, st.WriteIOPS, st.Device), nil
	case "unstall":
		st := s.stalled[id]
		if st == nil {
			return "", fmt.Errorf("node %d's disk is not stalled", id)
		}
		delete(s.stalled, id)
		return fmt.Sprintf("node %d's disk no longer stalled", id), st.Stop()
	}
	return "", fmt.Errorf("unknown control op %q", req.Op)
}

// Stop ends every starvation and resumes paused nodes (before Close).
func (s *Supervisor) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, st := range s.starved {
		_ = st.Stop()
		delete(s.starved, id)
	}
	for id, st := range s.stalled {
		_ = st.Stop()
		delete(s.stalled, id)
	}
}

func (s *Supervisor) info(ctx context.Context, live bool) *Info {
	c := s.C
	in := &Info{Name: c.Spec.Name, Dir: c.Spec.Dir, Config: c.Config, Supervisor: os.Getpid(), Owner: runstate.SelfID(),
		ClientNetns: c.Client.Name, DelayBackend: c.Faults.DelayBackend(), Rules: c.Faults.Rules()}
	if st, err := c.Faults.Stats(); err == nil {
		in.Fabric = &st
	}
	for _, n := range c.Nodes {
		ni := NodeInfo{ID: n.ID, Host: n.Host.HostName, Netns: n.Host.Name, PID: c.PID(n.ID),
			Raft: n.RaftAddr.String(), Client: n.ClientAddr.String(), Paused: s.paused[n.ID], Starved: s.starved[n.ID] != nil, Stalled: s.stalled[n.ID] != nil}
		if live && ni.PID != 0 && !ni.Paused {
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			st, err := c.Status(sctx, n.ID)
			cancel()
			if err != nil {
				ni.Unanswered = err.Error()
			} else {
				ni.Status = &st
			}
		}
		in.Nodes = append(in.Nodes, ni)
	}
	return in
}

// Control sends req to the supervisor of the cluster in dir.
func Control(dir string, req Request, timeout time.Duration) (Response, error) {
	var resp Response
	conn, err := net.DialTimeout("unix", filepath.Join(dir, ControlSocket), timeout)
	if err != nil {
		return resp, fmt.Errorf("reach the lab cluster's supervisor: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return resp, fmt.Errorf("send control request: %w", err)
	}
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		return resp, fmt.Errorf("read control response: %w", err)
	}
	if resp.Error != "" {
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}
