package pping

import (
	"fmt"
	"reflect"
	"strings"
	"unicode"
)

// Hook names a counter slot (enum pp_hook).
type Hook int

const (
	HookIngress Hook = iota
	HookEgress
	HookGC
	hookCount
)

func (h Hook) String() string {
	return [...]string{"ingress", "egress", "gc"}[h]
}

// Hooks lists the counter slots in order.
var Hooks = []Hook{HookIngress, HookEgress, HookGC}

// Counters is struct pp_counters summed over CPUs.
type Counters = ppingPpCounters

// parseErrNames are enum parse_err (parse.h), indexed by -err.
var parseErrNames = [...]string{
	"ok", "eth", "vlan", "vlan_depth", "l3_proto", "ip", "ip_ihl", "ip_len", "ip6", "ext",
	"ext_depth", "fragment", "udp", "tcp", "tcp_doff", "icmp",
}

// Counter is one named counter value.
type Counter struct {
	Name  string // snake_case, as in struct pp_counters (parse_err_<reason> for the array)
	Value uint64
}

// CounterFields lists every counter of c by name, in struct order, zeros included.
func CounterFields(c *Counters) []Counter {
	var out []Counter
	v := reflect.ValueOf(c).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if f.Name == "_" {
			continue
		}
		name := snake(f.Name)
		switch fv := v.Field(i); fv.Kind() {
		case reflect.Uint64:
			out = append(out, Counter{name, fv.Uint()})
		case reflect.Array:
			for j := 0; j < fv.Len(); j++ {
				sub := fmt.Sprint(j)
				if name == "parse_err" && j < len(parseErrNames) {
					sub = parseErrNames[j]
				}
				out = append(out, Counter{name + "_" + sub, fv.Index(j).Uint()})
			}
		}
	}
	return out
}

// snake turns a bpf2go field name (SkipNoTcpTs) back into the C name (skip_no_tcp_ts).
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// addCounters adds every uint64 field and uint64 array of src to dst (struct pp_counters,
// struct pp_traffic).
func addCounters[T any](dst, src *T) {
	d, s := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	for i := 0; i < d.NumField(); i++ {
		switch f := d.Field(i); f.Kind() {
		case reflect.Uint64:
			f.SetUint(f.Uint() + s.Field(i).Uint())
		case reflect.Array:
			for j := 0; j < f.Len(); j++ {
				f.Index(j).SetUint(f.Index(j).Uint() + s.Field(i).Index(j).Uint())
			}
		}
	}
}

// Counters returns the counters of every hook, summed over CPUs.
func (m *Monitor) Counters() ([hookCount]Counters, error) {
	var out [hookCount]Counters
	var percpu []Counters
	for _, h := range Hooks {
		if err := m.objs.Counters.Lookup(uint32(h), &percpu); err != nil {
			return out, fmt.Errorf("read %s counters: %w", h, err)
		}
		for i := range percpu {
			addCounters(&out[h], &percpu[i])
		}
	}
	return out, nil
}
