// Command hedgefigures rewrites the figure blocks of kedge's hedging documents from the
// committed results, so that no figure in them is typed by hand:
//
//	go run ./tools/hedgefigures                  # docs/benchmarks.md and docs/hedging.md from docs/results/hedge
//	go run ./tools/hedgefigures -check           # exit 1 if a document is not current
//
// A block is the text between `<!-- figures:NAME -->` and `<!-- /figures -->`
// (internal/hedgebench/figures.go lists the names).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/kedge-dev/kedge/internal/hedgebench"
)

func main() {
	results := flag.String("results", "docs/results/hedge", "directory of the hedge benchmark's results")
	check := flag.Bool("check", false, "change nothing; exit 1 if a document's figures differ from the results")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: hedgefigures [-results DIR] [-check] [DOC...] (default docs/benchmarks.md docs/hedging.md)\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	docs := flag.Args()
	if len(docs) == 0 {
		docs = []string{"docs/benchmarks.md", "docs/hedging.md"}
	}
	stale := false
	for _, doc := range docs {
		old, err := os.ReadFile(doc)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hedgefigures: %v (run it from the repository root)\n", err)
			os.Exit(1)
		}
		updated, names, err := hedgebench.UpdateFigures(old, *results)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hedgefigures: %s: %v\n", doc, err)
			os.Exit(1)
		}
		switch {
		case bytes.Equal(old, updated):
			fmt.Printf("%s: %d blocks current %v\n", doc, len(names), names)
		case *check:
			fmt.Printf("%s: figures differ from %s: run go run ./tools/hedgefigures\n", doc, *results)
			stale = true
		default:
			if err := os.WriteFile(doc, updated, 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "hedgefigures: %v\n", err)
				os.Exit(1)
			}
			fmt.Printf("%s: rewrote %d blocks %v\n", doc, len(names), names)
		}
	}
	if stale {
		os.Exit(1)
	}
}
