package raftlab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/client"
)

// Status is a node's GET /v1/status (docs/raft.md section 2).
type Status = api.Status

// NewClient returns kedge raft's client (internal/raft/client) whose connections start in lab
// host h, so client traffic crosses the fabric like any other; timeout bounds each request.
// It has no endpoints: use At, or the node address arguments.
func NewClient(h *lab.Host, timeout time.Duration) *client.Client {
	d := &net.Dialer{Timeout: timeout}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = h.Do(func() error { c, err = d.DialContext(ctx, network, addr); return err })
			return c, err
		},
		MaxIdleConnsPerHost: 4,
		DisableCompression:  true,
	}
	return &client.Client{HTTP: &http.Client{Transport: tr, Timeout: timeout}}
}

// Do runs op against node and fills op.Out. Outcome rules (docs/raft.md section 2, the
// client's Error.Outcome): 200 is a result; 4xx, 503 and a connection that could not be
// made mean the operation did not take effect (Err); 504, another 5xx, a timeout or a
// connection broken after the request was sent mean it may have (Unknown).
func Do(ctx context.Context, cl *client.Client, node netip.AddrPort, op *Op) {
	c := cl.At(node.String())
	var (
		w   api.WriteResponse
		err error
	)
	switch op.Kind {
	case Get:
		var r api.GetResponse
		if r, err = c.Get(ctx, op.Key); err == nil {
			op.Out = Out{Found: r.Found, Value: r.Value}
			return
		}
	case Put:
		w, err = c.Put(ctx, op.Key, op.Value)
	case Del:
		w, err = c.Delete(ctx, op.Key)
	case CAS:
		w, err = c.CAS(ctx, op.Key, op.Expect, op.ExpectAbsent, op.Value)
	default:
		op.Out = Out{Err: fmt.Sprintf("unknown op kind %q", op.Kind)}
		return
	}
	switch {
	case err == nil:
		op.Out = Out{OK: w.OK, Found: w.Found, Value: w.Value}
	case client.Unknown(err):
		op.Out = Out{Unknown: true, Err: err.Error()}
	default:
		op.Out = Out{Err: err.Error()}
	}
}
