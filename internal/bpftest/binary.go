package bpftest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var kedgeBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// InGuest reports whether the test runs inside a kernel-matrix guest (tools/vmtest).
func InGuest() bool { return os.Getenv("VMTEST_KERNEL") != "" }

// KedgeBinary builds cmd/kedge once per test binary (CGO_ENABLED=0, as released) and
// returns its path. Matrix guests have no Go toolchain: there the test is skipped. Call
// RemoveKedgeBinary from TestMain when the tests are done.
func KedgeBinary(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		if InGuest() {
			t.Skip("needs the Go toolchain to build the kedge binary; matrix guests have none (the same test runs on the host)")
		}
		t.Fatalf("needs the Go toolchain to build the kedge binary: %v", err)
	}
	b := &kedgeBin
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "kedge-test-bin-"); b.err != nil {
			return
		}
		path := filepath.Join(b.dir, "kedge")
		cmd := exec.Command("go", "build", "-o", path, "github.com/kedge-dev/kedge/cmd/kedge")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build kedge: %w\n%s", err, out)
			return
		}
		b.path = path
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// RemoveKedgeBinary removes what KedgeBinary built.
func RemoveKedgeBinary() {
	if kedgeBin.dir != "" {
		os.RemoveAll(kedgeBin.dir)
	}
}
