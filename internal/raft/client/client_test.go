package client

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
)

// node answers 503 (no leader known) to its first noLeader requests, then 200.
func node(t *testing.T, noLeader int32) (addr string, asked *atomic.Int32) {
	return holdingNode(t, noLeader, 1<<30)
}

// holdingNode is node that holds every request after the first answered ones until the
// client gives up (a node too slow to answer before the deadline).
func holdingNode(t *testing.T, noLeader, answered int32) (addr string, asked *atomic.Int32) {
	t.Helper()
	asked = new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := asked.Add(1)
		if n > answered {
			<-r.Context().Done()
			return
		}
		if n <= noLeader {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(api.Error{Error: "no leader known", Outcome: api.OutcomeNone})
			return
		}
		json.NewEncoder(w).Encode(api.WriteResponse{OK: true, Index: 7})
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), asked
}

// refusing returns an address nothing listens on.
func refusing(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestRetry: with Retry a write asked while no node knows a leader (503s, a refused
// connection) is asked again until it is answered; without, the last answer is returned.
func TestRetry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	a, askedA := node(t, 3)
	c := &Client{Endpoints: []string{refusing(t), a}, Retry: true}
	r, err := c.Put(ctx, "k", "v")
	if err != nil || r.Index != 7 {
		t.Fatalf("Put with Retry: %+v, %v; want index 7 after the 503s", r, err)
	}
	if n := askedA.Load(); n != 4 {
		t.Errorf("the node was asked %d times, want 4 (3 x 503, then 200)", n)
	}

	b, askedB := node(t, 1)
	c = &Client{Endpoints: []string{b}}
	_, err = c.Put(ctx, "k", "v")
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || e.Outcome != api.OutcomeNone {
		t.Errorf("Put without Retry: %v; want the 503 at once", err)
	}
	if n := askedB.Load(); n != 1 {
		t.Errorf("without Retry the node was asked %d times, want 1", n)
	}
}

// TestRetryUntilDeadline: a cluster that never elects fails the request when its context
// ends, with the last 503, not before and not long after.
func TestRetryUntilDeadline(t *testing.T) {
	a, asked := node(t, 1<<30)
	const timeout = 400 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	_, err := (&Client{Endpoints: []string{a}, Retry: true}).Get(ctx, "k")
	took := time.Since(start)
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get: %v; want the 503 and the deadline", err)
	}
	if took < timeout {
		t.Errorf("gave up after %v, before the %v deadline", took, timeout)
	}
	// 50 + 100 + 200 ms of pauses fit in 400 ms: 4 rounds on an idle machine, 2 at least.
	if n := asked.Load(); n < 2 {
		t.Errorf("asked %d times in %v, want it asked again", n, timeout)
	}
	t.Logf("gave up after %v: %v", took, err)
}

// TestRetryDeadlineMidRequest: when the deadline ends a request in flight, the error is
// still the last answer (the 503) with the deadline beside it, not the cut request's
// transport error (an emulated matrix guest, slow enough to be cut mid-request, showed it).
func TestRetryDeadlineMidRequest(t *testing.T) {
	// The first request gets its 503, the second is held until the deadline ends it.
	a, asked := holdingNode(t, 1<<30, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	_, err := (&Client{Endpoints: []string{a}, Retry: true}).Get(ctx, "k")
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get: %v; want the 503 and the deadline", err)
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("asked %d times, want 2 (a 503, then one request the deadline cut)", n)
	}
}
