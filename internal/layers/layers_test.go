// Package layers holds the test that enforces kedge's package layers: every package of the
// module has a layer (the table below), a layer may import only the layers its rule names,
// and a production package links nothing of a lab, a benchmark or a test, not even
// indirectly. docs/architecture.md quotes the table (TestArchitectureDocQuotesRules).
package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kedge-dev/kedge"

// A layer is a set of packages with the same import rule.
type layer string

const (
	base       layer = "base"       // kedge's public error types: imported by every layer, imports nothing
	shared     layer = "shared"     // plumbing and services every capability uses; names no capability
	capability layer = "capability" // one capability's control plane and its BPF objects
	public     layer = "public"     // the public Go API
	agent      layer = "agent"      // the agent: runs capabilities from one config file
	lab        layer = "lab"        // network-namespace topologies for tests, the demo and benchmarks
	builder    layer = "builder"    // packet builders: tests and benchmarks make packets with them
	bench      layer = "bench"      // benchmark drivers, their servers and clients, result files
	testonly   layer = "test"       // test harnesses and test-only BPF objects, imported by _test.go files only
	command    layer = "command"    // the kedge binary
	tool       layer = "tool"       // repository tools (kernel matrix, figures)
	example    layer = "example"    // example applications of the public API
)

// packages maps every package of the module to its layer: a path names the package and,
// unless a longer path names them, the packages below it.
var packages = map[string]layer{
	"pkg/kedge":           base,
	"internal/bpfx":       shared,
	"internal/fastexit":   shared, // a killed process's slow files held by a helper
	"internal/netnsx":     shared,
	"internal/nexthop":    shared,
	"internal/runstate":   shared,
	"internal/hist":       shared,
	"internal/version":    shared,
	"internal/probe":      shared,
	"internal/cleanup":    shared,
	"internal/pacer":      shared, // the delay-line service hedge and raft consume
	"internal/strictyaml": shared,

	"internal/hedge": capability,
	"internal/pping": capability,
	"internal/sg":    capability,
	"internal/raft":  capability,

	"pkg": public,
	// kedge raft's node is an application of the public pkg/raft/kernelpaths, as any
	// etcd-raft application would be (docs/raft.md section 18).
	"internal/raft/node": public,

	"internal/agent": agent,

	"internal/lab":     lab,
	"internal/raftlab": lab,

	"internal/pktbuild": builder,

	"internal/bench":      bench,
	"internal/chaos":      bench,
	"internal/hedgebench": bench,
	"internal/ppingbench": bench,
	"internal/raftbench":  bench,
	"internal/sgbench":    bench,
	"internal/docfigures": bench, // figures in documents rendered from committed results

	"internal/bpftest":               testonly,
	"internal/parsetest":             testonly,
	"internal/hist/histtest":         testonly,
	"internal/runstate/runstatetest": testonly,
	"internal/raft/rafttest":         testonly,
	"internal/raft/wire/wiretest":    testonly,
	"internal/layers":                testonly,
	"internal/doccheck":              testonly,
	"bpf":                            testonly, // the header self-containment test
	"deploy":                         testonly, // tests of the packaging (image, deb, chart)

	"cmd/kedge": command,
	"tools":     tool,

	"examples": example,
}

// rules lists, per layer, the layers its packages may import (their own included where
// listed). A capability may import only its own capability's packages of that layer
// (TestCapabilitiesIndependent).
var rules = []struct {
	layer  layer
	may    []layer
	reason string
}{
	{base, []layer{base}, "the bottom: error types every layer returns"},
	{shared, []layer{base, shared}, "shared packages serve every capability and name none"},
	{capability, []layer{base, shared, capability}, "a capability builds on the shared layer; never on a lab, a benchmark or a test"},
	{public, []layer{base, shared, capability, public}, "a program that imports the API links no lab, benchmark or test code"},
	{agent, []layer{base, shared, capability, agent}, "the agent runs capabilities; it is production code"},
	{lab, []layer{base, shared, capability, lab}, "topologies run the production code they test"},
	{builder, []layer{builder}, "packet builders stand alone"},
	{bench, []layer{base, shared, capability, public, lab, builder, bench}, "benchmarks drive labs with real traffic"},
	{testonly, []layer{base, shared, capability, builder, testonly}, "harnesses test production code"},
	{command, []layer{base, shared, capability, public, agent, lab, bench, command}, "the binary: its demo and benchmarks run labs"},
	{tool, []layer{base, shared, capability, public, lab, bench, tool}, "tools run outside the binary"},
	{example, []layer{base, public}, "an example application uses the public API only, as one outside the module would"},
}

// production are the layers whose packages must not link lab, benchmark or test code,
// directly or indirectly, nor the standard library's testing package.
var production = []layer{base, shared, capability, public, agent, example}

// forbiddenInProduction are the layers no production package may depend on.
var forbiddenInProduction = []layer{lab, builder, bench, testonly}

// layerOf returns the layer of a module-relative package path ("" if the table has none).
func layerOf(rel string) layer {
	best, l := "", layer("")
	for p, pl := range packages {
		if (rel == p || strings.HasPrefix(rel, p+"/")) && len(p) > len(best) {
			best, l = p, pl
		}
	}
	return l
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Standard   bool
}

// listModule runs go list over the module's packages (not their tests).
func listModule(t *testing.T) []pkg {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the Go toolchain and the source tree (go list); the kernel matrix's guests have neither - the host runs this test")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Skipf("needs the source tree: %v", err)
	}
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps,Standard", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// moduleRoot finds go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

func may(from, to layer) bool {
	for _, r := range rules {
		if r.layer == from {
			return slices.Contains(r.may, to)
		}
	}
	return false
}

// TestLayers: every package has a layer, and imports only what its layer's rule allows.
func TestLayers(t *testing.T) {
	for _, p := range listModule(t) {
		from, _ := rel(p.ImportPath)
		fl := layerOf(from)
		if fl == "" {
			t.Errorf("package %s has no layer: add it to the table in internal/layers (and docs/architecture.md quotes the table)", from)
			continue
		}
		for _, imp := range p.Imports {
			to, ok := rel(imp)
			if !ok {
				continue
			}
			if tl := layerOf(to); !may(fl, tl) {
				t.Errorf("%s (%s) imports %s (%s): the %s layer may import only %v", from, fl, to, tl, fl, mayList(fl))
			}
		}
	}
}

func mayList(l layer) []layer {
	for _, r := range rules {
		if r.layer == l {
			return r.may
		}
	}
	return nil
}

// TestProductionLinksNoTestCode: no production package depends, even indirectly, on a lab,
// a benchmark, a packet builder or a test harness (go list -deps), nor on package testing.
func TestProductionLinksNoTestCode(t *testing.T) {
	for _, p := range listModule(t) {
		from, _ := rel(p.ImportPath)
		if !slices.Contains(production, layerOf(from)) {
			continue
		}
		for _, d := range p.Deps {
			if d == "testing" {
				t.Errorf("%s (%s) links package testing", from, layerOf(from))
			}
			to, ok := rel(d)
			if !ok {
				continue
			}
			if tl := layerOf(to); slices.Contains(forbiddenInProduction, tl) {
				t.Errorf("%s (%s) depends on %s (%s): production code links no lab, benchmark, builder or test code (%s)",
					from, layerOf(from), to, tl, importChain(t, p.ImportPath, d))
			}
		}
	}
}

// importChain names the path by which from reaches dep, for a readable failure.
func importChain(t *testing.T, from, dep string) string {
	imports := map[string][]string{}
	for _, p := range listModule(t) {
		imports[p.ImportPath] = p.Imports
	}
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == dep {
			var chain []string
			for c := dep; c != ""; c = prev[c] {
				r, _ := rel(c)
				chain = append([]string{r}, chain...)
			}
			return strings.Join(chain, " -> ")
		}
		for _, next := range imports[cur] {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return "via a package outside the module"
}

// TestCapabilitiesIndependent: a capability imports no other capability's packages (the
// shared layer is where they meet).
func TestCapabilitiesIndependent(t *testing.T) {
	for _, p := range listModule(t) {
		from, _ := rel(p.ImportPath)
		if layerOf(from) != capability {
			continue
		}
		for _, imp := range p.Imports {
			to, ok := rel(imp)
			if ok && layerOf(to) == capability && capabilityOf(to) != capabilityOf(from) {
				t.Errorf("capability package %s imports %s, another capability's: move what they share to the shared layer", from, to)
			}
		}
	}
}

// capabilityOf returns the table entry a capability package falls under (internal/raft for
// internal/raft/node).
func capabilityOf(rel string) string {
	best := ""
	for p, l := range packages {
		if l == capability && (rel == p || strings.HasPrefix(rel, p+"/")) && len(p) > len(best) {
			best = p
		}
	}
	return best
}

// TestTableNamesRealPackages: every path in the table names a package of the module (or a
// directory of them), so the table cannot keep rules for packages that are gone.
func TestTableNamesRealPackages(t *testing.T) {
	pkgs := listModule(t)
	for path := range packages {
		found := false
		for _, p := range pkgs {
			r, _ := rel(p.ImportPath)
			if r == path || strings.HasPrefix(r, path+"/") {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("the layer table names %s, which holds no package: remove it", path)
		}
	}
}

// RulesMarkdown renders the rules as docs/architecture.md quotes them.
func rulesMarkdown() string {
	var b strings.Builder
	b.WriteString("| layer | packages | may import | why |\n| --- | --- | --- | --- |\n")
	for _, r := range rules {
		var pkgs []string
		for p, l := range packages {
			if l == r.layer && p != "internal/layers" {
				pkgs = append(pkgs, p)
			}
		}
		slices.Sort(pkgs)
		may := make([]string, len(r.may))
		for i, m := range r.may {
			may[i] = string(m)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.layer, strings.Join(pkgs, ", "), strings.Join(may, ", "), r.reason)
	}
	b.WriteString("\nProduction layers (" + joinLayers(production) + ") link no " + joinLayers(forbiddenInProduction) +
		" package, not even indirectly, nor Go's testing package; a capability imports no other capability.\n")
	return b.String()
}

func joinLayers(ls []layer) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}

const (
	docBegin = "<!-- layers: generated from internal/layers/layers_test.go; do not edit -->\n"
	docEnd   = "<!-- layers: end -->"
)

// TestArchitectureDocQuotesRules: docs/architecture.md holds the rule table as the test
// renders it, between the markers, so the written rules are the enforced ones. With
// KEDGE_UPDATE_DOCS=1 it rewrites the table there instead of failing.
func TestArchitectureDocQuotesRules(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Skipf("needs the source tree: %v", err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("needs the source tree's docs/architecture.md (absent: not a checkout)")
	}
	if err != nil {
		t.Fatal(err)
	}
	want := rulesMarkdown()
	before, after, ok := strings.Cut(string(doc), docBegin)
	got, rest, ok2 := strings.Cut(after, docEnd)
	if ok && ok2 && got != want && os.Getenv("KEDGE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(filepath.Join(root, "docs", "architecture.md"), []byte(before+docBegin+want+docEnd+rest), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the rule table in docs/architecture.md")
		return
	}
	if !ok || !ok2 {
		t.Fatalf("docs/architecture.md has no rule table between %q and %q; put this there:\n%s%s%s", strings.TrimSpace(docBegin), docEnd, docBegin, want, docEnd)
	}
	if got != want {
		t.Errorf("docs/architecture.md's rule table differs from the enforced one (KEDGE_UPDATE_DOCS=1 go test ./internal/layers rewrites it); replace it with:\n%s%s%s", docBegin, want, docEnd)
	}
}
