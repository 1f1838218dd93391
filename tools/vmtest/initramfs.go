package main

import (
	"bufio"
	_ "embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

//go:embed init.sh
var initScript []byte

// busyboxPath is the static busybox (package busybox-static) that becomes the guest's
// shell and tools.
const busyboxPath = "/bin/busybox"

// modprobeScript stands in for modprobe when the kernel autoloads a module: it reports
// the request (the guest only has the modules it preloaded) and fails as modprobe would.
const modprobeScript = `#!/bin/sh
echo "VMTEST-MODPROBE $*" >/dev/console
exit 1
`

// guestTest is one test binary to run in the guest.
type guestTest struct {
	Pkg    string   // package path relative to the module root ("internal/lab")
	Binary string   // host path of the compiled test binary
	SrcDir string   // host package directory; its testdata/ is copied along
	Args   []string // arguments after the binary
}

// guestBinary is where a test binary lands in the guest.
func (g guestTest) guestBinary() string {
	return "/vmtest/bin/" + strings.ReplaceAll(g.Pkg, "/", "_") + ".test"
}

// guestDir is the working directory of a test binary in the guest (go test runs a
// package's tests from its directory, so relative testdata paths keep working).
func (g guestTest) guestDir() string { return "/src/" + g.Pkg }

// guestImage is everything that goes into one kernel's initramfs.
type guestImage struct {
	Kernel  *kernelImage
	Modules []module
	Tests   []guestTest
	Shell   bool // drop to an interactive shell after the tests
}

// writeInitramfs writes the image as an uncompressed cpio archive (decompressing it
// under TCG would cost more than reading it).
func writeInitramfs(dst string, g guestImage) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("create initramfs: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	c := newCPIOWriter(bw)
	addBase(c)
	c.CopyFile("/bin/busybox", busyboxPath)
	c.File("/init", 0o755, initScript)
	c.File("/vmtest/modprobe", 0o755, []byte(modprobeScript))
	c.File("/vmtest/env", 0o644, []byte(guestEnv(g)))
	c.File("/vmtest/manifest", 0o644, []byte(manifest(g.Tests)))
	for _, m := range g.Modules {
		c.File("/lib/modules/"+m.Name+".ko", 0o644, m.Data)
	}
	for _, t := range g.Tests {
		c.CopyFile(t.guestBinary(), t.Binary)
		c.Dir(t.guestDir(), 0o755)
		if err := addTree(c, filepath.Join(t.SrcDir, "testdata"), path.Join(t.guestDir(), "testdata")); err != nil {
			f.Close()
			return err
		}
	}
	err = c.Close()
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	return nil
}

// addBase adds the directories, device nodes and files every guest needs.
func addBase(c *cpioWriter) {
	for _, d := range []string{"/proc", "/sys", "/dev", "/run", "/root", "/etc", "/lib/modules", "/vmtest/bin", "/src"} {
		c.Dir(d, 0o755)
	}
	c.Dir("/tmp", 0o1777)
	c.Symlink("/var/run", "/run")
	c.Symlink("/var/tmp", "/tmp")
	c.CharDev("/dev/console", 0o600, 5, 1)
	c.CharDev("/dev/null", 0o666, 1, 3)
	c.File("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	c.File("/etc/group", 0o644, []byte("root:x:0:\n"))
	c.File("/etc/hosts", 0o644, []byte("127.0.0.1\tlocalhost\n::1\tlocalhost\n"))
}

// addTree copies a host directory tree (regular files and directories) if it exists.
func addTree(c *cpioWriter, src, dst string) error {
	if _, err := os.Stat(src); os.IsNotExist(err) {
		return nil
	}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			c.Dir(target, 0o755)
		case d.Type().IsRegular():
			c.CopyFile(target, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copy %s into initramfs: %w", src, err)
	}
	return nil
}

// guestEnv is sourced by init; test binaries inherit it (guestcheck reads it).
func guestEnv(g guestImage) string {
	names := make([]string, len(g.Modules))
	for i, m := range g.Modules {
		names[i] = m.Name
	}
	shell := "0"
	if g.Shell {
		shell = "1"
	}
	vars := [][2]string{
		{"VMTEST_KERNEL", g.Kernel.Kernel.Name},
		{"VMTEST_KERNEL_RELEASE", g.Kernel.Release},
		{"VMTEST_KERNEL_PACKAGE", g.Kernel.Package.String()},
		{"VMTEST_MODULES", strings.Join(names, " ")},
		{"VMTEST_SHELL", shell},
	}
	var b strings.Builder
	for _, v := range vars {
		fmt.Fprintf(&b, "export %s=%s\n", v[0], shellQuote(v[1]))
	}
	return b.String()
}

// manifest is sourced by init: one run_test call per test binary.
func manifest(tests []guestTest) string {
	var b strings.Builder
	for _, t := range tests {
		words := []string{"run_test", t.Pkg, t.guestDir(), t.guestBinary()}
		words = append(words, t.Args...)
		for i, w := range words {
			if i > 0 {
				b.WriteByte(' ')
				w = shellQuote(w)
			}
			b.WriteString(w)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
