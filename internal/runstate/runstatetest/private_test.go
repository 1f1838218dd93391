package runstatetest

import "testing"

// TestChildSkip: a child that skipped passes its reason up; one that passed or failed is no
// skip.
func TestChildSkip(t *testing.T) {
	for _, tc := range []struct {
		name, out, reason string
		skipped           bool
	}{
		{"skipped", "=== RUN   TestX\n    lab_test.go:307: needs the Go toolchain\n--- SKIP: TestX (0.00s)\nPASS\n", "needs the Go toolchain", true},
		{"passed", "=== RUN   TestX\n--- PASS: TestX (0.10s)\nPASS\n", "", false},
		{"a subtest skipped", "=== RUN   TestX\n    --- SKIP: TestX/a (0.00s)\n--- PASS: TestX (0.10s)\n", "", false},
		{"another test", "--- SKIP: TestXY (0.00s)\n", "", false},
	} {
		reason, skipped := childSkip(tc.out, "TestX")
		if reason != tc.reason || skipped != tc.skipped {
			t.Errorf("%s: childSkip = %q, %v; want %q, %v", tc.name, reason, skipped, tc.reason, tc.skipped)
		}
	}
}
