package node

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	term, commit, applied, isLeader prometheus.Gauge
	leaderChanges, snapshots        prometheus.Counter
	proposals, reads                *prometheus.CounterVec
	fsync                           prometheus.Histogram
}

func newMetrics(reg *prometheus.Registry) *metrics {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "kedge", Subsystem: "raft", Name: name, Help: help}
	}
	m := &metrics{
		term:          prometheus.NewGauge(prometheus.GaugeOpts(o("term", "Current raft term (durable)."))),
		commit:        prometheus.NewGauge(prometheus.GaugeOpts(o("commit_index", "Commit index (durable)."))),
		applied:       prometheus.NewGauge(prometheus.GaugeOpts(o("applied_index", "Last index applied to the key-value map."))),
		isLeader:      prometheus.NewGauge(prometheus.GaugeOpts(o("is_leader", "1 while this node leads."))),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts(o("leader_changes_total", "Leader changes seen by this node."))),
		snapshots:     prometheus.NewCounter(prometheus.CounterOpts(o("snapshots_total", "Snapshots taken by this node."))),
		proposals:     prometheus.NewCounterVec(prometheus.CounterOpts(o("proposals_total", "Client writes by result (ok, no_leader, timeout).")), []string{"result"}),
		reads:         prometheus.NewCounterVec(prometheus.CounterOpts(o("reads_total", "Client reads by result (ok, no_leader, timeout, unsafe_local).")), []string{"result"}),
		fsync: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kedge", Subsystem: "raft", Name: "wal_fsync_seconds",
			Help: "Duration of WAL fsyncs.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
	}
	reg.MustRegister(m.term, m.commit, m.applied, m.isLeader, m.leaderChanges, m.snapshots, m.proposals, m.reads, m.fsync)
	return m
}

// raftLogger sends etcd-raft's log to slog.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...any)              { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Debugf(f string, v ...any)   { r.l.Debug(fmt.Sprintf(f, v...)) }
func (r raftLogger) Info(v ...any)               { r.l.Info(fmt.Sprint(v...)) }
func (r raftLogger) Infof(f string, v ...any)    { r.l.Info(fmt.Sprintf(f, v...)) }
func (r raftLogger) Warning(v ...any)            { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(f string, v ...any) { r.l.Warn(fmt.Sprintf(f, v...)) }
func (r raftLogger) Error(v ...any)              { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(f string, v ...any)   { r.l.Error(fmt.Sprintf(f, v...)) }
func (r raftLogger) Fatal(v ...any)              { r.Panic(v...) }
func (r raftLogger) Fatalf(f string, v ...any)   { r.Panicf(f, v...) }
func (r raftLogger) Panic(v ...any)              { s := fmt.Sprint(v...); r.l.Error(s); panic(s) }
func (r raftLogger) Panicf(f string, v ...any)   { s := fmt.Sprintf(f, v...); r.l.Error(s); panic(s) }
