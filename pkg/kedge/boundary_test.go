package kedge_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestPublicAPIBoundary enforces docs/development.md's rule for every package under pkg/,
// nested ones included (pkg/raft/kernelpaths): its exported API (exported functions,
// methods, types, struct fields, variables and constants) names only standard-library types
// and types declared under pkg/ - never an internal/ or third-party type such as *ebpf.Map
// or netlink.Link - with one kind of exception, listed in extends: a package that extends a
// third-party library names that library's own types where its users hand them over (an
// etcd-raft application passes its raft.Node, Ready and raftpb messages), and the registry
// type that library's users register metrics with. It reads the source, so it needs no
// build: a qualified name X.Y in an exported declaration must come from an import that is
// the standard library, under pkg/, or allowed for that package by extends.
func TestPublicAPIBoundary(t *testing.T) {
	const module = "github.com/kedge-dev/kedge/"
	allowed := func(pkgDir, path, name string) bool {
		first, _, _ := strings.Cut(path, "/")
		if !strings.Contains(first, ".") || strings.HasPrefix(path, module+"pkg/") {
			return true
		}
		for prefix, imports := range extends {
			if pkgDir == prefix || strings.HasPrefix(pkgDir, prefix+"/") {
				if names, ok := imports[path]; ok && (names == nil || slices.Contains(names, name)) {
					return true
				}
			}
		}
		return false
	}
	var pkgDirs []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			pkgDirs = append(pkgDirs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, dir := range pkgDirs {
		pkgDir := filepath.ToSlash(strings.TrimPrefix(dir, ".."+string(filepath.Separator)))
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, pkg := range pkgs {
			for _, f := range pkg.Files {
				imports := map[string]string{} // local name -> path
				for _, imp := range f.Imports {
					path, _ := strconv.Unquote(imp.Path.Value)
					local := filepath.Base(path)
					if imp.Name != nil {
						local = imp.Name.Name
					}
					imports[local] = path
				}
				check := func(where string, n ast.Node) {
					if n == nil {
						return
					}
					ast.Inspect(n, func(n ast.Node) bool {
						sel, ok := n.(*ast.SelectorExpr)
						if !ok {
							return true
						}
						if x, ok := sel.X.(*ast.Ident); ok {
							if path, ok := imports[x.Name]; ok && !allowed(pkgDir, path, sel.Sel.Name) {
								t.Errorf("%s: %s exposes %s.%s (from %s): pkg/ may export only standard-library and pkg/ types, and the types of a library it extends (extends)",
									fset.Position(sel.Pos()), where, x.Name, sel.Sel.Name, path)
							}
						}
						return false
					})
				}
				for _, decl := range f.Decls {
					switch decl := decl.(type) {
					case *ast.FuncDecl:
						if !decl.Name.IsExported() || (decl.Recv != nil && !exportedRecv(decl.Recv)) {
							continue
						}
						check(decl.Name.Name, decl.Type)
						if decl.Recv != nil {
							check(decl.Name.Name, decl.Recv)
						}
					case *ast.GenDecl:
						for _, spec := range decl.Specs {
							switch spec := spec.(type) {
							case *ast.TypeSpec:
								if spec.Name.IsExported() {
									checkType(spec.Name.Name, spec.Type, check)
								}
							case *ast.ValueSpec:
								for _, n := range spec.Names {
									if n.IsExported() {
										check(n.Name, spec.Type)
										if spec.Type != nil {
											// A declared type is what the variable exposes; its
											// value may come from anywhere (a re-exported sentinel).
											continue
										}
										for _, v := range spec.Values {
											if _, isCall := v.(*ast.CallExpr); !isCall {
												check(n.Name, v)
											}
										}
									}
								}
							}
						}
					}
				}
			}
			checked++
		}
	}
	if checked < 2 {
		if os.Getenv("VMTEST_KERNEL") != "" {
			t.Skip("reads the sources under pkg/, which matrix guests do not have (runs on the host)")
		}
		t.Fatalf("%d packages under pkg/ checked: the walk is broken", checked)
	}
}

// extends lists, per directory under pkg/ (and everything below it), the third-party imports
// whose types its exported API may name, and which names (nil: any). Each entry is a library
// the package extends, whose users already hold these types; docs/development.md, "Public
// API boundary".
var extends = map[string]map[string][]string{
	// The kernel paths for any etcd-raft application (docs/raft.md section 18): it wraps the
	// application's raft.Node, Storage and Ready loop and its raftpb messages, and registers
	// its metrics with the application's Prometheus registry.
	"raft": {
		"go.etcd.io/raft/v3":                             nil,
		"go.etcd.io/raft/v3/raftpb":                      nil,
		"github.com/prometheus/client_golang/prometheus": {"Registerer"},
	},
}

// checkType checks the exported parts of a type: a struct's exported fields (and embedded
// types), an interface's methods, anything else whole.
func checkType(name string, typ ast.Expr, check func(string, ast.Node)) {
	switch typ := typ.(type) {
	case *ast.StructType:
		for _, f := range typ.Fields.List {
			if len(f.Names) == 0 { // embedded: its exported members are promoted
				check(name, f.Type)
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					check(name+"."+n.Name, f.Type)
				}
			}
		}
	default:
		check(name, typ)
	}
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	t := recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if g, ok := t.(*ast.IndexExpr); ok {
		t = g.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}
