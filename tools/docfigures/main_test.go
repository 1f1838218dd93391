package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kedge-dev/kedge/internal/docfigures"
)

// TestDocsFiguresCurrent: the figure blocks of the committed documents are what the
// committed results say (after a benchmark run: go run ./tools/docfigures).
func TestDocsFiguresCurrent(t *testing.T) {
	if os.Getenv("VMTEST_KERNEL") != "" {
		t.Skip("reads the repository's documents and results, which matrix guests do not have (runs on the host)")
	}
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no documents under %s: %v", root, err)
	}
	bs, err := blocks()
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		got, names, err := docfigures.Update(b, filepath.Join(root, "docs", "results"), bs)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, n := range names {
			used[n] = true
		}
		if !bytes.Equal(got, b) {
			t.Errorf("%s: figure blocks %v differ from docs/results: run go run ./tools/docfigures", doc, names)
		}
	}
	for n := range bs {
		if !used[n] {
			t.Errorf("figure block %q is defined but no document shows it", n)
		}
	}
}
