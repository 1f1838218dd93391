package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as an initramfs. Every
// entry is owned by root; parent directories are created on first use.
type cpioWriter struct {
	w    io.Writer
	off  int64
	ino  uint32
	dirs map[string]bool
	err  error
}

const (
	modeTypeMask = 0o170000
	modeDir      = 0o040000
	modeFile     = 0o100000
	modeSymlink  = 0o120000
	modeCharDev  = 0o020000
)

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: w, dirs: map[string]bool{"": true, ".": true, "/": true}}
}

// Dir adds a directory (and its parents).
func (c *cpioWriter) Dir(name string, perm uint32) {
	name = strings.Trim(name, "/")
	if c.dirs[name] {
		return
	}
	c.Dir(path.Dir(name), 0o755)
	c.dirs[name] = true
	c.header(name, modeDir|perm, 0, 0, 0)
}

// File adds a regular file with the given contents.
func (c *cpioWriter) File(name string, perm uint32, data []byte) {
	name = strings.Trim(name, "/")
	c.Dir(path.Dir(name), 0o755)
	c.header(name, modeFile|perm, int64(len(data)), 0, 0)
	c.write(data)
	c.pad()
}

// CopyFile adds a regular file copied from the host (mode bits are kept).
func (c *cpioWriter) CopyFile(name, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = fmt.Errorf("add %s to initramfs: %w", src, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.err = fmt.Errorf("add %s to initramfs: %w", src, err)
		return
	}
	name = strings.Trim(name, "/")
	c.Dir(path.Dir(name), 0o755)
	c.header(name, modeFile|uint32(st.Mode().Perm()), st.Size(), 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, f)
	c.off += n
	if err == nil && n != st.Size() {
		err = fmt.Errorf("%s changed size while copying", src)
	}
	if err != nil {
		c.err = fmt.Errorf("add %s to initramfs: %w", src, err)
		return
	}
	c.pad()
}

// Symlink adds a symbolic link name -> target.
func (c *cpioWriter) Symlink(name, target string) {
	name = strings.Trim(name, "/")
	c.Dir(path.Dir(name), 0o755)
	c.header(name, modeSymlink|0o777, int64(len(target)), 0, 0)
	c.write([]byte(target))
	c.pad()
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) {
	name = strings.Trim(name, "/")
	c.Dir(path.Dir(name), 0o755)
	c.header(name, modeCharDev|perm, 0, major, minor)
}

// Close writes the trailer and returns the first error met.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.err
}

func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	if size > 0xffffffff {
		c.err = fmt.Errorf("add %s to initramfs: %d bytes is too large for cpio", name, size)
	}
	c.ino++
	nlink := 1
	if mode&modeTypeMask == modeDir {
		nlink = 2
	}
	// Fields: magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
	// rdevmajor, rdevminor, namesize (with NUL), check.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.off += int64(n)
	if err != nil {
		c.err = fmt.Errorf("write initramfs: %w", err)
	}
}

// pad aligns the stream to 4 bytes, as newc requires after names and file data.
func (c *cpioWriter) pad() {
	if r := c.off % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}
