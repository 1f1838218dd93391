package parsetest

import (
	"fmt"
	"testing"
)

// FuzzParse feeds arbitrary frames to parse_tc and parse_xdp and checks, for each: the
// verdict is the entry point's fixed one, the packet is unchanged, the return code is a
// parse_err, and the parse equals refParse field for field. Go's coverage guidance steers
// by refParse (the BPF side is not instrumented), whose branches mirror the policy; the
// corpus starts from every fixture.
//
//	go test -run '^$' -fuzz FuzzParse -fuzztime 5m ./internal/parsetest
func FuzzParse(f *testing.F) {
	h := load(f)
	for _, fx := range validFixtures {
		f.Add(fx.builder().Build())
	}
	for _, fx := range malformedFixtures() {
		f.Add(fx.frame)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) > maxFrame {
			frame = frame[:maxFrame]
		}
		want := refParse(frame)
		if _, ok := errNames[want.Ret]; !ok {
			t.Fatalf("reference returned %d, not a parse_err", want.Ret)
		}
		for _, c := range h.cases(fmt.Sprintf("frame %x: parse_", frame), frame, wantParse(want)) {
			h.runner.RunCase(t, c)
		}
	})
}
