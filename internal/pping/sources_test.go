package pping

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
)

// The lab of the RTT-source tests: client and server on a router fabric whose links hold
// every packet shapedDelay in each direction (the fabric's delay line), so every RTT on the
// path is shapedRTT plus microseconds of veths and stacks.
const (
	shapedDelay = 5 * time.Millisecond
	shapedRTT   = 2 * shapedDelay
	// shapedSlack: a sample may exceed shapedRTT by the delay line's lateness (a Go timer
	// in a user-space reader, late by up to milliseconds when both CPUs are busy) and by an
	// ACK the receiver delays; the median must stay within it.
	shapedSlack = 5 * time.Millisecond
	// clockEarly: a sample may fall short of shapedRTT by the hooks' clock reads and the
	// kernel's microsecond rounding, never by more.
	clockEarly = 100 * time.Microsecond
)

func newShapedLab(t *testing.T) *testLab {
	t.Helper()
	l := labOf(t, "pps", lab.Router)
	f, err := l.Faults()
	if err != nil {
		t.Fatalf("fault fabric: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Set(lab.LinkFault{Delay: shapedDelay}, f.AllLinks()...); err != nil {
		t.Fatalf("shape the links: %v", err)
	}
	return l
}

// TestNetnsSources: a download, an upload and a request/response exchange between real
// processes on two hosts of the shaped lab, a monitor on each host's interface with the
// kernel RTT source on a cgroup the test made for the peers. Every exchange gives samples
// on both ends from both TCP sources - tsval (the timestamps crossing the interface) and
// kernel (the stack's own RTT of the socket) - and their medians are the shaped RTT.
func TestNetnsSources(t *testing.T) {
	l := newShapedLab(t)
	cg := bpftest.NewCgroup(t)
	sources := []IDType{IDTCPTimestamp, IDKernel}
	// The kernel source needs bpf_get_netns_cookie() in sock_ops (5.15); before it the
	// monitor refuses it, so the older kernels of the matrix check tsval alone.
	kernelSrc, rel := bpftest.KernelAtLeast(t, 5, 15)
	if !kernelSrc {
		t.Logf("kernel %s: no kernel RTT source before 5.15; tsval only", rel)
		sources = sources[:1]
	}
	mods := func(c *Config) {
		c.KernelRTT, c.Cgroup = kernelSrc, cg.Path
		c.RateLimit = 20 * time.Millisecond
	}
	ends := []struct {
		name string
		h    *lab.Host
		m    *Monitor
		col  *collector
	}{{"client", l.client, nil, nil}, {"server", l.server, nil, nil}}
	for i := range ends {
		ends[i].m, ends[i].col = monitorOn(t, ends[i].h, mods)
		if got := ends[i].m.KernelRTTCgroupPath(); kernelSrc && got != cg.Path {
			t.Fatalf("kernel RTT source on %q, want the test's cgroup %s", got, cg.Path)
		}
	}
	exchanges := []struct {
		name string
		port uint16
		args []string
	}{
		{"download", 7001, []string{"get", strconv.Itoa(2 << 20), strconv.Itoa(4 << 20)}},
		{"upload", 7002, []string{"put", strconv.Itoa(2 << 20), strconv.Itoa(4 << 20)}},
		{"request-response", 7003, []string{"rr", "200", "100"}},
	}
	paths := make([][]time.Duration, len(exchanges)) // the path probe's RTTs per exchange
	for i, x := range exchanges {
		srv := netip.AddrPortFrom(l.server.IPv4, x.port)
		startPeerServer(t, l.server, cg, srv.String())
		probe := startPathProbe(t, l, probePort)
		out := runPeerClient(t, l.client, cg, srv.String(), x.args...)
		paths[i] = probe.Stop()
		t.Logf("%s: %s", x.name, out)
		logPath(t, x.name, paths[i])
	}
	for _, end := range ends {
		all := waitAllRead(t, end.m, end.col)
		t.Logf("%s: sockets tracked %d (other namespaces %d), kernel samples %d (rate-limited %d)", end.name,
			all[HookSockops].SkTracked, all[HookSockops].SkOtherNetns, all[HookSockops].MatchRtt, all[HookSockops].TsRateLimited)
	}
	for xi, x := range exchanges {
		got := make([]map[IDType][]*RTTEvent, len(ends)) // per end, per source
		for i, end := range ends {
			got[i] = map[IDType][]*RTTEvent{}
			for _, src := range sources {
				got[i][src] = end.col.rtts(func(e *RTTEvent) bool {
					return e.Flow.IDType == src && (e.Flow.Src.Port() == x.port || e.Flow.Dst.Port() == x.port)
				})
			}
		}
		for i, end := range ends {
			for _, src := range sources {
				name := fmt.Sprintf("%s/%s/%s", x.name, end.name, src.Source())
				slack := shapedSlack
				if src == IDTCPTimestamp && (x.name == "download" && end.name == "client" || x.name == "upload" && end.name == "server") {
					// The receiving end's tsval samples time its own pure ACKs, whose echo
					// is the sender's next chunk: up to a pacingTick later (a pure-ACK
					// sample includes the sender's own delay: docs/pping.md, Limits).
					slack += pacingTick
				}
				// What the path gave while the exchange ran: under load the delay line
				// releases late and processes wake late, and every source sees it, the
				// stack's own RTT too. The references are the other source's median on
				// the same end of the same exchange (the other end's when this end has
				// fewer than two of its samples: the upload's server has one kernel
				// sample) and the path probe's RTTs over the exchange (pathRef); the
				// median is held to the shaped RTT or to the higher reference, plus
				// slack. On an idle machine both references are the shaped RTT; a
				// source that reads more than slack above both (a bug in one of the
				// code paths) fails.
				ref := pathRef(paths[xi])
				for _, other := range sources {
					if other != src {
						m := median(got[i][other])
						if m == 0 {
							m = median(got[1-i][other])
						}
						ref = max(ref, m)
					}
				}
				checkShaped(t, name, got[i][src], 0, slack, ref)
			}
		}
	}
}

// median is the lower median of the samples' RTTs, 0 with fewer than two (a lone sample is
// no reference: see checkShaped).
func median(evs []*RTTEvent) time.Duration {
	if len(evs) < 2 {
		return 0
	}
	rtts := make([]time.Duration, 0, len(evs))
	for _, e := range evs {
		rtts = append(rtts, e.RTT)
	}
	slices.Sort(rtts)
	return rtts[(len(rtts)-1)/2]
}

// checkShaped: at least one sample, at most short of them below the shaped RTT (less the
// clocks' slack), the (lower) median within slack of it, or of ref (what the path gave
// during the same exchange: another source's median, the path probe's; 0: none) when that
// is higher. The lower median: an exchange
// with two kernel samples has its request's and its closing FIN's, which the peer may ACK
// late. A lone sample has no median to speak of: the upload's server sends one reply
// ("ok"), and the kernel's RTT of it includes however long the client takes to ACK it
// (delayed until it closes, tens of ms on a busy machine), so it is only checked not to be
// below the shaped RTT.
func checkShaped(t *testing.T, name string, evs []*RTTEvent, short int, slack, ref time.Duration) {
	t.Helper()
	if len(evs) == 0 {
		t.Errorf("%s: no samples", name)
		return
	}
	var rtts []time.Duration
	below := 0
	for _, e := range evs {
		rtts = append(rtts, e.RTT)
		if e.RTT < shapedRTT-clockEarly {
			if below++; below > short {
				t.Errorf("%s: sample %v below the shaped RTT %v (%s), more than %d such", name, e.RTT, shapedRTT, e.Flow, short)
			}
		}
	}
	slices.Sort(rtts)
	md := rtts[(len(rtts)-1)/2]
	if len(rtts) > 1 && md > max(shapedRTT, ref)+slack && !emulated {
		t.Errorf("%s: median %v more than %v above the shaped RTT %v and the reference %v (what the path gave meanwhile)", name, md, slack, shapedRTT, ref)
	}
	t.Logf("%s: %d samples, min %v median %v max %v (shaped %v, reference %v)", name, len(rtts), slices.Min(rtts), md, slices.Max(rtts), shapedRTT, ref)
}
