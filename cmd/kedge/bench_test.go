package main

import (
	"strings"
	"testing"
)

// TestBenchHedgeUsageErrors: bad scenarios and parameters are rejected with exit code 2
// and a message naming what to change, before any lab is built.
func TestBenchHedgeUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "nope"}, "use one of thesis, pressure, adaptive, outage, rate"},
		{[]string{"--scenario", "thesis,"}, `unknown scenario ""`},
		{[]string{"--scenario", "rate", "--levels", "0"}, "concurrency level 0 out of range"},
		{[]string{"--scenario", "rate", "--repeats", "0"}, "--repeats 0: must be at least 1"},
		{[]string{"--scenario", "rate", "--stall", "5ms"}, "must exceed the hedge delay"},
		{[]string{"--scenario", "outage", "--concurrency", "0"}, "--concurrency 0: must be at least 1"},
		{[]string{"--delay", "2s"}, "below the timeout"},
		{[]string{"--scenario", "rate", "--repeats", "11"}, "repeats 11 out of range"},
		{[]string{"-n", "10", "--concurrency", "20"}, "concurrency 20 out of range 1-10"},
		{[]string{"--stall-pct", "101"}, "out of range 0-100"},
	} {
		code, _, stderr := runCLI(t, "", append([]string{"bench", "hedge", "--out", t.TempDir()}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("kedge bench hedge %s: exit %d, stderr %q; want exit %d and %q",
				strings.Join(tc.args, " "), code, stderr, exitUsage, tc.want)
		}
	}
}
