package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// testPackage is a Go package with tests.
type testPackage struct {
	ImportPath string
	Rel        string // directory relative to the module root, slash-separated
	Dir        string
}

// repoRoot returns the directory of the main module's go.mod.
func repoRoot(ctx context.Context) (string, error) {
	out, err := goCmd(ctx, "", "env", "GOMOD")
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("find module root: not inside a Go module - run from the kedge repository")
	}
	return filepath.Dir(gomod), nil
}

// listTestPackages expands package patterns and keeps the packages that have tests.
func listTestPackages(ctx context.Context, root string, patterns []string) ([]testPackage, error) {
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{len .TestGoFiles}}\t{{len .XTestGoFiles}}"}, patterns...)
	out, err := goCmd(ctx, root, args...)
	if err != nil {
		return nil, fmt.Errorf("list packages: %w", err)
	}
	var pkgs []testPackage
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			continue
		}
		if f[2] == "0" && f[3] == "0" {
			slog.Debug("package has no tests", "pkg", f[0])
			continue
		}
		rel, err := filepath.Rel(root, f[1])
		if err != nil {
			return nil, fmt.Errorf("list packages: %w", err)
		}
		pkgs = append(pkgs, testPackage{ImportPath: f[0], Rel: filepath.ToSlash(rel), Dir: f[1]})
	}
	return pkgs, nil
}

// buildTest compiles a package's test binary into dir, statically (CGO_ENABLED=0) so
// it runs in the guest without a libc.
func buildTest(ctx context.Context, root string, p testPackage, dir string) (string, error) {
	start := time.Now()
	bin := filepath.Join(dir, strings.ReplaceAll(p.Rel, "/", "_")+".test")
	if _, err := goCmd(ctx, root, "test", "-c", "-ldflags=-s -w", "-o", bin, p.ImportPath); err != nil {
		return "", fmt.Errorf("build test binary of %s: %w", p.ImportPath, err)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("build test binary of %s: go test -c wrote no binary: %w", p.ImportPath, err)
	}
	slog.Debug("built test binary", "pkg", p.ImportPath, "took", time.Since(start).Round(time.Millisecond))
	return bin, nil
}

func goCmd(ctx context.Context, dir string, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
