// Package client is the Go client of kedge raft's HTTP/JSON API (docs/raft.md section 2),
// used by `kedge raft kv|status`, by the lab's checker and by `kedge bench raft` (the one
// HTTP client of kedge raft). A Client with one endpoint talks to that node only; with
// several it moves to the next on a refused connection or a 503, and with Retry it starts
// over until its context ends. LeaderAfter finds a new leader by asking every endpoint at once.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
)

// Client talks to a cluster through its nodes' client addresses (host:port).
type Client struct {
	Endpoints []string
	HTTP      *http.Client // nil: a client with a 10 s timeout
	// Retry: when every endpoint refused the connection or answered 503 (no leader known:
	// nothing was applied), ask them all again after a pause (RetryMin, doubling up to 1 s)
	// until the request's context ends, as an etcd client does during an election. Off, the
	// last endpoint's answer is returned at once.
	Retry bool
}

// RetryMin is the first pause of a Client with Retry between two rounds over its endpoints.
const RetryMin = 50 * time.Millisecond

// retryMax caps the pause between rounds.
const retryMax = time.Second

// Error is a failed request. Outcome says what a failed write did: api.OutcomeNone (not
// applied) or api.OutcomeUnknown (may still commit: a timeout or a broken connection).
type Error struct {
	Endpoint string
	Status   int // 0: no HTTP response
	Outcome  string
	Msg      string
	Hint     string
	Leader   uint64
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s", e.Endpoint, e.Msg)
	if e.Status != 0 {
		s = fmt.Sprintf("%s: %d %s", e.Endpoint, e.Status, e.Msg)
	}
	if e.Outcome == api.OutcomeUnknown {
		s += " (outcome unknown)"
	}
	if e.Hint != "" {
		s += " - " + e.Hint
	}
	return s
}

// Unknown reports whether err is a write whose outcome is unknown.
func Unknown(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Outcome == api.OutcomeUnknown
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 10 * time.Second}
}

// do sends the request to each endpoint in turn until one answers with something other
// than a refused connection or a 503; out receives a 200's body.
func (c *Client) do(ctx context.Context, method, path string, body, out any, write bool) error {
	if len(c.Endpoints) == 0 {
		return errors.New("no endpoints (give --endpoints or --config)")
	}
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
	}
	pause := RetryMin
	var last error
	for rounds := 1; ; rounds++ {
		for _, ep := range c.Endpoints {
			err := c.once(ctx, ep, method, path, b, out, write)
			var e *Error
			if err == nil || !errors.As(err, &e) || !(e.Status == http.StatusServiceUnavailable || e.Status == 0 && e.Outcome == api.OutcomeNone) {
				return err
			}
			if last != nil && ctx.Err() != nil {
				// The deadline cut this attempt short: the last answer (a 503) says more
				// than the cut does, and the deadline is reported beside it below.
				break
			}
			last = err
		}
		if !c.Retry {
			return last
		}
		select {
		case <-ctx.Done():
			times := fmt.Sprintf("%d times", rounds)
			if rounds == 1 {
				times = "once"
			}
			return fmt.Errorf("%w (asked every endpoint %s, until %w)", last, times, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, retryMax)
	}
}

func (c *Client) once(ctx context.Context, ep, method, path string, body []byte, out any, write bool) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+ep+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http().Do(req)
	if err != nil {
		// A refused dial never reached the node; anything later may have.
		outcome := api.OutcomeNone
		var op *net.OpError
		if write && !(errors.As(err, &op) && op.Op == "dial") {
			outcome = api.OutcomeUnknown
		}
		return &Error{Endpoint: ep, Outcome: outcome, Msg: err.Error()}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, api.MaxBody+1<<20))
	if err != nil {
		outcome := api.OutcomeNone
		if write {
			outcome = api.OutcomeUnknown
		}
		return &Error{Endpoint: ep, Status: resp.StatusCode, Outcome: outcome, Msg: "read response: " + err.Error()}
	}
	if resp.StatusCode != http.StatusOK {
		var ae api.Error
		if json.Unmarshal(data, &ae) != nil || ae.Error == "" {
			// Not the node's own error body: a 5xx other than 503 may come after the write
			// was proposed (a proxy, a crash mid-request).
			ae = api.Error{Error: http.StatusText(resp.StatusCode), Outcome: api.OutcomeNone}
			if write && resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
				ae.Outcome = api.OutcomeUnknown
			}
		}
		if write && resp.StatusCode == http.StatusGatewayTimeout {
			ae.Outcome = api.OutcomeUnknown
		}
		return &Error{Endpoint: ep, Status: resp.StatusCode, Outcome: ae.Outcome, Msg: ae.Error, Hint: ae.Hint, Leader: ae.Leader}
	}
	if err := json.Unmarshal(data, out); err != nil {
		outcome := api.OutcomeNone
		if write { // the node answered 200: the write applied, but we cannot read what it said
			outcome = api.OutcomeUnknown
		}
		return &Error{Endpoint: ep, Status: resp.StatusCode, Outcome: outcome, Msg: "decode response: " + err.Error()}
	}
	return nil
}

// Close drops idle connections.
func (c *Client) Close() {
	if c.HTTP != nil {
		c.HTTP.CloseIdleConnections()
	}
}

// At is a client of the one node ep, sharing c's HTTP client.
func (c *Client) At(ep string) *Client { return &Client{Endpoints: []string{ep}, HTTP: c.HTTP} }

func kvPath(prefix, key string) string { return prefix + url.PathEscape(key) }

// Get is a linearizable read.
func (c *Client) Get(ctx context.Context, key string) (api.GetResponse, error) {
	var r api.GetResponse
	err := c.do(ctx, http.MethodGet, kvPath("/v1/kv/", key), nil, &r, false)
	return r, err
}

// Put writes key=value.
func (c *Client) Put(ctx context.Context, key, value string) (api.WriteResponse, error) {
	var r api.WriteResponse
	err := c.do(ctx, http.MethodPut, kvPath("/v1/kv/", key), api.PutRequest{Value: value}, &r, true)
	return r, err
}

// Delete removes key.
func (c *Client) Delete(ctx context.Context, key string) (api.WriteResponse, error) {
	var r api.WriteResponse
	err := c.do(ctx, http.MethodDelete, kvPath("/v1/kv/", key), nil, &r, true)
	return r, err
}

// CAS sets key to value if its current value is expect (or, with expectAbsent, if it does
// not exist). The response's OK says whether it swapped.
func (c *Client) CAS(ctx context.Context, key, expect string, expectAbsent bool, value string) (api.WriteResponse, error) {
	var r api.WriteResponse
	err := c.do(ctx, http.MethodPost, kvPath("/v1/cas/", key), api.CASRequest{Expect: expect, ExpectAbsent: expectAbsent, Value: value}, &r, true)
	return r, err
}

// Status asks one node for its status.
func (c *Client) Status(ctx context.Context, endpoint string) (api.Status, error) {
	var s api.Status
	err := c.once(ctx, endpoint, http.MethodGet, "/v1/status", nil, &s, false)
	return s, err
}

// Events reads node endpoint's election record after sinceNs (CLOCK_MONOTONIC ns).
func (c *Client) Events(ctx context.Context, endpoint string, sinceNs int64) (api.Events, error) {
	var ev api.Events
	err := c.once(ctx, endpoint, http.MethodGet, "/v1/events?since_ns="+strconv.FormatInt(sinceNs, 10), nil, &ev, false)
	return ev, err
}

// LeaderAfter asks every endpoint at once to name a leader of a term above afterTerm (each
// node answers as soon as it knows one: GET /v1/leader long-polls) and returns the first
// answer that does. It asks again until ctx ends; unreachable endpoints are skipped.
func (c *Client) LeaderAfter(ctx context.Context, afterTerm uint64) (api.Leader, error) {
	if len(c.Endpoints) == 0 {
		return api.Leader{}, errors.New("no endpoints (give --endpoints or --config)")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const wait = time.Second
	path := fmt.Sprintf("/v1/leader?after_term=%d&wait=%v", afterTerm, wait)
	found := make(chan api.Leader, len(c.Endpoints))
	for _, ep := range c.Endpoints {
		go func() {
			for ctx.Err() == nil {
				var l api.Leader
				err := c.once(ctx, ep, http.MethodGet, path, nil, &l, false)
				if err == nil && l.Leader != 0 && l.Term > afterTerm {
					found <- l
					return
				}
				if err != nil { // a dead node refuses at once: do not spin on it
					select {
					case <-ctx.Done():
					case <-time.After(wait): // this endpoint's next try
					}
				}
			}
		}()
	}
	select {
	case l := <-found:
		return l, nil
	case <-ctx.Done():
		return api.Leader{}, fmt.Errorf("find a leader after term %d: %w", afterTerm, ctx.Err())
	}
}

// Metric sums the samples of the Prometheus metric name on node endpoint whose labels
// contain every one of labels (`key="value"`).
func (c *Client) Metric(ctx context.Context, endpoint, name string, labels ...string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return 0, fmt.Errorf("metrics of %s: %w", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics of %s: HTTP %d", endpoint, resp.StatusCode)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		for _, l := range labels {
			ok = ok && strings.Contains(rest, l)
		}
		f := strings.Fields(rest)
		if !ok || len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics of %s: line %q: %w", endpoint, line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}
