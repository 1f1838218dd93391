// Package version says which kedge a binary is: the commit it was built from.
package version

import (
	"runtime/debug"
	"strings"
)

// Commit is set at link time by the Makefile (-ldflags "-X ...version.Commit=<git describe>"):
// the full commit id, with "-dirty" when the tree had uncommitted changes.
var Commit string

// Revision returns the commit this binary was built from: Commit when the build set it,
// else the VCS stamp Go embeds (go build in a checkout without -buildvcs=false), else "".
// Test binaries and `go run` usually have neither.
func Revision() string {
	if c := strings.TrimSpace(Commit); c != "" {
		return c
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}
