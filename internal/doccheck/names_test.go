package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// The names a document gives to the code must exist in it: a file or directory moved or
// renamed, a test renamed, a function gone - the document is then wrong, and says so here.

// repoPathRE finds repository paths in a document's text: a top-level directory of the
// repository and what follows up to a character no path of ours contains.
var repoPathRE = regexp.MustCompile(`(^|[^A-Za-z0-9_./~-])((?:bpf|internal|pkg|cmd|tools|scripts|clients|deploy|docs|\.ci)/[A-Za-z0-9_./-]*)`)

// testNameRE finds Go test, benchmark and fuzz functions named in a document.
var testNameRE = regexp.MustCompile(`\b((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)`)

// callRE finds `name()` in code spans: a function of ours (Go or BPF C).
var callRE = regexp.MustCompile("`(?:[A-Za-z_][A-Za-z0-9_]*\\.)?([A-Za-z_][A-Za-z0-9_]*)\\(\\)`")

// qualRE finds `pkg.Name` in code spans, where pkg is one of our Go packages.
var qualRE = regexp.MustCompile("`\\(?\\*?([a-z][a-z0-9]*)\\.([A-Z][A-Za-z0-9_]*)")

// sources reads the repository's Go, C and header files (not generated objects).
type sources struct {
	all       strings.Builder             // every source file's text
	tests     map[string]bool             // Test/Benchmark/Fuzz functions defined
	pkgs      map[string][]string         // Go package name -> directories
	pkgText   map[string]*strings.Builder // directory -> its Go files' text
	externals map[string]bool             // package names that are not ours (etcd-raft's, ...)
}

var testFuncRE = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Z]\w*)\(`)
var pkgClauseRE = regexp.MustCompile(`(?m)^package (\w+)`)

// walkSources calls fn with every source file of the repository whose extension is one of
// exts (docs, testdata and hidden directories left out, the pinned vmlinux.h too).
func walkSources(t *testing.T, exts []string, fn func(path string, b []byte)) {
	t.Helper()
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != repoRoot && (strings.HasPrefix(n, ".") || n == "docs" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !slices.Contains(exts, filepath.Ext(p)) || strings.HasSuffix(p, "vmlinux.h") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fn(p, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readSources(t *testing.T) *sources {
	t.Helper()
	s := &sources{tests: map[string]bool{}, pkgs: map[string][]string{}, pkgText: map[string]*strings.Builder{}}
	walkSources(t, []string{".go", ".c", ".h"}, func(p string, b []byte) {
		s.all.Write(b)
		s.all.WriteByte('\n')
		if filepath.Ext(p) != ".go" {
			return
		}
		for _, m := range testFuncRE.FindAllSubmatch(b, -1) {
			s.tests[string(m[1])] = true
		}
		dir := filepath.Dir(p)
		if m := pkgClauseRE.FindSubmatch(b); m != nil && !strings.HasSuffix(p, "_test.go") {
			name := string(m[1])
			if !slices.Contains(s.pkgs[name], dir) {
				s.pkgs[name] = append(s.pkgs[name], dir)
			}
		}
		if s.pkgText[dir] == nil {
			s.pkgText[dir] = new(strings.Builder)
		}
		s.pkgText[dir].Write(b)
	})
	return s
}

// missingPaths returns the repository paths text names (repoPathRE) that do not exist. A
// pattern (bench_<name>.go, fabric*.go) needs something that starts so; a Go package's
// identifier after its path (internal/raft/wire.Signer) needs the package's directory.
func missingPaths(text string) []string {
	var missing []string
	for _, m := range repoPathRE.FindAllStringSubmatchIndex(text, -1) {
		p := text[m[4]:m[5]]
		if m[5] < len(text) && strings.ContainsRune("<*{$", rune(text[m[5]])) {
			if g, _ := filepath.Glob(filepath.Join(repoRoot, p) + "*"); len(g) == 0 {
				missing = append(missing, p+"...")
			}
			continue
		}
		p = strings.TrimRight(p, ".-")
		if _, err := os.Stat(filepath.Join(repoRoot, p)); err == nil {
			continue
		}
		if dir, ident, ok := strings.Cut(filepath.Base(p), "."); ok && ident != "" && unicode.IsUpper(rune(ident[0])) {
			if fi, err := os.Stat(filepath.Join(repoRoot, filepath.Dir(p), dir)); err == nil && fi.IsDir() {
				continue
			}
		}
		missing = append(missing, p)
	}
	return missing
}

// TestDocNames: every repository path, test and function a document names exists.
func TestDocNames(t *testing.T) {
	docs := documents(t)
	src := readSources(t)
	all := src.all.String()
	names := make([]string, 0, len(docs))
	for d := range docs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, doc := range names {
		text := string(docs[doc])
		missing := map[string]bool{}
		for _, p := range missingPaths(text) {
			missing["path "+p] = true
		}
		for _, l := range links(text) {
			target, anchor, _ := strings.Cut(l, "#")
			path := doc
			if target != "" {
				path = filepath.Join(filepath.Dir(doc), target)
				if _, err := os.Stat(filepath.Join(repoRoot, path)); err != nil {
					missing["link "+l] = true
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !slices.Contains(anchors(t, path, docs), anchor) {
				missing["link "+l+" (no such heading)"] = true
			}
		}
		for _, m := range testNameRE.FindAllStringSubmatch(text, -1) {
			if !src.hasTest(m[1]) {
				missing["test "+m[1]] = true
			}
		}
		for _, m := range callRE.FindAllStringSubmatch(text, -1) {
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(m[1]) + `\(`).MatchString(all) {
				missing["function "+m[1]+"()"] = true
			}
		}
		for _, m := range qualRE.FindAllStringSubmatch(text, -1) {
			dirs := src.pkgs[m[1]]
			if len(dirs) == 0 {
				continue // not one of our packages (etcd-raft's raft., Go's os., ...)
			}
			re := regexp.MustCompile(`\b` + regexp.QuoteMeta(m[2]) + `\b`)
			found := false
			for _, d := range dirs {
				found = found || re.MatchString(src.pkgText[d].String())
			}
			if !found {
				missing["identifier "+m[1]+"."+m[2]] = true
			}
		}
		for _, k := range slices.Sorted(mapsKeys(missing)) {
			t.Errorf("%s names %s, which does not exist", doc, k)
		}
	}
}

// hasTest says whether a test is defined with this name or, as a -run pattern's prefix
// (-run 'TestFollower|TestProbe'), one starts with it.
func (s *sources) hasTest(name string) bool {
	if s.tests[name] {
		return true
	}
	for n := range s.tests {
		if strings.HasPrefix(n, name) {
			return true
		}
	}
	return false
}

// linkRE finds relative markdown link targets, with their anchor (not URLs).
var linkRE = regexp.MustCompile(`\]\(([^)#:\s]*(?:#[^)\s]*)?)\)`)

func links(text string) []string {
	var out []string
	for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
		if m[1] != "" {
			out = append(out, m[1])
		}
	}
	return out
}

var headingRE = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)

// anchors are the GitHub anchors of a markdown file's headings: lower case, punctuation
// but '-' and '_' dropped, spaces as '-'.
func anchors(t *testing.T, path string, docs map[string][]byte) []string {
	src, ok := docs[path]
	if !ok {
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		if err != nil {
			t.Fatal(err)
		}
		src = b
	}
	var out []string
	for _, m := range headingRE.FindAllStringSubmatch(string(stripFences(src)), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// stripFences blanks fenced blocks, whose '#' lines are no headings.
func stripFences(src []byte) []byte {
	lines := strings.Split(string(src), "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// historyRE finds what makes a document a diary: work sessions and issue numbers, which a
// reader cannot see. History goes to CHANGELOG.md and git.
var historyRE = regexp.MustCompile(`(?i)\b(session|issue)s? #?[0-9]+\b`)

// TestDocsNoHistory: no document names a work session or an issue number.
func TestDocsNoHistory(t *testing.T) {
	for doc, src := range documents(t) {
		for i, line := range strings.Split(string(stripFences(src)), "\n") {
			if m := historyRE.FindString(line); m != "" {
				t.Errorf("%s:%d: %q: a reader cannot see sessions or issues; say what is, history goes to CHANGELOG.md", doc, i+1, m)
			}
		}
	}
}
