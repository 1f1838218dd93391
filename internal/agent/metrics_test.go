package agent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMonitorGatherers: two monitors' registries, whose metrics carry the same names and no
// unit labels of their own, are served side by side, told apart by netns and interface,
// and a removed monitor's series go.
func TestMonitorGatherers(t *testing.T) {
	a := New(nil)
	reg := func(v float64) *prometheus.Registry {
		r := prometheus.NewRegistry()
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kedge_pping_counter_total", Help: "h"}, []string{"hook", "counter"})
		c.WithLabelValues("tc-ingress", "packets").Add(v)
		r.MustRegister(c)
		return r
	}
	u1 := &unit{kind: "pping", iface: "eth0"}
	u2 := &unit{kind: "pping", iface: "eth0", nsArg: "blue"}
	a.metrics.addGatherer(u1, reg(1))
	a.metrics.addGatherer(u2, reg(2))
	values := func() map[string]float64 {
		t.Helper()
		mfs, err := a.metrics.Gather()
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "kedge_pping_counter_total" {
				continue
			}
			for _, m := range mf.Metric {
				labels := map[string]string{}
				for _, l := range m.Label {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["hook"] != "tc-ingress" || labels["counter"] != "packets" {
					t.Errorf("labels %v", labels)
				}
				out[labels["netns"]+"/"+labels["interface"]] = m.GetCounter().GetValue()
			}
		}
		return out
	}
	if got := values(); len(got) != 2 || got["/eth0"] != 1 || got["blue/eth0"] != 2 {
		t.Errorf("served %v, want /eth0 1 and blue/eth0 2", got)
	}
	a.metrics.removeGatherer(u2)
	if got := values(); len(got) != 1 || got["/eth0"] != 1 {
		t.Errorf("after removal served %v, want /eth0 1 only", got)
	}
}
