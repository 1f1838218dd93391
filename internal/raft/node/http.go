package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (n *Node) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/kv/{key}", n.handleGet)
	mux.HandleFunc("PUT /v1/kv/{key}", n.handlePut)
	mux.HandleFunc("DELETE /v1/kv/{key}", n.handleDelete)
	mux.HandleFunc("POST /v1/cas/{key}", n.handleCAS)
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, n.Status()) })
	mux.HandleFunc("GET /v1/events", n.handleEvents)
	mux.HandleFunc("GET /v1/leader", n.handleLeader)
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n.writeErr(w, http.StatusNotFound, fmt.Errorf("no such endpoint: %s %s", r.Method, r.URL.Path),
			"see docs/raft.md section 2 for the API", api.OutcomeNone)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (n *Node) writeErr(w http.ResponseWriter, status int, err error, hint, outcome string) {
	writeJSON(w, status, api.Error{Error: err.Error(), Hint: hint, Outcome: outcome, Leader: n.leader.Load()})
}

// fail maps a request path error to a response.
func (n *Node) fail(w http.ResponseWriter, err error, write bool) {
	switch {
	case errors.Is(err, errNoLeader):
		n.writeErr(w, http.StatusServiceUnavailable, err, "an election is running or this node is cut off: retry, or ask another node", api.OutcomeNone)
	case errors.Is(err, errTimeout):
		outcome := api.OutcomeNone
		hint := "retry"
		if write {
			outcome = api.OutcomeUnknown
			hint = "the write may still commit: read the key before retrying"
		}
		n.writeErr(w, http.StatusGatewayTimeout, err, hint, outcome)
	default:
		n.writeErr(w, http.StatusInternalServerError, err, "", api.OutcomeUnknown)
	}
}

// key validates the path's key; it answers 400 itself when the key is bad.
func (n *Node) key(w http.ResponseWriter, r *http.Request) (string, bool) {
	k := r.PathValue("key")
	if len(k) == 0 || len(k) > api.MaxKey {
		n.writeErr(w, http.StatusBadRequest, fmt.Errorf("key of %d bytes", len(k)), fmt.Sprintf("keys are 1-%d bytes", api.MaxKey), api.OutcomeNone)
		return "", false
	}
	return k, true
}

func (n *Node) body(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, api.MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		n.writeErr(w, http.StatusBadRequest, fmt.Errorf("decode body: %w", err), `send JSON, e.g. {"value":"x"}`, api.OutcomeNone)
		return false
	}
	return true
}

func (n *Node) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), n.cfg.RequestTimeout)
}

func (n *Node) valueOK(w http.ResponseWriter, v string) bool {
	if len(v) > api.MaxValue {
		n.writeErr(w, http.StatusBadRequest, fmt.Errorf("value of %d bytes", len(v)), fmt.Sprintf("values are at most %d bytes", api.MaxValue), api.OutcomeNone)
		return false
	}
	return true
}

func (n *Node) handleGet(w http.ResponseWriter, r *http.Request) {
	k, ok := n.key(w, r)
	if !ok {
		return
	}
	ctx, cancel := n.ctx(r)
	defer cancel()
	res, err := n.get(ctx, k)
	if err != nil {
		n.fail(w, err, false)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (n *Node) write(w http.ResponseWriter, r *http.Request, c *command) {
	ctx, cancel := n.ctx(r)
	defer cancel()
	res, err := n.propose(ctx, c)
	if err != nil {
		n.fail(w, err, true)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (n *Node) handlePut(w http.ResponseWriter, r *http.Request) {
	k, ok := n.key(w, r)
	var req api.PutRequest
	if !ok || !n.body(w, r, &req) || !n.valueOK(w, req.Value) {
		return
	}
	n.write(w, r, &command{Op: "put", Key: k, Value: req.Value})
}

func (n *Node) handleDelete(w http.ResponseWriter, r *http.Request) {
	if k, ok := n.key(w, r); ok {
		n.write(w, r, &command{Op: "del", Key: k})
	}
}

func (n *Node) handleCAS(w http.ResponseWriter, r *http.Request) {
	k, ok := n.key(w, r)
	var req api.CASRequest
	if !ok || !n.body(w, r, &req) || !n.valueOK(w, req.Value) {
		return
	}
	n.write(w, r, &command{Op: "cas", Key: k, Value: req.Value, Expect: req.Expect, ExpectAbsent: req.ExpectAbsent})
}
