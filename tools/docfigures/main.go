// Command docfigures rewrites the figure blocks of kedge's documents from the committed
// results, so that no current figure in them is typed by hand:
//
//	go run ./tools/docfigures            # every docs/*.md from docs/results
//	go run ./tools/docfigures -check     # change nothing; exit 1 if a document is not current
//
// A block is the text between `<!-- figures:NAME -->` and `<!-- /figures -->`; each
// capability's benchmark package says which names it renders and from which results
// (FigureBlocks), and internal/docfigures does the rewriting. TestDocsFiguresCurrent fails
// when a committed document's block differs from what the committed results give.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kedge-dev/kedge/internal/docfigures"
	"github.com/kedge-dev/kedge/internal/hedgebench"
	"github.com/kedge-dev/kedge/internal/ppingbench"
	"github.com/kedge-dev/kedge/internal/raftbench"
	"github.com/kedge-dev/kedge/internal/sgbench"
)

// blocks are every capability's figure blocks.
func blocks() (map[string]docfigures.Block, error) {
	return docfigures.Merge(hedgebench.FigureBlocks(), raftbench.FigureBlocks(), sgbench.FigureBlocks(), ppingbench.FigureBlocks())
}

func main() {
	results := flag.String("results", "docs/results", "directory of the committed results")
	check := flag.Bool("check", false, "change nothing; exit 1 if a document's figures differ from the results")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: docfigures [-results DIR] [-check] [DOC...] (default docs/*.md; run it from the repository root)\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	docs := flag.Args()
	if len(docs) == 0 {
		docs, _ = filepath.Glob("docs/*.md")
	}
	if len(docs) == 0 {
		fmt.Fprintln(os.Stderr, "docfigures: no documents (run it from the repository root)")
		os.Exit(1)
	}
	bs, err := blocks()
	if err != nil {
		fmt.Fprintf(os.Stderr, "docfigures: %v\n", err)
		os.Exit(1)
	}
	stale := false
	for _, doc := range docs {
		old, err := os.ReadFile(doc)
		if err != nil {
			fmt.Fprintf(os.Stderr, "docfigures: %v\n", err)
			os.Exit(1)
		}
		updated, names, err := docfigures.Update(old, *results, bs)
		if err != nil {
			fmt.Fprintf(os.Stderr, "docfigures: %s: %v\n", doc, err)
			os.Exit(1)
		}
		switch {
		case len(names) == 0:
		case bytes.Equal(old, updated):
			fmt.Printf("%s: %d blocks current %v\n", doc, len(names), names)
		case *check:
			fmt.Printf("%s: figures differ from %s: run go run ./tools/docfigures\n", doc, *results)
			stale = true
		default:
			if err := os.WriteFile(doc, updated, 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "docfigures: %v\n", err)
				os.Exit(1)
			}
			fmt.Printf("%s: rewrote %d blocks %v\n", doc, len(names), names)
		}
	}
	if stale {
		os.Exit(1)
	}
}
