package version

import "testing"

func TestRevisionPrefersLinkedCommit(t *testing.T) {
	old := Commit
	t.Cleanup(func() { Commit = old })
	Commit = " 0123456789abcdef0123456789abcdef01234567-dirty\n"
	if got := Revision(); got != "0123456789abcdef0123456789abcdef01234567-dirty" {
		t.Errorf("Revision() = %q, want the linked commit, trimmed", got)
	}
}
