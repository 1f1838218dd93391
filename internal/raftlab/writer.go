package raftlab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kedge-dev/kedge/internal/raft/client"
)

// Writer is one closed-loop client of a benchmark: kedge raft's own HTTP client for a kedge
// cluster, etcd's Go client (clientv3) for an etcd cluster, each as an application would
// use it. With one endpoint every request goes to that node; with several they are spread
// over them in turn (etcd's client balances round robin; a follower forwards a write to the
// leader in both systems).
type Writer interface {
	// Put writes key=value; unknown says a failed write may still take effect (a timeout,
	// a connection broken after the request went out).
	Put(ctx context.Context, key, value string) (unknown bool, err error)
	Close() error
}

// NewWriter returns a writer to the nodes ids (at least one) that dials from the lab's
// client host; timeout bounds each request of a kedge writer and each dial.
func (c *Cluster) NewWriter(ids []int, timeout time.Duration) (Writer, error) {
	var addrs []netip.AddrPort
	for _, id := range ids {
		n := c.Node(id)
		if n == nil {
			return nil, fmt.Errorf("no node %d", id)
		}
		addrs = append(addrs, n.ClientAddr)
	}
	if len(addrs) == 0 {
		return nil, errors.New("a writer needs a node")
	}
	if c.Spec.Etcd() {
		cl, err := NewEtcdClient(c.Client, addrs, timeout)
		if err != nil {
			return nil, fmt.Errorf("etcd client: %w", err)
		}
		return etcdWriter{cl}, nil
	}
	return &kedgeWriter{cl: NewClient(c.Client, timeout), addrs: addrs}, nil
}

type kedgeWriter struct {
	cl    *client.Client
	addrs []netip.AddrPort
	next  int
}

func (w *kedgeWriter) Put(ctx context.Context, key, value string) (bool, error) {
	op := Op{Kind: Put, Key: key, Value: value}
	Do(ctx, w.cl, w.addrs[w.next%len(w.addrs)], &op)
	w.next++
	if op.Out.Err != "" || op.Out.Unknown {
		return op.Out.Unknown, errors.New(op.Out.Err)
	}
	return false, nil
}

func (w *kedgeWriter) Close() error { w.cl.Close(); return nil }

type etcdWriter struct{ cl *clientv3.Client }

func (w etcdWriter) Put(ctx context.Context, key, value string) (bool, error) {
	_, err := w.cl.Put(ctx, key, value)
	if err == nil {
		return false, nil
	}
	unknown := errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
	return unknown, err
}

func (w etcdWriter) Close() error { return w.cl.Close() }
