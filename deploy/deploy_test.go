// Package deploy holds kedge's packaging (the OCI image, the Debian package with its
// systemd unit, the Helm chart and its rendered manifest, the Grafana dashboard) and the
// tests that run each as a user would: the image under podman in a lab namespace, the
// unit through systemd-analyze, the package installed into a scratch root.
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	bpftest.RemoveKedgeBinary()
	if debOnce.out != "" {
		os.RemoveAll(debOnce.out)
	}
	os.Exit(code)
}

// repoRoot is the checkout this package lives in.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates namespaces, containers and packages")
	}
}

// requireTool fails (not skips) when a tool make deps installs is missing: make test
// installs it on a fresh machine, so its absence is a broken set-up, not a kernel's limit.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: run 'make deps' (scripts/deps.sh installs it)", name)
	}
	return p
}

// run runs a command and fails the test with its output when it fails.
func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
