// Package bpf holds kedge's BPF C sources; its only Go file is this test of the headers'
// hygiene (bpf/README.md, "Conventions"):
//   - every header compiles on its own, in an otherwise empty unit, with the flags bpf2go
//     uses (-Wall -Werror) - unused static functions aside, which a header may define for
//     the programs that use them;
//   - every header and program includes only at its top, before any declaration, so the
//     order of includes carries no meaning;
//   - no header includes itself through others: a part two headers share is a third header.
package bpf

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// knownOffenders are headers exempt from the three checks while their owner restructures
// them (the pacer as a service with a one-way interface; hedging's data path by stage). An
// entry that passes every check fails the test: the list only shrinks, and is empty when
// that work has landed. A cycle is exempt when one of its headers is listed.
var knownOffenders = map[string]string{}

// cflags are bpf2go's (the go:generate lines in internal/...), minus the include paths.
var cflags = []string{"-target", "bpfel", "-mcpu=v3", "-O2", "-g", "-Wall", "-Werror", "-Wno-unused-function"}

// source is one C file under bpf/, relative to it.
type source struct {
	path  string // "sg/gather.h"
	lines []string
}

func sources(t *testing.T) []source {
	t.Helper()
	if bpftest.InGuest() {
		t.Skip("reads the repository's C sources and runs clang: the kernel-matrix guests have neither (the host runs it)")
	}
	var out []source
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "include/vmlinux.h" {
			return err
		}
		if !strings.HasSuffix(p, ".h") && !strings.HasSuffix(p, ".c") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out = append(out, source{path: filepath.ToSlash(p), lines: strings.Split(string(b), "\n")})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 {
		t.Fatalf("found %d C sources under bpf/: run from the bpf directory", len(out))
	}
	return out
}

func (s source) header() bool { return strings.HasSuffix(s.path, ".h") }

// stripComments blanks C comments, keeping line breaks (so line numbers hold).
func stripComments(lines []string) []string {
	text := strings.Join(lines, "\n")
	var b strings.Builder
	for i := 0; i < len(text); i++ {
		switch {
		case strings.HasPrefix(text[i:], "/*"):
			end := strings.Index(text[i+2:], "*/")
			if end < 0 {
				end = len(text) - i - 2
			}
			b.WriteString(strings.Map(func(r rune) rune {
				if r == '\n' {
					return r
				}
				return ' '
			}, text[i:i+2+end+2]))
			i += 2 + end + 1
		case strings.HasPrefix(text[i:], "//"):
			end := strings.IndexByte(text[i:], '\n')
			if end < 0 {
				end = len(text) - i
			}
			b.WriteString(strings.Repeat(" ", end))
			i += end - 1
		case text[i] == '"': // a string literal: copied as is
			j := i + 1
			for j < len(text) && text[j] != '"' && text[j] != '\n' {
				if text[j] == '\\' {
					j++
				}
				j++
			}
			b.WriteString(text[i:min(j+1, len(text))])
			i = j
		default:
			b.WriteByte(text[i])
		}
	}
	return strings.Split(b.String(), "\n")
}

var (
	includeRe = regexp.MustCompile(`^\s*#\s*include\s*([<"])([^>"]+)[>"]`)
	guardRe   = regexp.MustCompile(`^\s*#\s*(ifndef|define)\s+\w+\s*$`)
)

// include is one #include line.
type include struct {
	line  int // 1-based
	quote bool
	name  string
}

// includes returns s's includes and the line of the first one that follows a declaration
// (0: none does). Before the first declaration only comments, blank lines, an include
// guard and includes may stand.
func (s source) includes() (incs []include, late int) {
	top := true
	guard := 0
	for i, l := range stripComments(s.lines) {
		if m := includeRe.FindStringSubmatch(l); m != nil {
			incs = append(incs, include{line: i + 1, quote: m[1] == `"`, name: m[2]})
			if !top && late == 0 {
				late = i + 1
			}
			continue
		}
		switch {
		case strings.TrimSpace(l) == "":
		case guard < 2 && guardRe.MatchString(l):
			guard++
		default:
			top = false
		}
	}
	return incs, late
}

// resolve finds a quoted include as clang does for kedge's builds: the including file's
// directory first, then bpf/include.
func resolve(from, name string, exists map[string]bool) (string, bool) {
	for _, dir := range []string{filepath.Dir(from), "include"} {
		p := filepath.ToSlash(filepath.Clean(filepath.Join(dir, name)))
		if exists[p] {
			return p, true
		}
	}
	return "", false
}

// offenses maps a source to what it breaks, per check.
type offenses struct {
	mu  sync.Mutex
	got map[string][]string
}

func (o *offenses) add(path, what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.got == nil {
		o.got = map[string][]string{}
	}
	o.got[path] = append(o.got[path], what)
}

func TestHeaders(t *testing.T) {
	srcs := sources(t)
	exists := map[string]bool{"include/vmlinux.h": true}
	for _, s := range srcs {
		exists[s.path] = true
	}
	var off offenses

	// Includes only at the top; the include graph.
	graph := map[string][]string{}
	for _, s := range srcs {
		incs, late := s.includes()
		if late != 0 {
			off.add(s.path, fmt.Sprintf("line %d: #include after the first declaration", late))
		}
		for _, in := range incs {
			if !in.quote {
				continue
			}
			p, ok := resolve(s.path, in.name, exists)
			if !ok {
				off.add(s.path, fmt.Sprintf("line %d: %q not found in its directory or bpf/include", in.line, in.name))
				continue
			}
			graph[s.path] = append(graph[s.path], p)
		}
	}

	// No cycles: a depth-first walk from every header reports each cycle once.
	reported := map[string]bool{}
	for _, s := range srcs {
		var path []string
		var walk func(string)
		onPath := map[string]bool{}
		done := map[string]bool{}
		walk = func(n string) {
			if onPath[n] {
				i := slices.Index(path, n)
				cyc := append(slices.Clone(path[i:]), n)
				key := strings.Join(sortedCopy(cyc[:len(cyc)-1]), " ")
				if !reported[key] {
					reported[key] = true
					for _, p := range cyc[:len(cyc)-1] {
						off.add(p, "include cycle "+strings.Join(cyc, " -> "))
					}
				}
				return
			}
			if done[n] {
				return
			}
			onPath[n] = true
			path = append(path, n)
			for _, m := range graph[n] {
				walk(m)
			}
			path = path[:len(path)-1]
			onPath[n] = false
			done[n] = true
		}
		walk(s.path)
	}

	// Every header compiles alone.
	cc := "clang-19"
	if _, err := exec.LookPath(cc); err != nil {
		t.Fatalf("%s not found (make deps installs it): %v", cc, err)
	}
	t.Run("compile", func(t *testing.T) {
		for _, s := range srcs {
			if !s.header() {
				continue
			}
			t.Run(s.path, func(t *testing.T) {
				t.Parallel()
				args := append(slices.Clone(cflags), "-Iinclude", "-I"+filepath.Dir(s.path), "-x", "c", "-c", "-", "-o", os.DevNull)
				cmd := exec.Command(cc, args...)
				cmd.Stdin = strings.NewReader(fmt.Sprintf("#include %q\n", filepath.Base(s.path)))
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Run(); err != nil {
					off.add(s.path, "does not compile alone: "+firstError(out.Bytes()))
				}
			})
		}
	})

	for _, s := range srcs {
		got := off.got[s.path]
		reason, known := knownOffenders[s.path]
		switch {
		case known && len(got) == 0:
			t.Errorf("%s passes every check: remove it from knownOffenders (%s)", s.path, reason)
		case known:
			t.Logf("%s: known offender (%s): %s", s.path, reason, strings.Join(got, "; "))
		default:
			for _, g := range got {
				if strings.HasPrefix(g, "include cycle") && cycleExempt(g) {
					continue
				}
				t.Errorf("%s: %s", s.path, g)
			}
		}
	}
	for p := range knownOffenders {
		if !exists[p] {
			t.Errorf("knownOffenders lists %s, which does not exist", p)
		}
	}
}

// cycleExempt: a cycle through a known offender is that offender's to break.
func cycleExempt(what string) bool {
	for _, p := range strings.Split(strings.TrimPrefix(what, "include cycle "), " -> ") {
		if _, ok := knownOffenders[p]; ok {
			return true
		}
	}
	return false
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// firstError returns clang's first error line.
func firstError(out []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "error:") {
			return strings.TrimSpace(sc.Text())
		}
	}
	return strings.TrimSpace(string(out))
}
