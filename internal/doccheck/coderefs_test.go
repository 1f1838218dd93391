package doccheck

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// codeRefRE finds the code's pointers into the documents: `docs/raft.md section 14` and
// `docs/sg.md, "Delivery"` (a section, or a heading or paragraph lead, by its words).
var codeRefRE = regexp.MustCompile(`docs/([a-z]+\.md)[,:]? *(?:sections? ([0-9]+)|\\?"([^"\\]+)\\?")`)

// TestCodeDocRefs: every section number and quoted title a Go, C or shell file points to in
// a document exists there, so a renamed section cannot leave the code pointing nowhere.
func TestCodeDocRefs(t *testing.T) {
	docs := documents(t)
	var errs []string
	walkSources(t, []string{".go", ".c", ".h", ".sh"}, func(p string, b []byte) {
		rel, _ := filepath.Rel(repoRoot, p)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range codeRefRE.FindAllStringSubmatch(line, -1) {
				doc, ok := docs[filepath.Join("docs", m[1])]
				if !ok {
					errs = append(errs, fmt.Sprintf("%s:%d: docs/%s does not exist", rel, i+1, m[1]))
					continue
				}
				text := string(stripFences(doc))
				switch {
				case m[2] != "" && !regexp.MustCompile(`(?m)^#{2,3} `+m[2]+`\. `).MatchString(text):
					errs = append(errs, fmt.Sprintf("%s:%d: docs/%s has no section %s", rel, i+1, m[1], m[2]))
				case m[3] != "" && strings.ContainsAny(m[3], "/$"):
					// a path or a shell variable after the name (a copy of the document), not a title
				case m[3] != "" && !strings.Contains(strings.ToLower(text), strings.ToLower(m[3])):
					errs = append(errs, fmt.Sprintf("%s:%d: docs/%s has no %q", rel, i+1, m[1], m[3]))
				}
			}
		}
	})
	for _, e := range errs {
		t.Error(e)
	}
}

// commentRE finds a line's comment: Go's and C's // and /* (or a line inside a block
// comment, starting with *), a shell script's #. #include lines are code.
var commentRE = regexp.MustCompile(`(?://|/\*|^\s*\*[ /]|^\s*\*$|^\s*#[^!i]|^\s*#$)(.*)`)

// TestCodePaths: every repository path a comment in a Go, C or shell file names exists
// (docs/..., bpf/..., internal/..., as TestDocNames checks the documents' paths), so a file
// moved or renamed cannot leave a comment pointing nowhere.
func TestCodePaths(t *testing.T) {
	documents(t) // skips in kernel-matrix guests: they have no source tree
	var errs []string
	walkSources(t, []string{".go", ".c", ".h", ".sh"}, func(p string, b []byte) {
		rel, _ := filepath.Rel(repoRoot, p)
		for i, line := range strings.Split(string(b), "\n") {
			m := commentRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			for _, miss := range missingPaths(m[1]) {
				errs = append(errs, fmt.Sprintf("%s:%d: %s does not exist", rel, i+1, miss))
			}
		}
	})
	for _, e := range errs {
		t.Error(e)
	}
}
