package bpftest

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// KernelAtLeast reports whether the running kernel is major.minor or newer, with its release
// string (for a skip or failure message that names it).
func KernelAtLeast(tb testing.TB, major, minor int) (bool, string) {
	tb.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		tb.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var ma, mi int
	if _, err := fmt.Sscanf(rel, "%d.%d", &ma, &mi); err != nil {
		tb.Fatalf("parse kernel release %q: %v", rel, err)
	}
	return ma > major || (ma == major && mi >= minor), rel
}
