package hedge

import (
	"net/netip"
	"testing"
	"time"
)

// TestMeasurePrograms runs the attached programs on requests and their first responses
// with BPF_PROG_TEST_RUN: every request is recorded by the splitter and completed by the
// response path (the counters say so), and the kernel reports a run time for both.
func TestMeasurePrograms(t *testing.T) {
	requireRoot(t)
	l := hedgeLab(t, "pt")
	client, srv1 := l.Host("client"), l.Host("srv1")
	svc := netip.AddrPortFrom(srv1.IPv4, 9999)
	cfg := &Config{Interface: "eth0", Services: []ServiceConfig{{Name: "t", Address: svc.String(),
		Delay: DelaySpec{Fixed: 10 * time.Millisecond}, Budget: BudgetSpec{Ratio: 1, Burst: 1000}}}}
	h := startHedger(t, l, cfg, "")
	before, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	from := netip.AddrPortFrom(client.IPv4, 40000)
	var reqs, resps [][]byte
	for i := range n {
		p := idPayload(uint32(7000+i), 32)
		reqs, resps = append(reqs, datagram(from, svc, p)), append(resps, datagram(svc, from, p))
	}
	pt, err := h.MeasurePrograms(client.Handle, reqs, resps)
	if err != nil {
		t.Fatal(err)
	}
	after, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	b, a := before.Services[0].Counters, after.Services[0].Counters
	if a["requests"]-b["requests"] != n || a["responses"]-b["responses"] != n {
		t.Errorf("requests +%d, responses +%d, want +%d each: the runs did not take the request path",
			a["requests"]-b["requests"], a["responses"]-b["responses"], n)
	}
	if pt.Requests != n || pt.Split <= 0 || pt.Resp <= 0 {
		t.Errorf("times %+v", pt)
	}
	t.Logf("hedge_split %v, hedge_resp %v per request (%d requests)", pt.Split, pt.Resp, n)
	if _, err := h.MeasurePrograms(client.Handle, reqs, resps[:1]); err == nil {
		t.Error("50 requests with 1 response accepted")
	}
	if _, err := h.MeasurePrograms(client.Handle, nil, nil); err == nil {
		t.Error("no requests accepted")
	}
}
