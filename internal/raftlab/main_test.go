package raftlab

import (
	"os"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestMain removes the kedge binary the lab tests built (bpftest.KedgeBinary), which
// otherwise stays in the temporary directory after every run.
func TestMain(m *testing.M) {
	code := m.Run()
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}
