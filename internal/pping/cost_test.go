package pping

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// BenchmarkPacketCost: the programs' run time per packet (BPF_PROG_TEST_RUN, the real
// clock), for what most packets of a bulk TCP flow sampled every 100 ms are - a data
// segment at ingress whose TSval was already seen (ts_not_new) and a pure ACK at egress
// whose data direction has nothing outstanding (match_none) - with the fast path and the
// hint skip on (as configured by default) and off (every packet through parse_pkt() and
// the flow lookup). The harness's own cost (~43 ns on the development VM, an empty
// program) is included. ns/pkt per case; docs/pping.md quotes them.
func BenchmarkPacketCost(b *testing.B) {
	bpftest.RequireRoot(b)
	f := v4
	data := f.tcp(false, pktbuild.ACK, 1001, 50, 1400) // B's data, arriving
	ack := f.tcp(true, pktbuild.ACK, 51, 1001, 0)      // A's pure ACK, leaving
	for _, c := range []struct {
		name    string
		general bool
	}{{"fast", false}, {"general", true}} {
		cfg := fixtureConfig()
		cfg.RateLimit = 100 * time.Millisecond
		cfg.noFastPath = c.general
		m, err := Load(cfg)
		if err != nil {
			b.Fatalf("load pping: %v", err)
		}
		run := func(p *ebpf.Program, pkt []byte, repeat int) time.Duration {
			_, per, err := p.Benchmark(pkt, repeat, nil)
			if err != nil {
				b.Fatalf("%s: %v", c.name, err)
			}
			return per
		}
		// The flow: B's first segment creates it, its next one stores TSval 1001, A's ACK
		// matches it; from then on the repeated packets are what the flow's packets are
		// between two samples.
		run(m.objs.PpingIngress, f.tcp(false, pktbuild.ACK, 1000, 50, 1400), 1)
		run(m.objs.PpingIngress, data, 1)
		run(m.objs.PpingEgress, ack, 1)
		for _, p := range []struct {
			name string
			prog *ebpf.Program
			pkt  []byte
		}{{"ingress-data", m.objs.PpingIngress, data}, {"egress-ack", m.objs.PpingEgress, ack}} {
			b.Run(c.name+"/"+p.name, func(b *testing.B) {
				per := run(p.prog, p.pkt, max(b.N, 1000))
				b.ReportMetric(float64(per.Nanoseconds()), "ns/pkt")
			})
		}
		all, err := m.Counters()
		if err != nil {
			b.Fatal(err)
		}
		if all[HookEgress].MatchRtt != 1 || all[HookEgress].MatchNone == 0 || all[HookIngress].TsNotNew == 0 {
			b.Errorf("%s: counters egress %+v ingress %+v: want one sample, then ACKs with nothing to match and data not new",
				c.name, all[HookEgress], all[HookIngress])
		}
		m.Close()
	}
}
