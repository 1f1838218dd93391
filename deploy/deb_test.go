package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

var debOnce struct {
	sync.Once
	path, out string
	err       error
}

// buildDeb runs scripts/deb.sh once per test binary with a freshly built binary and
// returns the package (removed by TestMain).
func buildDeb(t *testing.T) string {
	t.Helper()
	requireTool(t, "dpkg-deb")
	bin := bpftest.KedgeBinary(t)
	debOnce.Do(func() {
		if debOnce.out, debOnce.err = os.MkdirTemp("", "kedge-test-deb-"); debOnce.err != nil {
			return
		}
		cmd := exec.Command(filepath.Join(repoRoot(t), "scripts/deb.sh"))
		cmd.Env = append(os.Environ(), "KEDGE_BIN="+bin, "OUT_DIR="+debOnce.out, "COMMIT=0123456789abcdef0123")
		out, err := cmd.CombinedOutput()
		if err != nil {
			debOnce.err = fmt.Errorf("deb.sh: %w\n%s", err, out)
			return
		}
		debOnce.path = strings.TrimSpace(string(out))
	})
	if debOnce.err != nil {
		t.Fatal(debOnce.err)
	}
	return debOnce.path
}

// installRoot installs deb into a scratch root with dpkg --root (maintainer scripts run
// outside it with DPKG_ROOT set, as for image builds: they must only place files).
func installRoot(t *testing.T, deb string) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, nil, "dpkg", "--root="+root, "--force-script-chrootless", "--log=/dev/null", "--install", deb)
	return root
}

// TestDeb builds the package, checks its metadata and contents, installs it into a scratch
// root and checks what landed (the binary runs, the unit is the one in deploy/systemd, the
// default config validates, man pages for every command), then purges it.
func TestDeb(t *testing.T) {
	requireRoot(t)
	deb := buildDeb(t)
	info := run(t, nil, "dpkg-deb", "--info", deb)
	for _, want := range []string{"Package: kedge", "Version: 0~", ".0123456789ab", "Architecture: ", "Description: kernel-resident", "Revision 0123456789abcdef0123."} {
		if !strings.Contains(info, want) {
			t.Errorf("control lacks %q:\n%s", want, info)
		}
	}
	root := installRoot(t, deb)
	if st := run(t, nil, "dpkg", "--root="+root, "--status", "kedge"); !strings.Contains(st, "Status: install ok installed") ||
		!strings.Contains(st, "Conffiles:\n /etc/kedge/kedge.yaml") {
		t.Errorf("dpkg --status:\n%s", st)
	}
	bin := filepath.Join(root, "usr/bin/kedge")
	if st, err := os.Stat(bin); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("usr/bin/kedge: %v %v", st, err)
	}
	if v := run(t, nil, bin, "version"); !strings.HasPrefix(v, "kedge ") {
		t.Errorf("kedge version: %s", v)
	}
	unit, _ := os.ReadFile(filepath.Join(root, "lib/systemd/system/kedge-agent.service"))
	want, _ := os.ReadFile(filepath.Join(repoRoot(t), "deploy/systemd/kedge-agent.service"))
	if len(unit) == 0 || !bytes.Equal(unit, want) {
		t.Errorf("the installed unit differs from deploy/systemd/kedge-agent.service")
	}
	if out := run(t, nil, bin, "agent", "check", filepath.Join(root, "etc/kedge/kedge.yaml")); !strings.Contains(out, "valid") {
		t.Errorf("agent check of the default config: %s", out)
	}
	for _, page := range []string{"kedge.1.gz", "kedge-agent.1.gz", "kedge-agent-check.1.gz", "kedge-hedge-run.1.gz", "kedge-pping.1.gz", "kedge-sg.1.gz", "kedge-raft.1.gz"} {
		if _, err := os.Stat(filepath.Join(root, "usr/share/man/man1", page)); err != nil {
			t.Errorf("man page: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "usr/share/doc/kedge/deploy.md")); err != nil {
		t.Errorf("docs: %v", err)
	}

	run(t, nil, "dpkg", "--root="+root, "--force-script-chrootless", "--log=/dev/null", "--purge", "kedge")
	for _, f := range []string{"usr/bin/kedge", "lib/systemd/system/kedge-agent.service", "etc/kedge/kedge.yaml"} {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			t.Errorf("%s left after purge", f)
		}
	}
}

// TestUnitVerify runs systemd-analyze verify on the installed unit (its ExecStart binary and
// man page resolved from the package, through an overlay on /usr/bin in a private mount
// namespace: nothing of the host changes) and requires silence, then checks the sandbox
// with systemd-analyze security --offline: exposure must stay at MEDIUM or better.
func TestUnitVerify(t *testing.T) {
	requireRoot(t)
	requireTool(t, "systemd-analyze")
	requireTool(t, "man")
	root := installRoot(t, buildDeb(t))
	unit := filepath.Join(root, "lib/systemd/system/kedge-agent.service")
	inOverlay := func(args string) (string, error) {
		script := "mount --make-rprivate / && mount -t overlay overlay -o lowerdir=" + root + "/usr/bin:/usr/bin /usr/bin && " + args
		cmd := exec.Command("unshare", "-m", "sh", "-c", script)
		cmd.Env = append(os.Environ(), "MANPATH="+filepath.Join(root, "usr/share/man"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := inOverlay("systemd-analyze verify " + unit)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = inOverlay("systemd-analyze security --offline=true --no-pager " + unit)
	m := regexp.MustCompile(`Overall exposure level for kedge-agent.service: ([0-9.]+) (\w+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	t.Logf("exposure %s %s", m[1], m[2])
	if v, _ := strconv.ParseFloat(m[1], 64); v > 6.0 {
		t.Errorf("the unit's exposure is %s %s: keep it at 6.0 or below (the capabilities and sandbox settings in deploy/systemd)", m[1], m[2])
	}
}
