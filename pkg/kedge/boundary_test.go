package kedge_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPublicAPIBoundary enforces docs/architecture.md's rule for every package under pkg/:
// its exported API (exported functions, methods, types, struct fields, variables and
// constants) names only standard-library types and types declared under pkg/ - never an
// internal/ or third-party type such as *ebpf.Map or netlink.Link. It reads the source, so
// it needs no build: a qualified name X.Y in an exported declaration must come from an
// import that is the standard library or under pkg/.
func TestPublicAPIBoundary(t *testing.T) {
	const module = "github.com/kedge-dev/kedge/"
	allowed := func(path string) bool {
		first, _, _ := strings.Cut(path, "/")
		return !strings.Contains(first, ".") || strings.HasPrefix(path, module+"pkg/")
	}
	pkgDirs, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, d := range pkgDirs {
		if !d.IsDir() {
			continue
		}
		dir := filepath.Join("..", d.Name())
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
							if path, ok := imports[x.Name]; ok && !allowed(path) {
								t.Errorf("%s: %s exposes %s.%s (from %s): pkg/ may export only standard-library and pkg/ types",
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
	if checked < 1 {
		if os.Getenv("VMTEST_KERNEL") != "" {
			t.Skip("reads the sources under pkg/, which matrix guests do not have (runs on the host)")
		}
		t.Fatal("no package under pkg/ checked")
	}
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
