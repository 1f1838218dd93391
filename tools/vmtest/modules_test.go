package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestModName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/net/sched/sch_netem.ko": "sch_netem",
		"veth.ko.xz":                    "veth",
		"crc32c-intel.ko.zst":           "crc32c_intel",
		"kernel/drivers/net/ifb.ko.gz":  "ifb",
		"nf_conntrack":                  "nf_conntrack",
	} {
		if got := modName(in); got != want {
			t.Errorf("modName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestModinfoDepends(t *testing.T) {
	info := []byte("license=GPL\x00depends=stp,llc\x00retpoline=Y\x00")
	if got := modinfoDepends(info); !reflect.DeepEqual(got, []string{"stp", "llc"}) {
		t.Errorf("depends = %v", got)
	}
	if got := modinfoDepends([]byte("depends=\x00name=veth\x00")); got != nil {
		t.Errorf("empty depends = %v", got)
	}
}

// TestClosureOfCachedKernel checks the dependency closure on a kernel that an earlier
// vmtest run unpacked (bridge needs stp and llc, loaded before it).
func TestClosureOfCachedKernel(t *testing.T) {
	dir := os.Getenv(envCache)
	if dir == "" {
		dir = filepath.Join("..", "..", ".cache", "vmtest")
	}
	trees, _ := filepath.Glob(filepath.Join(dir, "kernels", "*", "*lib", "modules", "*"))
	more, _ := filepath.Glob(filepath.Join(dir, "kernels", "*", "usr", "lib", "modules", "*"))
	trees = append(trees, more...)
	if len(trees) == 0 {
		t.Skip("no unpacked kernel in the cache: run go run ./tools/vmtest once")
	}
	for _, tree := range trees {
		mt, err := loadModuleTree(tree)
		if err != nil {
			t.Fatalf("%s: %v", tree, err)
		}
		mods, err := mt.closure([]string{"bridge", "veth"})
		if err != nil {
			t.Fatalf("%s: %v", tree, err)
		}
		pos := map[string]int{}
		for i, m := range mods {
			pos[m.Name] = i
			if len(m.Data) < 4 || string(m.Data[1:4]) != "ELF" {
				t.Errorf("%s: %s is not a plain ELF module", tree, m.Name)
			}
		}
		for _, dep := range []string{"stp", "llc"} {
			if i, ok := pos[dep]; !ok || i > pos["bridge"] {
				t.Errorf("%s: %s missing or after bridge: %v", tree, dep, pos)
			}
		}
		if _, err := mt.closure([]string{"no_such_module"}); err == nil {
			t.Errorf("%s: unknown module must be an error", tree)
		}
	}
}
