package parsetest

import (
	"errors"
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
		for _, e := range h.entries {
			got, err := h.run(e, frame)
			if errors.Is(err, errNotRunnable) {
				continue
			}
			if err != nil {
				t.Fatalf("frame %x: %v", frame, err)
			}
			if _, ok := errNames[got.Ret]; !ok {
				t.Fatalf("frame %x: parse_%s returned %d, not a parse_err", frame, e.name, got.Ret)
			}
			if d := got.diff(want); d != "" {
				t.Fatalf("frame %x: parse_%s differs from the reference:\n%s", frame, e.name, d)
			}
		}
	})
}
