package raftlab

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
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// Status is the part of a node's GET /v1/status (docs/raft.md section 2) the lab uses.
type Status struct {
	ID               uint64   `json:"id"`
	State            string   `json:"state"`
	Leader           uint64   `json:"leader"`
	Term             uint64   `json:"term"`
	Commit           uint64   `json:"commit"`
	Applied          uint64   `json:"applied"`
	LastHeartbeatMs  *float64 `json:"last_heartbeat_ms"`
	UnsafeLocalReads bool     `json:"unsafe_local_reads"`
	Offload          string   `json:"offload"` // the follower kernel path, "" when off
}

type kvResponse struct {
	OK      bool   `json:"ok"`
	Found   bool   `json:"found"`
	Value   string `json:"value"`
	Error   string `json:"error"`
	Outcome string `json:"outcome"`
}

// Client talks to the nodes' HTTP/JSON API from inside a lab host (its sockets are opened
// in that host's namespace, so client traffic crosses the fabric like any other).
type Client struct {
	http *http.Client
}

// NewClient returns a client whose connections start in host h; timeout bounds each request.
func NewClient(h *lab.Host, timeout time.Duration) *Client {
	d := &net.Dialer{Timeout: timeout}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = h.Do(func() error { c, err = d.DialContext(ctx, network, addr); return err })
			return c, err
		},
		MaxIdleConnsPerHost: 4,
		DisableCompression:  true,
	}
	return &Client{http: &http.Client{Transport: tr, Timeout: timeout}}
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Status asks one node.
func (c *Client) Status(ctx context.Context, node netip.AddrPort) (Status, error) {
	var st Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+node.String()+"/v1/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return st, fmt.Errorf("status of %s: %w", node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status of %s: HTTP %d", node, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("decode status of %s: %w", node, err)
	}
	return st, nil
}

// Metric sums the samples of the Prometheus metric name on node whose labels contain every
// one of labels (`key="value"`).
func (c *Client) Metric(ctx context.Context, node netip.AddrPort, name string, labels ...string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+node.String()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("metrics of %s: %w", node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics of %s: HTTP %d", node, resp.StatusCode)
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
			return 0, fmt.Errorf("metrics of %s: line %q: %w", node, line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// Do runs op against node and fills op.Out. Outcome rules (docs/raft.md section 2):
// 200 is a result; 4xx, 503 and a connection that could not be made mean the operation
// did not take effect (Err); 504 (or "outcome":"unknown", or another 5xx), a timeout or a
// connection broken after the request was sent mean it may have (Unknown).
func (c *Client) Do(ctx context.Context, node netip.AddrPort, op *Op) {
	base := "http://" + node.String()
	key := url.PathEscape(op.Key)
	var (
		method, path string
		body         any
	)
	switch op.Kind {
	case Get:
		method, path = http.MethodGet, "/v1/kv/"+key
	case Put:
		method, path, body = http.MethodPut, "/v1/kv/"+key, map[string]string{"value": op.Value}
	case Del:
		method, path = http.MethodDelete, "/v1/kv/"+key
	case CAS:
		method, path = http.MethodPost, "/v1/cas/"+key
		body = map[string]any{"expect": op.Expect, "expect_absent": op.ExpectAbsent, "value": op.Value}
	default:
		op.Out = Out{Err: fmt.Sprintf("unknown op kind %q", op.Kind)}
		return
	}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		op.Out = Out{Err: err.Error()}
		return
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" {
			op.Out = Out{Err: err.Error()} // never reached the node
			return
		}
		op.Out = Out{Unknown: true, Err: err.Error()}
		return
	}
	defer resp.Body.Close()
	var r kvResponse
	derr := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&r)
	switch {
	case resp.StatusCode == http.StatusOK && derr == nil:
		op.Out = Out{OK: r.OK, Found: r.Found, Value: r.Value}
		if op.Kind == Get {
			op.Out.OK = false
		}
	case resp.StatusCode == http.StatusOK:
		op.Out = Out{Unknown: true, Err: fmt.Sprintf("decode response: %v", derr)}
	case r.Outcome == "unknown" || resp.StatusCode == http.StatusGatewayTimeout ||
		(resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable):
		op.Out = Out{Unknown: true, Err: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, r.Error)}
	default:
		op.Out = Out{Err: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, r.Error)}
	}
}
