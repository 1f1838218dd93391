// Package probe finds out, for real, what the running kernel offers kedge: BTF, the BPF
// syscall and JIT, the helpers kedge's programs call, TC and XDP attach modes and the
// qdiscs its delay lines need. Helpers are probed by loading tiny programs
// (cilium/ebpf/features); attach modes and qdiscs by attaching and adding them on a veth
// pair inside a throw-away network namespace - never in the caller's namespace.
//
// Other packages choose a backend from the report:
//
//	r, err := probe.Run(ctx)
//	...
//	backends := r.DelayLineBackends() // e.g. ["conveyor"], best first
package probe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/pkg/kedge"
)

// Feature IDs: stable keys for the rows of a Report (used in JSON and by Has).
const (
	BTF            = "btf"
	BPFSyscall     = "bpf_syscall"
	BPFJIT         = "bpf_jit"
	TCX            = "tcx"
	Clsact         = "clsact"
	XDPNative      = "xdp_native"
	XDPGeneric     = "xdp_generic"
	Timer          = "bpf_timer"
	Ringbuf        = "ringbuf"
	SkbSetTstamp   = "skb_set_tstamp"
	RedirectNeigh  = "redirect_neigh"
	ForEachMapElem = "for_each_map_elem"
	Loop           = "bpf_loop"
	ProgTestRun    = "prog_test_run"
	EnableStats    = "enable_stats"
	QdiscNetem     = "qdisc_netem"
	QdiscFq        = "qdisc_fq"
	QdiscTbf       = "qdisc_tbf"
	QdiscHtb       = "qdisc_htb"
	QdiscClsact    = "qdisc_clsact"
)

// Delay-line backends for hedging, in preference order (see DelayLineBackends).
const (
	DelayEDT      = "edt"      // skb->tstamp set by BPF, released by the fq qdisc: per-packet delay, no CPU while waiting
	DelayNetem    = "netem"    // clones sent through a netem qdisc with a fixed delay
	DelayConveyor = "conveyor" // clones queued behind circulating fillers in a tbf qdisc (kernel-notes.md)
)

// Feature is one row of the report.
type Feature struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Probed is false when the probe could not decide (e.g. not root); Available is then false.
	Probed  bool   `json:"probed"`
	Detail  string `json:"detail,omitempty"` // why not (or what was found)
	UsedFor string `json:"used_for"`         // what kedge uses it for, which backend it enables
}

// Kernel identifies the running kernel (uname).
type Kernel struct {
	Release string `json:"release"`
	Version string `json:"version"`
	Machine string `json:"machine"`
}

// Report is the outcome of Run. DelayLines and Unsupported are derived from Features by Run
// (the methods DelayLineBackends and UnsupportedReason recompute them).
type Report struct {
	Kernel      Kernel    `json:"kernel"`
	Features    []Feature `json:"features"`
	DelayLines  []string  `json:"delay_line_backends"`   // best first; empty: no hedging delay line
	Unsupported string    `json:"unsupported,omitempty"` // why kedge cannot run at all; empty when it can
}

// Feature returns the row with the given ID.
func (r *Report) Feature(id string) (Feature, bool) {
	for _, f := range r.Features {
		if f.ID == id {
			return f, true
		}
	}
	return Feature{}, false
}

// Has reports whether the feature was probed and is available.
func (r *Report) Has(id string) bool {
	f, ok := r.Feature(id)
	return ok && f.Probed && f.Available
}

// lacks reports whether the feature was probed and found missing (unknown is not lacking).
func (r *Report) lacks(id string) bool {
	f, ok := r.Feature(id)
	return ok && f.Probed && !f.Available
}

// DelayLineBackends returns the hedging delay-line backends this kernel supports, best
// first: edt (fq + bpf_skb_set_tstamp), netem, conveyor (tbf). Every backend also needs a TC
// hook (TCX or clsact) to clone requests.
func (r *Report) DelayLineBackends() []string {
	out := []string{}
	if !r.Has(TCX) && !r.Has(Clsact) {
		return out
	}
	if r.Has(QdiscFq) && r.Has(SkbSetTstamp) {
		out = append(out, DelayEDT)
	}
	if r.Has(QdiscNetem) {
		out = append(out, DelayNetem)
	}
	if r.Has(QdiscTbf) {
		out = append(out, DelayConveyor)
	}
	return out
}

// Missing lists the features kedge cannot run without that this kernel was found to lack
// (features that could not be probed do not count), each as a *kedge.FeatureError.
func (r *Report) Missing() []*kedge.FeatureError {
	var m []*kedge.FeatureError
	if r.lacks(BPFSyscall) {
		m = append(m, &kedge.FeatureError{Feature: "the BPF syscall", MinKernel: "3.18",
			Hint: "use a kernel built with CONFIG_BPF_SYSCALL=y"})
	}
	if r.lacks(BTF) {
		m = append(m, &kedge.FeatureError{Feature: "kernel BTF (" + vmlinuxBTF + ")", MinKernel: "5.4",
			Hint: "use a kernel built with CONFIG_DEBUG_INFO_BTF=y: kedge's programs need BTF for CO-RE"})
	}
	if r.lacks(TCX) && r.lacks(Clsact) {
		m = append(m, &kedge.FeatureError{Feature: "a TC hook (neither TCX links nor clsact/cls_bpf attach work)", MinKernel: "4.5",
			Hint: "use a kernel built with CONFIG_NET_SCH_INGRESS and CONFIG_NET_CLS_BPF"})
	}
	return m
}

// Err is nil when kedge can run on this kernel, else an error that matches
// kedge.ErrNotSupported and, through errors.As, the first *kedge.FeatureError of Missing.
func (r *Report) Err() error {
	m := r.Missing()
	if len(m) == 0 {
		return nil
	}
	errs := make(missingFeatures, len(m))
	for i, f := range m {
		errs[i] = f
	}
	return errs
}

// missingFeatures joins feature errors with "; " (errors.Join would use newlines).
type missingFeatures []error

func (m missingFeatures) Error() string {
	s := make([]string, len(m))
	for i, e := range m {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

func (m missingFeatures) Unwrap() []error { return m }

// UnsupportedReason says why kedge cannot run on this kernel at all, or "" when it can:
// the text of Err.
func (r *Report) UnsupportedReason() string {
	if err := r.Err(); err != nil {
		return err.Error()
	}
	return ""
}

// Incomplete returns the IDs of features that could not be probed.
func (r *Report) Incomplete() []string {
	var ids []string
	for _, f := range r.Features {
		if !f.Probed {
			ids = append(ids, f.ID)
		}
	}
	return ids
}

// catalogue fixes the order, names and purposes of the rows.
var catalogue = []struct{ id, name, usedFor string }{
	{BPFSyscall, "BPF syscall", "loading every kedge program and map"},
	{BPFJIT, "BPF JIT", "native-speed programs (the interpreter is several times slower)"},
	{BTF, "kernel BTF", "CO-RE relocations in every kedge program"},
	{TCX, "TCX link", "TC attach (preferred, 6.6+): hedging clones, monitoring"},
	{Clsact, "clsact + cls_bpf", "TC attach fallback before 6.6"},
	{XDPNative, "XDP native (veth)", "XDP fast path, reflectors in lab benchmarks"},
	{XDPGeneric, "XDP generic (veth)", "XDP fallback where the driver has no native mode"},
	{Timer, "bpf_timer", "hedging deadlines and expiry of pending requests"},
	{Ringbuf, "ringbuf map", "events to user space (hedges, latency samples)"},
	{SkbSetTstamp, "bpf_skb_set_tstamp", "delay line 'edt' (with fq)"},
	{RedirectNeigh, "bpf_redirect_neigh", "redirecting clones across routed (L3) fabrics"},
	{ForEachMapElem, "bpf_for_each_map_elem", "in-kernel sweeps of pending-request maps"},
	{Loop, "bpf_loop", "bounded loops over replicas without unrolling"},
	{ProgTestRun, "BPF_PROG_TEST_RUN", "packet fixture tests of kedge's programs"},
	{EnableStats, "BPF_ENABLE_STATS", "per-program run time and count in benchmarks"},
	{QdiscNetem, "qdisc netem", "delay line 'netem'"},
	{QdiscFq, "qdisc fq", "delay line 'edt' (with bpf_skb_set_tstamp)"},
	{QdiscTbf, "qdisc tbf", "delay line 'conveyor'"},
	{QdiscHtb, "qdisc htb", "rate-limited links in lab topologies"},
	{QdiscClsact, "qdisc clsact", "the TC hook for cls_bpf filters"},
}

// result is what one probe found.
type result struct {
	available, probed bool
	detail            string
}

func yes(detail string) result { return result{available: true, probed: true, detail: detail} }
func no(detail string) result  { return result{probed: true, detail: detail} }
func unknown(detail string) result {
	return result{detail: detail}
}

// fromErr classifies an error from a probe: nil is yes, ErrNotSupported (or an errno that
// means "the kernel does not know this") is no, a permission error is unknown.
func fromErr(err error, notSupported string) result {
	switch {
	case err == nil:
		return yes("")
	case errors.Is(err, ebpf.ErrNotSupported):
		if notSupported != "" {
			return no(notSupported)
		}
		return no(errText(err))
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		return unknown("permission denied (" + errnoName(err) + "): run as root")
	}
	return no(errText(err))
}

func errnoName(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return strings.ToUpper(unix.ErrnoName(errno))
	}
	return "error"
}

// errText renders err with the errno name appended, e.g. "... (ENOENT)".
func errText(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" && !strings.Contains(err.Error(), name) {
			return fmt.Sprintf("%v (%s)", err, strings.ToUpper(name))
		}
	}
	return err.Error()
}

// Run probes the running kernel. It returns an error only when ctx ends; features it cannot
// decide (e.g. without root) are reported with Probed false.
func Run(ctx context.Context) (*Report, error) {
	r := &Report{Kernel: uname()}
	found := map[string]result{}
	steps := []func(context.Context, map[string]result){probeBPF, probeNetns}
	for _, step := range steps {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("probe kernel: %w", err)
		}
		step(ctx, found)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("probe kernel: %w", err)
	}
	for _, c := range catalogue {
		res, ok := found[c.id]
		if !ok {
			res = unknown("not probed")
		}
		r.Features = append(r.Features, Feature{
			ID: c.id, Name: c.name, UsedFor: c.usedFor,
			Available: res.available, Probed: res.probed, Detail: res.detail,
		})
	}
	r.DelayLines = r.DelayLineBackends()
	r.Unsupported = r.UnsupportedReason()
	return r, nil
}

func uname() Kernel {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return Kernel{Release: "unknown"}
	}
	return Kernel{Release: unix.ByteSliceToString(u.Release[:]), Version: unix.ByteSliceToString(u.Version[:]), Machine: unix.ByteSliceToString(u.Machine[:])}
}

// KernelAtLeast reports whether a uname release such as "6.18.0-1-amd64" is at least
// major.minor; ok is false when the release cannot be parsed.
func KernelAtLeast(release string, major, minor int) (atLeast, ok bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false, false
	}
	maj, err1 := strconv.Atoi(parts[0])
	minStr := parts[1]
	if i := strings.IndexFunc(minStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minStr = minStr[:i]
	}
	mnr, err2 := strconv.Atoi(minStr)
	if err1 != nil || err2 != nil {
		return false, false
	}
	return maj > major || (maj == major && mnr >= minor), true
}

func isRoot() bool { return os.Geteuid() == 0 }
