package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

type cpioEntry struct {
	name            string
	mode, rdevMinor uint32
	data            string
}

// readNewc parses a newc archive, checking magic and 4-byte alignment.
func readNewc(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at offset %d", off)
		}
		mode, size, minor, namesize := field(1), int(field(6)), field(10), int(field(11))
		name := string(b[off+110 : off+110+namesize-1])
		dataOff := align(off + 110 + namesize)
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, cpioEntry{name, mode, minor, string(b[dataOff : dataOff+size])})
		off = align(dataOff + size)
	}
}

func TestCPIOWriter(t *testing.T) {
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	c := newCPIOWriter(&buf)
	c.File("/a/b/file", 0o644, []byte("hello"))
	c.CopyFile("/a/bin", src)
	c.Symlink("/var/run", "/run")
	c.CharDev("/dev/console", 0o600, 5, 1)
	c.Dir("/a", 0o755) // already there: no second entry
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	got := readNewc(t, buf.Bytes())
	want := []cpioEntry{
		{"a", modeDir | 0o755, 0, ""},
		{"a/b", modeDir | 0o755, 0, ""},
		{"a/b/file", modeFile | 0o644, 0, "hello"},
		{"a/bin", modeFile | 0o755, 0, "#!/bin/sh\n"},
		{"var", modeDir | 0o755, 0, ""},
		{"var/run", modeSymlink | 0o777, 0, "/run"},
		{"dev", modeDir | 0o755, 0, ""},
		{"dev/console", modeCharDev | 0o600, 1, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestCPIOWriterMissingFile(t *testing.T) {
	c := newCPIOWriter(&bytes.Buffer{})
	c.CopyFile("/x", filepath.Join(t.TempDir(), "missing"))
	if err := c.Close(); err == nil {
		t.Fatal("a missing source file must fail Close")
	}
}
