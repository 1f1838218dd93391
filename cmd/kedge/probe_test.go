package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/probe"
)

func TestProbeAndDemoCLI(t *testing.T) {
	requireRoot(t)
	code, stdout, stderr := runCLI(t, "", "probe", "-o", "json")
	if code != 0 {
		t.Fatalf("probe: exit %d: %s", code, stderr)
	}
	var r struct {
		DelayLines []string `json:"delay_line_backends"`
		Features   []struct{ ID string }
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || len(r.Features) == 0 || r.DelayLines == nil {
		t.Fatalf("probe -o json: %v, %+v\n%s", err, r, stdout)
	}

	code, stdout, stderr = runCLI(t, "", "demo", "--count", "50")
	if code != 0 {
		t.Fatalf("demo: exit %d: %s\n%s", code, stderr, stdout)
	}
	for _, want := range []string{"FEATURE", "198.18.0.12", "50 measured", "no kedge namespace of this run is left"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, stdout)
		}
	}
}

// TestProbeExitCodes checks the mapping from a report to exit codes with made-up reports:
// 3 with the reason when kedge cannot run, 0 otherwise (also for demo, which stops early).
func TestProbeExitCodes(t *testing.T) {
	report := func(missing ...string) *probe.Report {
		r := &probe.Report{Kernel: probe.Kernel{Release: "5.4.0-test"}}
		for _, id := range []string{probe.BPFSyscall, probe.BTF, probe.TCX, probe.Clsact, probe.QdiscTbf} {
			r.Features = append(r.Features, probe.Feature{ID: id, Name: id, Probed: true, Available: !slices.Contains(missing, id)})
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		args    []string
		missing []string
		code    int
		stderr  string
	}{
		{"runnable", []string{"probe"}, []string{probe.TCX}, exitOK, ""},
		{"no btf", []string{"probe", "-o", "json"}, []string{probe.BTF}, exitUnsupported, "kedge: this kernel cannot run kedge: kernel BTF (/sys/kernel/btf/vmlinux) is not supported by this kernel (needs Linux 5.4 or later) - use a kernel built with CONFIG_DEBUG_INFO_BTF=y"},
		{"no tc hook", []string{"probe"}, []string{probe.TCX, probe.Clsact}, exitUnsupported, "neither TCX links nor clsact"},
		{"demo stops", []string{"demo"}, []string{probe.BPFSyscall}, exitUnsupported, "the BPF syscall is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved := probeRun
			t.Cleanup(func() { probeRun = saved })
			probeRun = func(context.Context) (*probe.Report, error) { return report(tc.missing...), nil }
			code, stdout, stderr := runCLI(t, "", tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("kedge %s: exit %d (want %d), stderr %q (want %q)", strings.Join(tc.args, " "), code, tc.code, stderr, tc.stderr)
			}
			if stdout == "" {
				t.Errorf("kedge %s printed no report", strings.Join(tc.args, " "))
			}
		})
	}
}
