// Package docfigures rewrites the figure blocks of kedge's documents from the committed
// benchmark results, so that no current figure in a document is typed by hand. A block is
// the text between `<!-- figures:NAME -->` and `<!-- /figures -->`; each capability's
// benchmark package says which blocks it renders and from which result directory under
// docs/results, and tools/docfigures puts them together (its test fails when a committed
// document's block differs from what the committed results give).
package docfigures

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/kedge-dev/kedge/internal/bench"
)

// Block is one kind of figure block.
type Block struct {
	// Results is the block's directory under the results root (docs/results).
	Results string
	// Command makes that directory's result; a block whose result is missing names it.
	Command string
	// Render returns the block's text (markdown, ending in a newline) from the result
	// directory (the root joined with Results). A missing file is reported as not run yet.
	Render func(dir string) (string, error)
}

// Tool is how a document's blocks are rewritten; the not-run text names it.
const Tool = "go run ./tools/docfigures"

var blockRE = regexp.MustCompile(`(?s)(<!-- figures:([a-z0-9-]+) -->\n)(.*?)(<!-- /figures -->)`)

// Names returns the names of the figure blocks in a document, in order.
func Names(doc []byte) []string {
	var out []string
	for _, m := range blockRE.FindAllSubmatch(doc, -1) {
		out = append(out, string(m[2]))
	}
	return out
}

// Update rewrites every figure block of doc from the results under root and returns the
// document and the names of the blocks rewritten. A block whose result is missing says so
// and names the command that makes it; an unknown block name is an error.
func Update(doc []byte, root string, blocks map[string]Block) ([]byte, []string, error) {
	var names []string
	var errs []error
	out := blockRE.ReplaceAllFunc(doc, func(m []byte) []byte {
		sub := blockRE.FindSubmatch(m)
		name := string(sub[2])
		b, ok := blocks[name]
		if !ok {
			errs = append(errs, fmt.Errorf("update figures: unknown block %q (known: %s)", name, strings.Join(slices.Sorted(maps.Keys(blocks)), ", ")))
			return m
		}
		body, err := b.Render(filepath.Join(root, b.Results))
		var perr *fs.PathError
		if errors.As(err, &perr) && errors.Is(err, fs.ErrNotExist) {
			rel := perr.Path
			if r, rerr := filepath.Rel(root, perr.Path); rerr == nil {
				rel = filepath.Join("docs/results", r)
			}
			body, err = fmt.Sprintf("_Not run yet: no %s (run `%s`, then `%s`)._\n", rel, b.Command, Tool), nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("update figures %s: %w", name, err))
			return m
		}
		names = append(names, name)
		return []byte(string(sub[1]) + body + string(sub[4]))
	})
	return out, names, errors.Join(errs...)
}

// Merge joins the block sets of several packages; a name defined twice is an error.
func Merge(sets ...map[string]Block) (map[string]Block, error) {
	out := map[string]Block{}
	for _, s := range sets {
		for n, b := range s {
			if _, dup := out[n]; dup {
				return nil, fmt.Errorf("figure block %q defined twice", n)
			}
			out[n] = b
		}
	}
	return out, nil
}

// ReadResult decodes a result file into v (a result type embedding bench.Envelope) and
// checks that it is of the schema given. A missing file is an fs.ErrNotExist error, which
// Update reports as not run yet.
func ReadResult(path, schema string, v any) error {
	if err := bench.ReadJSON(path, v); err != nil {
		return err
	}
	e, err := bench.ReadEnvelope(path)
	if err != nil {
		return err
	}
	if e.Schema != schema {
		return fmt.Errorf("%s: schema %q, want %q", path, e.Schema, schema)
	}
	return nil
}
