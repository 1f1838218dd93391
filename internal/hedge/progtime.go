package hedge

import (
	"fmt"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/netnsx"
)

// ProgramTimes is the kernel's own run time of the hedger's data-plane programs for one
// request that needs no hedge: hedge_split on the request (recorded, and cloned or stored,
// as the service's configuration decides) and hedge_resp on its first response.
type ProgramTimes struct {
	Requests int           // requests measured
	Split    time.Duration // mean per request
	Resp     time.Duration // mean per first response
}

// MeasurePrograms runs the attached programs of h with BPF_PROG_TEST_RUN (one run per
// packet, the kernel's timing, no bpf_stats sysctl): hedge_split on each request frame and
// hedge_resp on the response frame of the same index right after it. The frames are whole
// Ethernet frames the caller builds (a request to a service of h with a distinct request id
// each, and its response). The runs change the hedger's state as real traffic would
// (scoreboard entries, counters, a clone or a stored request per request): measure on a
// hedger whose counters no longer matter, or read them around the call. ns is the hedger's
// network namespace: the programs redirect to its devices.
func (h *Hedger) MeasurePrograms(ns netns.NsHandle, requests, responses [][]byte) (ProgramTimes, error) {
	n := len(requests)
	if n < 1 || len(responses) != n {
		return ProgramTimes{}, fmt.Errorf("measure programs: %d requests and %d responses: want as many of each, at least one", n, len(responses))
	}
	var split, resp time.Duration
	err := netnsx.In(ns, func() error {
		for i := range n {
			_, ds, err := h.objs.HedgeSplit.Benchmark(requests[i], 1, nil)
			if err != nil {
				return fmt.Errorf("test-run hedge_split: %w", err)
			}
			_, dr, err := h.objs.HedgeResp.Benchmark(responses[i], 1, nil)
			if err != nil {
				return fmt.Errorf("test-run hedge_resp: %w", err)
			}
			split, resp = split+ds, resp+dr
		}
		return nil
	})
	if err != nil {
		return ProgramTimes{}, fmt.Errorf("measure programs: %w", err)
	}
	return ProgramTimes{Requests: n, Split: split / time.Duration(n), Resp: resp / time.Duration(n)}, nil
}
