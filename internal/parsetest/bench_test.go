package parsetest

import (
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// BenchmarkParse reports the in-kernel cost of one parse (parse_pkt, parse_tcp_ts and the
// result map write) per entry point and packet kind: BPF_PROG_TEST_RUN repeats the program
// b.N times in one syscall and returns the mean run time, which replaces Go's ns/op.
//
//	go test -run '^$' -bench BenchmarkParse ./internal/parsetest
func BenchmarkParse(b *testing.B) {
	h := load(b)
	byName := map[string]validFx{}
	for _, fx := range validFixtures {
		byName[fx.name] = fx
	}
	kinds := []struct{ name, fixture string }{
		{"ipv4-udp", "ipv4 udp"},
		{"ipv4-tcp-ts", "ipv4 tcp nop nop timestamp"},
		{"ipv4-opts-tcp-ts", "ipv4 40 bytes of options tcp"},
		{"ipv6-tcp-ts", "ipv6 tcp nop nop timestamp"},
		{"ipv6-6ext-udp", "ipv6 six extension headers udp"},
		{"qinq-ipv6-hbh-tcp-ts", "ipv6 qinq hop-by-hop tcp"},
	}
	var cases []bpftest.Case
	for _, e := range h.entries {
		for _, k := range kinds {
			fx, ok := byName[k.fixture]
			if !ok {
				b.Fatalf("no fixture %q", k.fixture)
			}
			cases = append(cases, bpftest.Case{Name: e.name + "/" + k.name, Prog: e.prog, In: fx.builder().Build(), WantRet: e.verdict})
		}
	}
	h.runner.Bench(b, cases)
}
