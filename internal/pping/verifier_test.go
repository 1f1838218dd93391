package pping

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestVerifierCost logs the instructions the verifier processed for each program (the
// fixture configuration with a UDP service, with and without aggregation, both ingress
// hooks; the packet programs and the collector's): the figures docs/pping.md quotes. It checks only that the kernel reports them.
func TestVerifierCost(t *testing.T) {
	bpftest.RequireRoot(t)
	svc := []Service{{Port: 9000, Offset: 0, Len: 4}}
	for _, c := range []struct {
		name string
		mod  func(*Config)
	}{
		{"tc", func(c *Config) { c.Services = svc }},
		{"tc-aggregate", func(c *Config) { c.Services = svc; c.Aggregate = time.Second }},
		{"xdp", func(c *Config) { c.Services = svc; c.IngressHook = IngressXDP }},
		{"xdp-aggregate", func(c *Config) { c.Services = svc; c.IngressHook = IngressXDP; c.Aggregate = time.Second }},
	} {
		// The production load (the real clock): the figures are the deployed programs'.
		cfg := fixtureConfig()
		c.mod(&cfg)
		m, err := Load(cfg)
		if err != nil {
			t.Fatalf("%s: load pping: %v", c.name, err)
		}
		t.Cleanup(func() { m.Close() })
		for _, p := range []struct {
			name string
			prog *ebpf.Program
		}{
			{"ingress", m.objs.PpingIngress}, {"egress", m.objs.PpingEgress},
			{"gc_expire", m.objs.PpingGcExpire}, {"gc_flows", m.objs.PpingGcFlows},
		} {
			info, err := p.prog.Info()
			if err != nil {
				t.Fatalf("%s %s: program info: %v", c.name, p.name, err)
			}
			n, ok := info.VerifiedInstructions()
			if !ok {
				t.Skipf("kernel does not report verified instructions")
			}
			t.Logf("%-14s %-8s %6d instructions verified", c.name, p.name, n)
		}
	}
}
