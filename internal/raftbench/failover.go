package raftbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/client"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raftlab"
	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
)

// Failover: kill the leader under writes, time the first write a new leader takes, by phase.

// Failover is one election-timeout setting's trials: kill -9 of the leader until the first
// write acknowledged through a surviving node.
type Failover struct {
	Offload           string    `json:"offload"` // one of Modes
	Nodes             int       `json:"nodes"`
	TickMs            float64   `json:"tick_ms"`
	ElectionTicks     int       `json:"election_ticks"`
	ElectionTimeoutMs float64   `json:"election_timeout_ms"` // etcd-raft randomises in [1x, 2x)
	Trials            int       `json:"trials"`
	FailoverMs        []float64 `json:"failover_ms"` // per trial, in order
	Failed            int       `json:"failed"`      // trials with no successful write within 10 s
	P50Ms             float64   `json:"p50_ms"`
	P99Ms             float64   `json:"p99_ms"`
	MaxMs             float64   `json:"max_ms"`
	Client            string    `json:"client"` // ClientLeader or ClientRetry
	// Phases per acknowledged trial, in order, and their medians/p99 (PhaseNames).
	Phases     []Phase      `json:"phases,omitempty"`
	PhaseStats []PhaseStats `json:"phase_stats,omitempty"`
}

// failover runs o.Trials kill -9 trials with one election timeout in each mode and for each
// failover client. With o.FailoverBlock > 0 the modes run in blocks, one cluster up at a
// time (failoverBlocks); else the clusters of all modes are up together and the trials
// alternate between them.
func (o *Options) failover(ctx context.Context, electionTicks int) (out []Failover, blocks []FailoverBlock, err error) {
	type key struct{ mode, client string }
	fs := map[key]*Failover{}
	var order []*Failover
	for _, cli := range o.failoverClients() {
		for _, mode := range o.Modes {
			f := &Failover{Offload: mode, Nodes: o.Nodes, TickMs: ms(o.Tick), ElectionTicks: electionTicks,
				ElectionTimeoutMs: o.electionMs(mode, electionTicks), Trials: o.Trials, Client: cli}
			fs[key{mode, cli}], order = f, append(order, f)
		}
	}
	if o.FailoverBlock > 0 {
		blocks, err = o.failoverBlocks(ctx, electionTicks, func(mode, cli string) *Failover { return fs[key{mode, cli}] })
		return collect(order), blocks, err
	}
	cs, closeAll, err := o.clusters(ctx, fmt.Sprintf("rbf%d", electionTicks), o.Nodes, electionTicks)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, closeAll()) }()
	for trial := 0; trial < o.Trials; trial++ {
		for _, cli := range o.failoverClients() {
			for _, mode := range o.Modes {
				if err = o.failoverTrial(ctx, cs[mode], fs[key{mode, cli}], trial); err != nil {
					return collect(order), nil, fmt.Errorf("offload %s, client %s: %w", mode, cli, err)
				}
			}
		}
		if trial%10 == 9 {
			o.logf("failover, election %d ticks: %d/%d trials per mode", electionTicks, trial+1, o.Trials)
		}
	}
	return collect(order), nil, nil
}

// FailoverBlock is one block of a failover run in blocks (Options.FailoverBlock): one mode's
// cluster started with no other cluster up, its trials run (the clients alternating), the
// cluster stopped - its processes gone, its namespaces and data removed - before the next
// block's starts.
type FailoverBlock struct {
	Block             int           `json:"block"` // in the order run, per election timeout, from 0
	Offload           string        `json:"offload"`
	ElectionTicks     int           `json:"election_ticks"`
	ElectionTimeoutMs float64       `json:"election_timeout_ms"`
	UpMs              float64       `json:"up_ms"`      // starting the cluster
	LoadStart         []float64     `json:"load_start"` // /proc/loadavg (1, 5, 15 min) at the block's start and end
	LoadEnd           []float64     `json:"load_end"`
	Clients           []BlockClient `json:"clients"`
}

// BlockClient is one failover client's trials in a block.
type BlockClient struct {
	Client     string    `json:"client"`
	FailoverMs []float64 `json:"failover_ms"` // per acknowledged trial, in order
	Failed     int       `json:"failed"`
	P50Ms      float64   `json:"p50_ms"`
	P99Ms      float64   `json:"p99_ms"`
	MaxMs      float64   `json:"max_ms"`
}

// blockRun is one block of the schedule: mode's cluster up for trials trials per client.
type blockRun struct {
	Mode   string
	Trials int
}

// blockSchedule is the order of a failover run in blocks: the modes in turn, each block
// size trials per client (the last ones fewer when size does not divide trials), until every
// mode has had trials.
func blockSchedule(modes []string, trials, size int) []blockRun {
	var out []blockRun
	for done := 0; done < trials && size > 0; done += size {
		for _, m := range modes {
			out = append(out, blockRun{Mode: m, Trials: min(size, trials-done)})
		}
	}
	return out
}

// failoverBlocks runs the trials of one election timeout in blocks (blockSchedule): only the
// measured mode's cluster is up, so no mode's failovers carry another cluster's heartbeats
// and fsyncs. fs gives the Failover a mode's trials with a client go to.
func (o *Options) failoverBlocks(ctx context.Context, electionTicks int, fs func(mode, client string) *Failover) ([]FailoverBlock, error) {
	var blocks []FailoverBlock
	trial := map[string]int{}
	for i, b := range blockSchedule(o.Modes, o.Trials, o.FailoverBlock) {
		fb := FailoverBlock{Block: i, Offload: b.Mode, ElectionTicks: electionTicks,
			ElectionTimeoutMs: o.electionMs(b.Mode, electionTicks), LoadStart: bench.LoadAvg()}
		start := time.Now()
		name := fmt.Sprintf("rbf%d", electionTicks)
		c, err := o.cluster(ctx, name, o.Nodes, electionTicks, b.Mode)
		if err != nil {
			return blocks, err
		}
		fb.UpMs = ms(time.Since(start))
		before := map[string][2]int{}
		for _, cli := range o.failoverClients() {
			f := fs(b.Mode, cli)
			before[cli] = [2]int{len(f.FailoverMs), f.Failed}
		}
		for n := 0; n < b.Trials && err == nil; n++ {
			for _, cli := range o.failoverClients() {
				if err = o.failoverTrial(ctx, c, fs(b.Mode, cli), trial[b.Mode]); err != nil {
					err = fmt.Errorf("offload %s, client %s, block %d: %w", b.Mode, cli, i, err)
					break
				}
			}
			trial[b.Mode]++
		}
		// Stopped completely before the next block: Close waits for every node's exit and
		// removes the lab's namespaces; the data go with the directory.
		err = errors.Join(err, c.Close(), os.RemoveAll(c.Spec.Dir))
		fb.LoadEnd = bench.LoadAvg()
		for _, cli := range o.failoverClients() {
			f := fs(b.Mode, cli)
			bc := BlockClient{Client: cli, FailoverMs: slices.Clone(f.FailoverMs[before[cli][0]:]), Failed: f.Failed - before[cli][1]}
			if s := slices.Sorted(slices.Values(bc.FailoverMs)); len(s) > 0 {
				bc.P50Ms, bc.P99Ms, bc.MaxMs = bench.Percentile(s, 50), bench.Percentile(s, 99), s[len(s)-1]
			}
			fb.Clients = append(fb.Clients, bc)
		}
		blocks = append(blocks, fb)
		o.logf("failover, election %d ticks: block %d (%s, %d trials per client) done, load %v", electionTicks, i, b.Mode, b.Trials, fb.LoadEnd)
		if err != nil {
			return blocks, err
		}
	}
	return blocks, nil
}

func (o *Options) failoverClients() []string {
	if len(o.FailoverClients) == 0 {
		return []string{ClientLeader}
	}
	return o.FailoverClients
}

// attempt is the uninformed clients' bound on a write to the leader they knew: how long
// they wait before taking the silence for a dead leader. A write to a leader they have
// learned of since is bounded by leaderAttempt instead.
func (o *Options) attempt(electionTicks int) time.Duration {
	if o.FailoverAttempt > 0 {
		return o.FailoverAttempt
	}
	return max(time.Duration(electionTicks)*o.Tick, 10*time.Millisecond)
}

func collect(fs []*Failover) []Failover {
	var out []Failover
	for _, f := range fs {
		s := slices.Clone(f.FailoverMs)
		slices.Sort(s)
		if len(s) > 0 {
			f.P50Ms, f.P99Ms, f.MaxMs = bench.Percentile(s, 50), bench.Percentile(s, 99), s[len(s)-1]
		}
		if len(f.Phases) > 0 {
			f.PhaseStats = phaseStats(f.Phases)
		}
		out = append(out, *f)
	}
	return out
}

// failoverTrial kills c's leader and times the first write acknowledged by a survivor, then
// (kedge) splits that time into phases from the survivors' election records (GET /v1/events:
// the nodes and this process share CLOCK_MONOTONIC).
func (o *Options) failoverTrial(ctx context.Context, c *raftlab.Cluster, f *Failover, trial int) error {
	cl := raftlab.NewClient(c.Client, 5*time.Second)
	defer cl.Close()
	leader, err := stableLeader(ctx, c)
	if err != nil {
		return err
	}
	st, err := c.Status(ctx, leader)
	if err != nil {
		return err
	}
	var survivors, all []int
	for _, n := range c.Nodes {
		all = append(all, n.ID)
		if n.ID != leader {
			survivors = append(survivors, n.ID)
		}
	}
	attempt := o.attempt(f.ElectionTicks)
	// The client, and one write through it before the kill: the path works, and its
	// connections are open as a running client's would be.
	var write func(limit time.Duration) written
	pre := fmt.Sprintf("pre%d", trial)
	key := fmt.Sprintf("post%d", trial)
	switch {
	case c.Spec.Etcd():
		// etcd's client: the survivors (told), or every node (not told), as endpoints.
		eps := survivors
		if f.Client == ClientUninformed {
			eps = all
		}
		w, err := c.NewWriter(eps, time.Second)
		if err != nil {
			return err
		}
		defer w.Close()
		if wr := putUntil(ctx, w, pre, 5*time.Second, time.Second); wr.ackNs == 0 {
			return errors.New("no write succeeded before the kill")
		}
		write = func(limit time.Duration) written {
			return firstWriteEtcd(ctx, c, w, eps, st.Term, key, limit, attempt, f.Client != ClientUninformed)
		}
	case f.Client == ClientUninformed:
		if w := firstWriteUninformed(ctx, c, cl, all, leader, st.Term, pre, 5*time.Second, time.Second); w.ackNs == 0 {
			return errors.New("no write succeeded before the kill")
		}
		write = func(limit time.Duration) written {
			return firstWriteUninformed(ctx, c, cl, all, leader, st.Term, key, limit, attempt)
		}
	default:
		if w := firstWriteRetry(ctx, c, cl, survivors, pre, 5*time.Second); w.ackNs == 0 {
			return errors.New("no write succeeded before the kill")
		}
		write = func(limit time.Duration) written {
			if f.Client == ClientRetry {
				return firstWriteRetry(ctx, c, cl, survivors, key, limit)
			}
			return firstWriteLeader(ctx, c, cl, survivors, st.Term, key, limit)
		}
	}
	// The client starts with the SIGKILL: Kill also waits for the exit and removes what
	// the dead node left (its pacer's namespace, tens of ms), which no client waits for.
	killed := make(chan error, 1)
	killNs := int64(offload.Monotonic())
	go func() { killed <- c.Kill(leader) }()
	w := write(10 * time.Second)
	if err := <-killed; err != nil {
		return err
	}
	if w.ackNs == 0 {
		f.Failed++
	} else {
		f.FailoverMs = append(f.FailoverMs, float64(w.ackNs-killNs)/1e6)
		if !c.Spec.Etcd() { // etcd keeps no election record
			ph, err := phases(ctx, c, cl, survivors, st.Term, killNs, w)
			if err != nil {
				return err
			}
			f.Phases = append(f.Phases, ph)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return o.restart(rctx, c, leader)
}

// written is what the failover client saw (CLOCK_MONOTONIC ns; ackNs 0: no write acknowledged).
type written struct {
	foundNs, ackNs int64
	attempts       int
}

// putUntil puts key through w until a put is acknowledged (each attempt at most attempt
// long) or limit passes: etcd's client, retried as an application retries it.
func putUntil(ctx context.Context, w raftlab.Writer, key string, limit, attempt time.Duration) written {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var wr written
	for i := 0; ctx.Err() == nil; i++ {
		actx, acancel := context.WithTimeout(ctx, attempt)
		_, err := w.Put(actx, "bench/"+key, fmt.Sprint(i))
		acancel()
		wr.attempts++
		if err == nil {
			wr.ackNs = int64(offload.Monotonic())
			return wr
		}
		if actx.Err() == nil { // refused at once: do not spin on it
			time.Sleep(time.Millisecond) // pacing retries against a refusing cluster
		}
	}
	return written{}
}

// tryPut is one write attempt of an uninformed or etcd failover client: put, bounded by
// bound, counted in w; true when it was acknowledged (w.ackNs set). A write to a leader the
// client has learned of since the kill (bound leaderAttempt) that was refused at once is
// paced, so that the client does not spin on a node that refuses.
func (w *written) tryPut(ctx context.Context, bound time.Duration, put func(context.Context) error) bool {
	actx, cancel := context.WithTimeout(ctx, bound)
	err := put(actx)
	refused := actx.Err() == nil
	cancel()
	w.attempts++
	if err == nil {
		w.ackNs = int64(offload.Monotonic())
		return true
	}
	if bound == leaderAttempt && refused {
		time.Sleep(time.Millisecond) // pacing retries against a refusing node
	}
	return false
}

// leaderAttempt bounds a failover client's write to a leader it has learned of since the
// kill (every client, both systems): that leader is alive and answers once the write is
// committed, so the write is waited for, as an application's client waits for an in-flight
// request, not abandoned and sent again.
const leaderAttempt = time.Second

// firstWriteUninformed is kedge's client that was not told which node died: it writes to
// the leader it knew (leader, of term) and, when that write fails - refused, reset, or not
// answered within attempt -, asks every node at once for a leader of a newer term than the
// one it knew (GET /v1/leader, kedge's leader hint) and writes there, that write bounded by
// leaderAttempt.
func firstWriteUninformed(ctx context.Context, c *raftlab.Cluster, cl *client.Client, all []int, leader int, term uint64, key string, limit, attempt time.Duration) written {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	everyone := &client.Client{HTTP: cl.HTTP}
	for _, id := range all {
		everyone.Endpoints = append(everyone.Endpoints, c.Node(id).ClientAddr.String())
	}
	to, bound := c.Node(leader).ClientAddr.String(), attempt
	var w written
	for i := 0; ctx.Err() == nil; i++ {
		if w.tryPut(ctx, bound, func(actx context.Context) error {
			_, err := cl.At(to).Put(actx, "bench/"+key, fmt.Sprint(i))
			return err
		}) {
			return w
		}
		l, err := everyone.LeaderAfter(ctx, term)
		if err != nil {
			return written{}
		}
		if w.foundNs == 0 {
			w.foundNs = int64(offload.Monotonic())
		}
		to, term, bound = l.Client, l.Term-1, leaderAttempt // a failed write there asks for a leader after it
	}
	return written{}
}

// firstWriteEtcd is etcd's client in a failover trial, with the rules of kedge's: told
// (informed), it first finds a leader of a term above term, as kedge's leader client does;
// not told, it puts through its balancer with the attempt bound first and looks for a new
// leader when that fails. Either way the puts after a new leader is known are bounded by
// leaderAttempt. etcd's client learns of a leader from no answer (and a put through a
// follower whose leader died is lost until etcd's request timeout, seconds): it asks the
// endpoints' Maintenance.Status every millisecond until one names a leader of a newer term
// (etcdLeaderAfter), as kedge's asks GET /v1/leader.
func firstWriteEtcd(ctx context.Context, c *raftlab.Cluster, w raftlab.Writer, eps []int, term uint64, key string, limit, attempt time.Duration, informed bool) written {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var wr written
	bound := attempt
	for i := 0; ctx.Err() == nil; i++ {
		if bound == attempt && (informed || i > 0) {
			if err := etcdLeaderAfter(ctx, c, eps, term, attempt); err != nil {
				return written{}
			}
			if wr.foundNs == 0 {
				wr.foundNs = int64(offload.Monotonic())
			}
			bound = leaderAttempt
		}
		if wr.tryPut(ctx, bound, func(actx context.Context) error {
			_, err := w.Put(actx, "bench/"+key, fmt.Sprint(i))
			return err
		}) {
			return wr
		}
	}
	return written{}
}

// etcdLeaderAfter returns when one of the etcd nodes eps names a leader of a term above
// term: each is asked on the harness's connection to it (Maintenance.Status, each call
// bounded by attempt; a dead node's fails at once) every millisecond, all at once.
func etcdLeaderAfter(ctx context.Context, c *raftlab.Cluster, eps []int, term uint64, attempt time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	found := make(chan struct{}, len(eps))
	for _, id := range eps {
		go func() {
			for ctx.Err() == nil {
				sctx, scancel := context.WithTimeout(ctx, attempt)
				st, err := c.Status(sctx, id)
				scancel()
				if err == nil && st.Leader != 0 && st.Term > term {
					found <- struct{}{}
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	select {
	case <-found:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// firstWriteLeader asks every survivor at once for a leader of a term above oldTerm (each
// answers as soon as it knows one) and puts key to it; a failed put asks again.
func firstWriteLeader(ctx context.Context, c *raftlab.Cluster, cl *client.Client, via []int, oldTerm uint64, key string, limit time.Duration) written {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	all := &client.Client{HTTP: cl.HTTP}
	for _, id := range via {
		all.Endpoints = append(all.Endpoints, c.Node(id).ClientAddr.String())
	}
	var w written
	for i := 0; ctx.Err() == nil; i++ {
		l, err := all.LeaderAfter(ctx, oldTerm)
		if err != nil {
			return written{}
		}
		if w.foundNs == 0 {
			w.foundNs = int64(offload.Monotonic())
		}
		w.attempts++
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, err = cl.At(l.Client).Put(actx, "bench/"+key, fmt.Sprint(i))
		acancel()
		if err == nil {
			w.ackNs = int64(offload.Monotonic())
			return w
		}
	}
	return written{}
}

// firstWriteRetry puts key through the survivors in turn (50 ms per attempt) until one is
// acknowledged (ClientRetry).
func firstWriteRetry(ctx context.Context, c *raftlab.Cluster, cl *client.Client, via []int, key string, limit time.Duration) written {
	start := time.Now()
	var w written
	for i := 0; time.Since(start) < limit && ctx.Err() == nil; i++ {
		op := raftlab.Op{Kind: raftlab.Put, Key: "bench/" + key, Value: fmt.Sprint(i)}
		actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		raftlab.Do(actx, cl, c.Node(via[i%len(via)]).ClientAddr, &op)
		cancel()
		w.attempts++
		if op.Out.Err == "" && !op.Out.Unknown {
			w.ackNs = int64(offload.Monotonic())
			return w
		}
		if !op.Out.Unknown { // refused at once (no leader yet): do not spin on it
			time.Sleep(time.Millisecond) // pacing retries against a refusing node
		}
	}
	return written{}
}

// Phase is one failover trial split at the events of the survivors' election records, in
// ms after the kill (-1: not seen). Detect is the first survivor that noticed the silence:
// the kernel's detector waking it (Source "kernel"), its transport seeing every connection
// with the leader closed ("close", pkg/raft/kernelpaths gone.go) or etcd-raft's own timer
// starting a pre-vote ("etcd-raft").
type Phase struct {
	TotalMs    float64 `json:"total_ms"`
	HeardAgeMs float64 `json:"heard_age_ms"` // how old the first detector's last message from the leader was at the kill
	DetectMs   float64 `json:"detect_ms"`
	Source     string  `json:"source"`
	// PreCandidateMs: the first detector's node started its pre-vote (its user space woke
	// on the kernel's event and ran Campaign; = DetectMs when etcd-raft's timer fired).
	PreCandidateMs float64 `json:"pre_candidate_ms"`
	CandidateMs    float64 `json:"candidate_ms"` // the winner's pre-vote quorum (its new term durable)
	TermSaveMs     float64 `json:"term_save_ms"` // of which saving its new term and own vote (fsync)
	LeaderMs       float64 `json:"leader_ms"`    // the winner's vote quorum
	CommitMs       float64 `json:"commit_ms"`    // the winner's first entry committed
	FoundMs        float64 `json:"found_ms"`     // the client knew the new leader (leader client)
	AckMs          float64 `json:"ack_ms"`       // the client's write acknowledged
	Terms          uint64  `json:"terms"`        // term increase (> 1: more than one election)
	Attempts       int     `json:"attempts"`     // client writes sent
}

// phases reads the survivors' election records since the kill and places the trial's events.
func phases(ctx context.Context, c *raftlab.Cluster, cl *client.Client, survivors []int, oldTerm uint64, killNs int64, w written) (Phase, error) {
	at := func(ns int64) float64 {
		if ns == 0 {
			return -1
		}
		return float64(ns-killNs) / 1e6
	}
	var detect, heard, cand, lead, commit, precand, save int64
	var source string
	var detector int
	var term uint64
	var winner uint64
	evs := map[int][]api.Event{}
	for _, id := range survivors {
		r, err := cl.Events(ctx, c.Node(id).ClientAddr.String(), killNs)
		if err != nil {
			return Phase{}, fmt.Errorf("events of node %d: %w", id, err)
		}
		evs[id] = r.Events
		for _, e := range r.Events {
			closed := e.Kind == api.EventDetector && strings.HasPrefix(e.Detail, kernelpaths.DetailGone)
			if (e.Kind == api.EventDetector && e.Detail == kernelpaths.DetailCampaign) || closed || e.Kind == api.EventPreCandidate {
				if detect == 0 || e.AtNs < detect {
					detect, source, heard, detector = e.AtNs, "etcd-raft", e.HeardNs, id
					switch {
					case closed:
						source = "close"
					case e.Kind == api.EventDetector:
						source = "kernel"
					}
				}
			}
			if e.Kind == api.EventLeader && e.Term > term {
				term, winner = e.Term, uint64(id)
			}
		}
	}
	for _, e := range evs[detector] {
		if e.Kind == api.EventPreCandidate && e.AtNs >= detect {
			precand = e.AtNs
			break
		}
	}
	for _, e := range evs[int(winner)] {
		switch {
		case e.Kind == api.EventCandidate && e.Term == term:
			cand, save = e.AtNs, e.SaveNs
		case e.Kind == api.EventLeader && e.Term == term:
			lead = e.AtNs
		case e.Kind == api.EventCommitted && e.Term == term:
			commit = e.AtNs
		}
	}
	p := Phase{TotalMs: at(w.ackNs), DetectMs: at(detect), Source: source, PreCandidateMs: at(precand),
		CandidateMs: at(cand), TermSaveMs: float64(save) / 1e6, LeaderMs: at(lead),
		CommitMs: at(commit), FoundMs: at(w.foundNs), AckMs: at(w.ackNs), Attempts: w.attempts, HeardAgeMs: -1}
	if heard != 0 {
		p.HeardAgeMs = float64(killNs-heard) / 1e6
	}
	if term > oldTerm {
		p.Terms = term - oldTerm
	}
	return p, nil
}

// PhaseStats are the medians and 99th percentiles of a setting's phases, each as the time
// from the previous event (the last heartbeat's age at the kill stands apart).
type PhaseStats struct {
	Name  string  `json:"name"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	N     int     `json:"n"`
}

// PhaseNames in order: kill -> detect -> wake (the detecting node's pre-vote started) ->
// pre-vote (the winner's pre-vote quorum, before its term fsync) -> term-fsync (its new term
// and own vote saved: a candidate) -> vote (its vote quorum: a leader) -> commit (the leader's
// first entry) -> client (the client's write acknowledged).
var PhaseNames = []string{"heard-age", "detect", "wake", "pre-vote", "term-fsync", "vote", "commit", "client"}

func phaseStats(ps []Phase) []PhaseStats {
	vals := make([][]float64, len(PhaseNames))
	for _, p := range ps {
		// Records without the wake split (pre_candidate_ms -1, or older records: 0) put the
		// whole of detect -> candidate under pre-vote.
		pre := p.PreCandidateMs
		if pre < p.DetectMs || pre > p.CandidateMs {
			pre = p.DetectMs
		}
		quorum := p.CandidateMs - p.TermSaveMs
		steps := []float64{p.HeardAgeMs, p.DetectMs, pre - p.DetectMs, quorum - pre, p.TermSaveMs, p.LeaderMs - p.CandidateMs,
			p.CommitMs - p.LeaderMs, p.AckMs - p.CommitMs}
		ok := []bool{p.HeardAgeMs >= 0, p.DetectMs >= 0, p.CandidateMs >= 0 && p.DetectMs >= 0, p.CandidateMs >= 0 && p.DetectMs >= 0,
			p.CandidateMs >= 0, p.LeaderMs >= 0 && p.CandidateMs >= 0, p.CommitMs >= 0 && p.LeaderMs >= 0, p.AckMs >= 0 && p.CommitMs >= 0}
		for i := range steps {
			if ok[i] {
				vals[i] = append(vals[i], steps[i])
			}
		}
	}
	var out []PhaseStats
	for i, name := range PhaseNames {
		s := slices.Clone(vals[i])
		slices.Sort(s)
		st := PhaseStats{Name: name, N: len(s)}
		if len(s) > 0 {
			st.P50Ms, st.P99Ms = bench.Percentile(s, 50), bench.Percentile(s, 99)
		}
		out = append(out, st)
	}
	return out
}
