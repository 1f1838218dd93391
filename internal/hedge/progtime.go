package hedge

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/pktbuild"
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
// packet, the kernel's timing, no bpf_stats sysctl) on n requests from client to service
// svc and their responses, ids from firstID upwards, payloadLen bytes each (a distinct
// request id per request in the service's id field). The runs change the hedger's state as real traffic
// would (scoreboard entries, counters, a clone or a stored request per request): measure
// on a hedger whose counters no longer matter, or read them around the call. ns is the
// hedger's network namespace: the programs redirect to its devices.
func (h *Hedger) MeasurePrograms(ns netns.NsHandle, svc int, client netip.AddrPort, firstID uint32, n, payloadLen int) (ProgramTimes, error) {
	var pt ProgramTimes
	if svc < 0 || svc >= len(h.Config.Services) || n < 1 {
		return pt, fmt.Errorf("measure programs: service %d of %d, %d requests", svc, len(h.Config.Services), n)
	}
	s := h.Config.Services[svc]
	id := s.RequestID
	if id.Length > 4 || payloadLen < id.Offset+4 {
		return pt, fmt.Errorf("measure programs: request id of %d bytes at %d in %d-byte payloads: want at most 4 bytes inside the payload", id.Length, id.Offset, payloadLen)
	}
	if client.Addr().Is4() != s.addr.Addr().Is4() {
		return pt, fmt.Errorf("measure programs: client %s and service %s differ in address family", client, s.addr)
	}
	frame := func(from, to netip.AddrPort, reqID uint32) []byte {
		p := make([]byte, payloadLen)
		binary.BigEndian.PutUint32(p[id.Offset:], reqID<<(8*(4-id.Length)))
		b := pktbuild.New()
		if from.Addr().Is4() {
			b = b.IPv4(pktbuild.IPv4{Src: from.Addr(), Dst: to.Addr()})
		} else {
			b = b.IPv6(pktbuild.IPv6{Src: from.Addr(), Dst: to.Addr()})
		}
		return b.UDP(pktbuild.UDP{Src: from.Port(), Dst: to.Port()}).Payload(p).Build()
	}
	var split, resp time.Duration
	err := bpfx.InNetns(ns, func() error {
		for i := range n {
			rid := firstID + uint32(i)
			_, ds, err := h.objs.HedgeSplit.Benchmark(frame(client, s.addr, rid), 1, nil)
			if err != nil {
				return fmt.Errorf("test-run hedge_split: %w", err)
			}
			_, dr, err := h.objs.HedgeResp.Benchmark(frame(s.addr, client, rid), 1, nil)
			if err != nil {
				return fmt.Errorf("test-run hedge_resp: %w", err)
			}
			split, resp = split+ds, resp+dr
		}
		return nil
	})
	if err != nil {
		return pt, fmt.Errorf("measure programs: %w", err)
	}
	return ProgramTimes{Requests: n, Split: split / time.Duration(n), Resp: resp / time.Duration(n)}, nil
}
