package probe

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/pkg/kedge"
)

// KEDGE_UPDATE_GOLDEN=1 go test ... rewrites the golden files in testdata/.
var update = os.Getenv("KEDGE_UPDATE_GOLDEN") == "1"

// fixture builds a report with every catalogue row available except those in missing
// (probed, not available) and unknown (not probed).
func fixture(missing map[string]string, unknownIDs ...string) *Report {
	r := &Report{Kernel: Kernel{Release: "6.18.0-test", Version: "#1 SMP", Machine: "x86_64"}}
	for _, c := range catalogue {
		f := Feature{ID: c.id, Name: c.name, UsedFor: c.usedFor, Available: true, Probed: true}
		if d, ok := missing[c.id]; ok {
			f.Available, f.Detail = false, d
		}
		if slices.Contains(unknownIDs, c.id) {
			f.Available, f.Probed, f.Detail = false, false, "permission denied (EPERM): run as root"
		}
		r.Features = append(r.Features, f)
	}
	r.DelayLines = r.DelayLineBackends()
	r.Unsupported = r.UnsupportedReason()
	return r
}

func TestWriteTableGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    *Report
	}{
		{"all", fixture(nil)},
		{"minimal-6.18", fixture(map[string]string{
			QdiscNetem: "qdisc kind netem unknown (ENOENT)",
			QdiscFq:    "qdisc kind fq unknown (ENOENT)",
		})},
		{"unsupported", fixture(map[string]string{
			BTF:    vmlinuxBTF + " not found: kernel built without CONFIG_DEBUG_INFO_BTF",
			TCX:    "TCX links not supported (needs Linux 6.6)",
			Clsact: "add clsact qdisc: no such file or directory (ENOENT)",
		})},
		{"not-root", fixture(nil, BPFSyscall, TCX, Clsact, QdiscTbf)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.r.WriteTable(&b); err != nil {
				t.Fatalf("write table: %v", err)
			}
			golden := filepath.Join("testdata", tc.name+".golden")
			if update {
				if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden (run KEDGE_UPDATE_GOLDEN=1 go test to create): %v", err)
			}
			if got := b.String(); got != string(want) {
				t.Errorf("table differs from %s (KEDGE_UPDATE_GOLDEN=1 go test rewrites it):\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}

func TestDelayLineBackends(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing []string
		unknown []string
		want    []string
	}{
		{"everything", nil, nil, []string{DelayEDT, DelayNetem, DelayConveyor}},
		{"no fq", []string{QdiscFq}, nil, []string{DelayNetem, DelayConveyor}},
		{"fq without set_tstamp", []string{SkbSetTstamp}, nil, []string{DelayNetem, DelayConveyor}},
		{"minimal 6.18", []string{QdiscFq, QdiscNetem}, nil, []string{DelayConveyor}},
		{"no qdiscs", []string{QdiscFq, QdiscNetem, QdiscTbf}, nil, []string{}},
		{"clsact only", []string{TCX}, nil, []string{DelayEDT, DelayNetem, DelayConveyor}},
		{"no tc hook", []string{TCX, Clsact}, nil, []string{}},
		{"unknown counts as absent", nil, []string{QdiscFq, QdiscTbf}, []string{DelayNetem}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{}
			for _, id := range tc.missing {
				m[id] = "missing"
			}
			got := fixture(m, tc.unknown...).DelayLineBackends()
			if !slices.Equal(got, tc.want) {
				t.Errorf("DelayLineBackends() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestUnsupportedReason(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing []string
		unknown []string
		want    string // substring; "" means runnable
	}{
		{"runnable", []string{QdiscFq, QdiscNetem, XDPNative}, nil, ""},
		{"no syscall", []string{BPFSyscall}, nil, "the BPF syscall is not supported by this kernel (needs Linux 3.18 or later) - use a kernel built with CONFIG_BPF_SYSCALL=y"},
		{"no btf", []string{BTF}, nil, "kernel BTF (/sys/kernel/btf/vmlinux) is not supported"},
		{"tcx only missing", []string{TCX}, nil, ""},
		{"no tc hook", []string{TCX, Clsact}, nil, "neither TCX"},
		{"unknown is not missing", nil, []string{BPFSyscall, TCX, Clsact}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{}
			for _, id := range tc.missing {
				m[id] = "missing"
			}
			r := fixture(m, tc.unknown...)
			got := r.UnsupportedReason()
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("UnsupportedReason() = %q, want it to contain %q", got, tc.want)
			}
			// Err is the same as an error in the kedge error model: ErrNotSupported, and a
			// FeatureError naming the first missing feature.
			err := r.Err()
			var fe *kedge.FeatureError
			if (err == nil) != (tc.want == "") || (err != nil && (!errors.Is(err, kedge.ErrNotSupported) ||
				!errors.As(err, &fe) || fe.MinKernel == "" || fe.Hint == "" || err.Error() != got)) {
				t.Errorf("Err() = %v (feature error %+v), want nil exactly when runnable, else ErrNotSupported with a FeatureError", err, fe)
			}
		})
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, tc := range []struct {
		release      string
		major, minor int
		want, ok     bool
	}{
		{"6.18.44-fc-v669", 6, 6, true, true},
		{"6.6.0", 6, 6, true, true},
		{"6.5.13-amd64", 6, 6, false, true},
		{"5.10.0-28-amd64", 6, 6, false, true},
		{"7.0-rc1", 6, 6, true, true},
		{"6.12rc3", 6, 12, true, true},
		{"garbage", 6, 6, false, false},
	} {
		got, ok := KernelAtLeast(tc.release, tc.major, tc.minor)
		if got != tc.want || ok != tc.ok {
			t.Errorf("KernelAtLeast(%q, %d, %d) = %v, %v; want %v, %v", tc.release, tc.major, tc.minor, got, ok, tc.want, tc.ok)
		}
	}
}

func TestErrText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{unix.ENOENT, "no such file or directory (ENOENT)"},
		{errors.New("plain"), "plain"},
	} {
		if got := errText(tc.err); got != tc.want {
			t.Errorf("errText(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	if got := helperName(asm.FnSkbSetTstamp); got != "bpf_skb_set_tstamp" {
		t.Errorf("helperName(FnSkbSetTstamp) = %q", got)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: probes load BPF programs and create network namespaces")
	}
}

func runProbe(t *testing.T) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Run(ctx)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	return r
}

// qdiscWorks adds a qdisc of the given kind in a fresh namespace of the test's own, to
// cross-check the probe independently of its code path.
func qdiscWorks(t *testing.T, kind string) (bool, error) {
	t.Helper()
	ns, err := netnsx.New(netnsx.OwnedName("probecheck"))
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "c0"}, PeerName: "c1"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	l, err := h.LinkByName("c0")
	if err != nil {
		t.Fatalf("find veth: %v", err)
	}
	attrs := netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	var q netlink.Qdisc
	switch kind {
	case "netem":
		q = netlink.NewNetem(attrs, netlink.NetemQdiscAttrs{Latency: 5000})
	case "fq":
		q = netlink.NewFq(attrs)
	case "tbf":
		q = &netlink.Tbf{QdiscAttrs: attrs, Rate: 1e6, Limit: 100_000, Buffer: netlink.Xmittime(1e6, 10_000)}
	case "htb":
		q = netlink.NewHtb(attrs)
	default:
		t.Fatalf("no check for qdisc %s", kind)
	}
	err = h.QdiscAdd(q)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return err == nil, err
}

// TestProbeAgreesWithKernel holds on any kernel: each qdisc row must match what adding the
// qdisc directly does, and the core features kedge needs must be found on a kernel that
// has them.
func TestProbeAgreesWithKernel(t *testing.T) {
	requireRoot(t)
	r := runProbe(t)
	var b bytes.Buffer
	_ = r.WriteTable(&b)
	t.Logf("probe on this machine:\n%s", b.String())

	if inc := r.Incomplete(); len(inc) > 0 {
		t.Errorf("as root every feature must be probed; not probed: %v", inc)
	}
	for _, tc := range []struct{ id, kind string }{
		{QdiscNetem, "netem"}, {QdiscFq, "fq"}, {QdiscTbf, "tbf"}, {QdiscHtb, "htb"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			works, err := qdiscWorks(t, tc.kind)
			if err != nil {
				t.Fatalf("add %s directly: %v", tc.kind, err)
			}
			f, _ := r.Feature(tc.id)
			if f.Available != works {
				t.Errorf("probe says %s available=%v (%s), adding it directly says %v", tc.kind, f.Available, f.Detail, works)
			}
			if !works && !strings.Contains(f.Detail, "ENOENT") {
				t.Errorf("detail for missing %s = %q, want the ENOENT reason", tc.kind, f.Detail)
			}
		})
	}
	backends := r.DelayLineBackends()
	if !slices.Equal(backends, r.DelayLines) {
		t.Errorf("report field delay_line_backends %v != DelayLineBackends() %v", r.DelayLines, backends)
	}
	if r.Has(QdiscTbf) && !slices.Contains(backends, DelayConveyor) {
		t.Errorf("tbf is available but conveyor is not among %v", backends)
	}
	if r.Unsupported != "" {
		t.Errorf("kedge reported unsupported on a kernel its tests run on: %s", r.Unsupported)
	}
}

// TestProbeFeaturesByKernelVersion fails when a feature is missing on a kernel that must
// have it (the cilium/ebpf convention: skip below the version, fail above it).
func TestProbeFeaturesByKernelVersion(t *testing.T) {
	requireRoot(t)
	r := runProbe(t)
	for _, tc := range []struct {
		id           string
		major, minor int
	}{
		{TCX, 6, 6},
		{SkbSetTstamp, 5, 18},
		{Loop, 5, 17},
		{Timer, 5, 15},
		{ForEachMapElem, 5, 13},
		{Ringbuf, 5, 8},
		{EnableStats, 5, 8},
		{RedirectNeigh, 5, 10},
		{Clsact, 4, 5},
		{ProgTestRun, 4, 12},
	} {
		t.Run(tc.id, func(t *testing.T) {
			atLeast, ok := KernelAtLeast(r.Kernel.Release, tc.major, tc.minor)
			if !ok {
				t.Skipf("cannot parse kernel release %q", r.Kernel.Release)
			}
			if !atLeast {
				t.Skipf("kernel %s is older than %d.%d", r.Kernel.Release, tc.major, tc.minor)
			}
			if f, _ := r.Feature(tc.id); !f.Available {
				t.Errorf("kernel %s >= %d.%d but %s reported absent: %s", r.Kernel.Release, tc.major, tc.minor, f.Name, f.Detail)
			}
		})
	}
}

// TestProbeLeavesNothing checks that a probe leaks no namespace and no file descriptor.
func TestProbeLeavesNothing(t *testing.T) {
	requireRoot(t)
	runProbe(t) // warm the feature caches of cilium/ebpf (they cache results, not fds)
	before := openFDs(t)
	runProbe(t)
	if after := openFDs(t); after != before {
		t.Errorf("open fds: %d before the probe, %d after", before, after)
	}
	entries, _ := os.ReadDir(netnsx.Dir)
	prefix := netnsx.OwnedName("")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list fds: %v", err)
	}
	return len(es)
}
