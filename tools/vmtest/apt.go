package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Kernels are fetched with apt-get against a private apt configuration per suite
// (<cache>/apt/<suite>/): its own sources.list, lists, cache and state, and none of the
// host's apt.conf.d (whose update hooks would act on the host). The host's apt state is
// only read: its sources give the mirror, its config the proxy settings.

const (
	// archiveKeyring holds the Debian archive keys (package debian-archive-keyring).
	archiveKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
	// listsMaxAge is how long downloaded package lists are trusted before apt-get update.
	listsMaxAge = 24 * time.Hour
	// envMirror overrides the mirror taken from the host's apt sources.
	envMirror = "KEDGE_VMTEST_MIRROR"
)

// hostAptConfigKeys are copied from the host's apt configuration into the private one,
// so a proxy or a snapshot mirror's date handling keeps working.
var hostAptConfigKeys = []string{
	"Acquire::http::Proxy",
	"Acquire::https::Proxy",
	"Acquire::ftp::Proxy",
	"Acquire::Check-Valid-Until",
	"Acquire::Check-Date",
}

// aptSuite runs apt-get and apt-cache against one suite's private configuration.
type aptSuite struct {
	suite string
	dir   string // <cache>/apt/<suite>
}

// newAptSuite writes the private configuration for suite (idempotently).
func newAptSuite(cacheDir, suite, mirror string) (*aptSuite, error) {
	a := &aptSuite{suite: suite, dir: filepath.Join(cacheDir, "apt", suite)}
	for _, d := range []string{"lists/partial", "cache/archives/partial", "state", "log", "parts.d"} {
		if err := os.MkdirAll(filepath.Join(a.dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("create apt dir: %w", err)
		}
	}
	sources := fmt.Sprintf("deb [signed-by=%s] %s %s main\n", archiveKeyring, mirror, suite)
	if err := os.WriteFile(filepath.Join(a.dir, "sources.list"), []byte(sources), 0o644); err != nil {
		return nil, fmt.Errorf("write sources.list: %w", err)
	}
	hostConf, err := hostAptConfig()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(a.configPath(), []byte(a.config(hostConf)), 0o644); err != nil {
		return nil, fmt.Errorf("write apt.conf: %w", err)
	}
	return a, nil
}

func (a *aptSuite) configPath() string { return filepath.Join(a.dir, "apt.conf") }

// config is read through APT_CONFIG. apt reads that file first and takes Dir::Etc::Parts
// and Dir::Etc::Main from it, so pointing them elsewhere keeps /etc/apt out entirely.
func (a *aptSuite) config(hostConf string) string {
	p := func(rel string) string { return filepath.Join(a.dir, rel) }
	var b strings.Builder
	for _, kv := range [][2]string{
		{"Dir::Etc::Main", "/dev/null"},
		{"Dir::Etc::Parts", p("parts.d")},
		{"Dir::Etc::SourceList", p("sources.list")},
		{"Dir::Etc::SourceParts", "/dev/null"},
		{"Dir::Etc::Preferences", "/dev/null"},
		{"Dir::Etc::PreferencesParts", p("parts.d")},
		{"Dir::State", p("state")},
		{"Dir::State::Lists", p("lists")},
		{"Dir::State::status", "/dev/null"},
		{"Dir::Cache", p("cache")},
		{"Dir::Log", p("log")},
		{"APT::Architecture", "amd64"},
		{"APT::Architectures", "amd64"},
		{"APT::Sandbox::User", "root"},
		{"Acquire::Languages", "none"},
	} {
		fmt.Fprintf(&b, "%s %q;\n", kv[0], kv[1])
	}
	b.WriteString(hostConf)
	return b.String()
}

func (a *aptSuite) command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "APT_CONFIG="+a.configPath(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	return cmd
}

func (a *aptSuite) run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := a.command(ctx, dir, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// update refreshes the suite's package lists when they are missing, older than
// listsMaxAge, or force is set. With stale lists present, a failed update only warns.
func (a *aptSuite) update(ctx context.Context, force bool) error {
	stamp := filepath.Join(a.dir, "updated")
	st, err := os.Stat(stamp)
	haveLists := err == nil
	if haveLists && !force && time.Since(st.ModTime()) < listsMaxAge {
		return nil
	}
	slog.Info("updating package lists", "suite", a.suite)
	if _, err := a.run(ctx, a.dir, "apt-get", "-q", "update"); err != nil {
		if haveLists {
			slog.Warn("apt-get update failed, using the lists from before", "suite", a.suite, "updated", st.ModTime().Format(time.RFC3339), "err", err)
			return nil
		}
		return fmt.Errorf("update package lists of %s: %w - check the mirror in %s or set %s", a.suite, err,
			filepath.Join(a.dir, "sources.list"), envMirror)
	}
	if err := os.WriteFile(stamp, nil, 0o644); err != nil {
		return fmt.Errorf("write update stamp: %w", err)
	}
	return nil
}

// debPackage is one exact Debian binary package.
type debPackage struct {
	Name    string
	Version string
}

func (p debPackage) String() string { return p.Name + "=" + p.Version }

// imageRe matches the names of concrete kernel image packages.
var imageRe = regexp.MustCompile(`^linux-image-[0-9]`)

// resolve turns pkg (concrete or meta) into the exact image package the suite carries.
func (a *aptSuite) resolve(ctx context.Context, pkg string) (debPackage, error) {
	fields, err := a.show(ctx, pkg)
	if err != nil {
		return debPackage{}, err
	}
	if imageRe.MatchString(pkg) {
		return debPackage{Name: pkg, Version: fields["Version"]}, nil
	}
	dep, err := imageDependency(fields["Depends"])
	if err != nil {
		return debPackage{}, fmt.Errorf("resolve %s in %s: %w", pkg, a.suite, err)
	}
	fields, err = a.show(ctx, dep)
	if err != nil {
		return debPackage{}, err
	}
	return debPackage{Name: dep, Version: fields["Version"]}, nil
}

// show returns the control fields of the candidate version of pkg.
func (a *aptSuite) show(ctx context.Context, pkg string) (map[string]string, error) {
	out, err := a.run(ctx, a.dir, "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return nil, fmt.Errorf("look up %s in %s: %w", pkg, a.suite, err)
	}
	fields := parseControl(out)
	if fields["Version"] == "" {
		return nil, fmt.Errorf("look up %s in %s: no version in apt-cache output", pkg, a.suite)
	}
	return fields, nil
}

// parseControl parses the first stanza of Debian control data (continuation lines are
// appended to their field).
func parseControl(data []byte) map[string]string {
	fields := map[string]string{}
	var last string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(fields) > 0 {
				return fields
			}
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += "\n" + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if ok {
				last = k
				fields[k] = strings.TrimSpace(v)
			}
		}
	}
	return fields
}

// imageDependency picks the single concrete image package out of a Depends field.
func imageDependency(depends string) (string, error) {
	var found []string
	for _, alt := range strings.Split(depends, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(alt), " ")
		if imageRe.MatchString(name) {
			found = append(found, name)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("want one linux-image-<version> dependency, found %d in %q", len(found), depends)
	}
	return found[0], nil
}

// download fetches the exact package into dir and returns the .deb's path.
func (a *aptSuite) download(ctx context.Context, p debPackage, dir string) (string, error) {
	if _, err := a.run(ctx, dir, "apt-get", "-q", "download", p.String()); err != nil {
		return "", fmt.Errorf("download %s: %w", p, err)
	}
	debs, err := filepath.Glob(filepath.Join(dir, p.Name+"_*.deb"))
	if err != nil || len(debs) != 1 {
		return "", fmt.Errorf("download %s: expected one .deb in %s, found %d", p, dir, len(debs))
	}
	return debs[0], nil
}

// hostAptConfig returns the host's settings listed in hostAptConfigKeys, as apt.conf lines.
func hostAptConfig() (string, error) {
	out, err := exec.Command("apt-config", "dump").Output()
	if err != nil {
		return "", fmt.Errorf("read host apt config: %w", err)
	}
	var b strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		for _, key := range hostAptConfigKeys {
			if strings.HasPrefix(line, key+" ") || strings.HasPrefix(line, key+"::") {
				b.WriteString(line + "\n")
			}
		}
	}
	return b.String(), nil
}

// hostMirror returns the URI the host's apt sources use for its own Debian release
// (KEDGE_VMTEST_MIRROR overrides it).
func hostMirror() (string, error) {
	if m := os.Getenv(envMirror); m != "" {
		return m, nil
	}
	codename, err := hostCodename("/etc/os-release")
	if err != nil {
		return "", err
	}
	files := []string{"/etc/apt/sources.list"}
	for _, pat := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return "", fmt.Errorf("read apt sources: %w", err)
		}
		var entries []sourceEntry
		if strings.HasSuffix(f, ".sources") {
			entries = parseDeb822Sources(string(data))
		} else {
			entries = parseOneLineSources(string(data))
		}
		for _, e := range entries {
			if e.hasSuite(codename) {
				return strings.TrimSuffix(e.uri, "/"), nil
			}
		}
	}
	return "", fmt.Errorf("find a Debian mirror: no apt source for suite %q on this host - set %s to a Debian mirror URI", codename, envMirror)
}

func hostCodename(osRelease string) (string, error) {
	data, err := os.ReadFile(osRelease)
	if err != nil {
		return "", fmt.Errorf("read os-release: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok && v != "" {
			return strings.Trim(v, `"`), nil
		}
	}
	return "", fmt.Errorf("read os-release: no VERSION_CODENAME - set %s to a Debian mirror URI", envMirror)
}

// sourceEntry is one "deb" source: a URI and its suites.
type sourceEntry struct {
	uri    string
	suites []string
}

func (e sourceEntry) hasSuite(s string) bool { return slices.Contains(e.suites, s) }

// parseOneLineSources parses sources.list lines: deb [options] uri suite component...
func parseOneLineSources(text string) []sourceEntry {
	var out []sourceEntry
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) == 0 {
				continue
			}
			f = f[1:]
		}
		if len(f) >= 2 {
			out = append(out, sourceEntry{uri: f[0], suites: []string{f[1]}})
		}
	}
	return out
}

// parseDeb822Sources parses .sources stanzas (Types, URIs, Suites; Enabled: no skips one).
func parseDeb822Sources(text string) []sourceEntry {
	var out []sourceEntry
	for _, stanza := range strings.Split(text, "\n\n") {
		fields := map[string]string{}
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(k, " ") {
				fields[strings.ToLower(k)] = strings.TrimSpace(v)
			}
		}
		if !slices.Contains(strings.Fields(fields["types"]), "deb") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		for _, uri := range strings.Fields(fields["uris"]) {
			out = append(out, sourceEntry{uri: uri, suites: strings.Fields(fields["suites"])})
		}
	}
	return out
}
