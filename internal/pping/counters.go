package pping

import (
	"fmt"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// Hook names a counter slot (enum pp_hook).
type Hook int

const (
	HookIngress Hook = iota
	HookEgress
	HookSockops // the kernel RTT source (sock_ops program)
	HookGC      // user space's garbage collector
	hookCount
)

func (h Hook) String() string {
	return [...]string{"ingress", "egress", "sockops", "gc"}[h]
}

// Hooks lists the counter slots in order.
var Hooks = []Hook{HookIngress, HookEgress, HookSockops, HookGC}

// Counters is struct pp_counters summed over CPUs.
type Counters = ppingPpCounters

// parseErrNames are enum parse_err (parse.h), indexed by -err.
var parseErrNames = [...]string{
	"ok", "eth", "vlan", "vlan_depth", "l3_proto", "ip", "ip_ihl", "ip_len", "ip6", "ext",
	"ext_depth", "fragment", "udp", "tcp", "tcp_doff", "icmp",
}

// Counter is one named counter value.
type Counter = bpfx.Counter

// counterNaming names struct pp_counters' fields as in C, parse_err_<reason> for the array.
var counterNaming = bpfx.Naming{C: true, Elems: map[string][]string{"parse_err": parseErrNames[:]}}

// CounterFields lists every counter of c by name, in struct order, zeros included.
func CounterFields(c *Counters) ([]Counter, error) {
	return bpfx.Fields(c, "", counterNaming)
}

// Counters returns the counters of every hook, summed over CPUs.
func (m *Monitor) Counters() ([hookCount]Counters, error) {
	var out [hookCount]Counters
	for _, h := range Hooks {
		c, err := bpfx.SumPerCPU[Counters](m.objs.Counters, uint32(h))
		if err != nil {
			return out, fmt.Errorf("read %s counters: %w", h, err)
		}
		out[h] = c
	}
	return out, nil
}
