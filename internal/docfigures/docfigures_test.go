package docfigures

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUpdate(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "x", "v.txt"), []byte("42"), 0o644); err != nil {
		t.Fatal(err)
	}
	read := func(dir string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, "v.txt"))
		return "value " + string(b) + "\n", err
	}
	blocks := map[string]Block{
		"a":   {Results: "x", Command: "make x", Render: read},
		"b":   {Results: "y", Command: "make y", Render: read},
		"bad": {Results: "x", Render: func(string) (string, error) { return "", errors.New("broken") }},
	}
	doc := []byte("# T\n<!-- figures:a -->\nold\n<!-- /figures -->\nmiddle\n<!-- figures:b -->\n<!-- /figures -->\nend\n")
	out, names, err := Update(doc, root, blocks)
	if err != nil {
		t.Fatal(err)
	}
	want := "# T\n<!-- figures:a -->\nvalue 42\n<!-- /figures -->\nmiddle\n<!-- figures:b -->\n_Not run yet: no docs/results/y/v.txt (run `make y`, then `go run ./tools/docfigures`)._\n<!-- /figures -->\nend\n"
	if string(out) != want || strings.Join(names, ",") != "a,b" {
		t.Errorf("got %v\n%s\nwant\n%s", names, out, want)
	}
	if got := Names(out); strings.Join(got, ",") != "a,b" {
		t.Errorf("Names: %v", got)
	}
	again, _, err := Update(out, root, blocks)
	if err != nil || !bytes.Equal(again, out) {
		t.Errorf("second pass changed the document (%v)", err)
	}
	if _, _, err := Update([]byte("<!-- figures:nope -->\n<!-- /figures -->"), root, blocks); err == nil || !strings.Contains(err.Error(), `unknown block "nope" (known: a, b, bad)`) {
		t.Errorf("unknown block: %v", err)
	}
	if _, _, err := Update([]byte("<!-- figures:bad -->\nkept\n<!-- /figures -->"), root, blocks); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("render error: %v", err)
	}
	if _, err := Merge(map[string]Block{"a": {}}, map[string]Block{"a": {}}); err == nil {
		t.Error("Merge: a name defined twice is no error")
	}
}
