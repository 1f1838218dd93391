package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{args: []string{"-all"}},
		{args: []string{"-kernels", "6.1,6.12", "-pkgs", "./internal/lab", "-run", "TestX", "-timeout", "90s", "-keep"}},
		{args: []string{"-all", "-kernels", "6.1"}, wantErr: "exclude"},
		{args: []string{"-timeout", "0s"}, wantErr: "positive"},
		{args: []string{"extra"}, wantErr: "unexpected"},
	} {
		_, err := parseFlags(tc.args)
		if tc.wantErr == "" && err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
		if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.wantErr)
		}
	}
}

func TestSelectKernels(t *testing.T) {
	all, err := selectKernels("", true)
	if err != nil || len(all) != len(kernels) {
		t.Fatalf("-all: %d kernels, %v", len(all), err)
	}
	def, err := selectKernels("", false)
	if err != nil || len(def) != 1 || def[0].Name != defaultKernel {
		t.Fatalf("default: %+v, %v", def, err)
	}
	// Table order, whatever the order asked for.
	two, err := selectKernels(kernels[1].Name+" , "+kernels[0].Name, false)
	if err != nil || len(two) != 2 || two[0].Name != kernels[0].Name {
		t.Fatalf("two: %+v, %v", two, err)
	}
	if _, err := selectKernels("4.19", false); err == nil || !strings.Contains(err.Error(), "known:") {
		t.Fatalf("unknown kernel: %v", err)
	}
}

func TestKernelTable(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range kernels {
		if k.Name == "" || k.Suite == "" || !strings.HasPrefix(k.Package, "linux-image-") {
			t.Errorf("incomplete entry %+v", k)
		}
		if seen[k.Name] {
			t.Errorf("duplicate kernel name %s", k.Name)
		}
		seen[k.Name] = true
	}
}

func TestManifestQuoting(t *testing.T) {
	got := manifest([]guestTest{{Pkg: "internal/lab", Args: []string{"-test.v", "-test.run=Test A|it's"}}})
	want := `run_test 'internal/lab' '/src/internal/lab' '/vmtest/bin/internal_lab.test' '-test.v' '-test.run=Test A|it'\''s'` + "\n"
	if got != want {
		t.Errorf("manifest\n got %s\nwant %s", got, want)
	}
}

func TestBinaryTimeout(t *testing.T) {
	if got := binaryTimeout(300 * time.Second); got != 280*time.Second {
		t.Errorf("300s -> %v", got)
	}
	if got := binaryTimeout(30 * time.Second); got != 15*time.Second {
		t.Errorf("30s -> %v", got)
	}
}
