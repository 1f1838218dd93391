package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Debian packages do not ship modules.dep (depmod writes it at install time), so the
// dependency closure is computed here from each module's .modinfo "depends=" entry.

// moduleTree indexes the modules of one unpacked kernel.
type moduleTree struct {
	dir     string            // .../lib/modules/<release>
	files   map[string]string // module name -> path (possibly compressed)
	builtin map[string]bool   // modules built into the image
}

// modName normalises a module name: file names may use '-' where module names use '_'.
func modName(s string) string {
	s = filepath.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		s = strings.TrimSuffix(s, ext)
	}
	return strings.ReplaceAll(strings.TrimSuffix(s, ".ko"), "-", "_")
}

func loadModuleTree(dir string) (*moduleTree, error) {
	t := &moduleTree{dir: dir, files: map[string]string{}, builtin: map[string]bool{}}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.Contains(d.Name(), ".ko") {
			t.files[modName(d.Name())] = path
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index modules: %w", err)
	}
	f, err := os.Open(filepath.Join(dir, "modules.builtin"))
	if err != nil {
		return nil, fmt.Errorf("read modules.builtin: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		t.builtin[modName(sc.Text())] = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules.builtin: %w", err)
	}
	return t, nil
}

// module is a loadable module, decompressed.
type module struct {
	Name string
	Data []byte
}

// closure returns the loadable modules needed for names, dependencies first. Built-in
// modules are left out; a module that is neither built in nor shipped is an error.
func (t *moduleTree) closure(names []string) ([]module, error) {
	var out []module
	seen := map[string]bool{}
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		name = modName(name)
		if seen[name] || t.builtin[name] {
			return nil
		}
		seen[name] = true
		path, ok := t.files[name]
		if !ok {
			return fmt.Errorf("module %s (needed by %s) is neither built in nor shipped in %s - drop it from guestModules or pick another kernel",
				name, strings.Join(append(chain, "vmtest"), " <- "), t.dir)
		}
		data, err := readModule(path)
		if err != nil {
			return err
		}
		deps, err := moduleDepends(data)
		if err != nil {
			return fmt.Errorf("read dependencies of %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d, append([]string{name}, chain...)); err != nil {
				return err
			}
		}
		out = append(out, module{Name: name, Data: data})
		return nil
	}
	for _, n := range names {
		if err := visit(n, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readModule returns a module file's contents, decompressed: busybox insmod in the
// guest only takes plain ELF.
func readModule(path string) ([]byte, error) {
	switch filepath.Ext(path) {
	case ".ko":
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read module: %w", err)
		}
		return data, nil
	case ".gz":
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read module: %w", err)
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", path, err)
		}
		data, err := io.ReadAll(zr)
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", path, err)
		}
		return data, nil
	case ".xz":
		return decompressWith("xz", path)
	case ".zst":
		return decompressWith("zstd", path)
	}
	return nil, fmt.Errorf("read module %s: unknown compression", path)
}

func decompressWith(tool, path string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(tool, "-dc", path)
	cmd.Stderr = &stderr
	data, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompress %s with %s (is it installed?): %w: %s", path, tool, err, strings.TrimSpace(stderr.String()))
	}
	return data, nil
}

// moduleDepends reads the "depends=" entry of a module's .modinfo section.
func moduleDepends(data []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	info, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo: %w", err)
	}
	return modinfoDepends(info), nil
}

// modinfoDepends parses .modinfo (NUL-separated key=value entries) for "depends=".
func modinfoDepends(info []byte) []string {
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			return strings.Split(string(v), ",")
		}
	}
	return nil
}
