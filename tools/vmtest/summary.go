package main

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// logPrefixRe matches the "file_test.go:12: " that go test puts before a log entry.
var logPrefixRe = regexp.MustCompile(`^\S+\.go:\d+: `)

// printSummary writes the per-kernel, per-package table, the problems, the skip reasons
// and a closing "N passed, N failed, N skipped" line.
func printSummary(w io.Writer, results []*kernelResult) {
	fmt.Fprintln(w, "\n== vmtest summary")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KERNEL\tDEBIAN PACKAGE\tBOOT\tRUN\tPACKAGE\tPASS\tFAIL\tSKIP\tRC\tTIME\tSTATUS")
	var pass, fail, skip int
	for _, r := range results {
		head := fmt.Sprintf("%s\t%s\t%s\t%s", r.Kernel, r.Package, seconds(r.BootTime), seconds(r.Duration))
		if len(r.Pkgs) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t%s\n", head, r.Status())
		}
		for _, p := range r.Pkgs {
			rc := fmt.Sprint(p.RC)
			if !p.Ended {
				rc = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", head, p.Pkg, p.Pass, p.Fail, p.Skip, rc, seconds(p.Duration), p.Status())
			pass, fail, skip = pass+p.Pass, fail+p.Fail, skip+p.Skip
		}
	}
	tw.Flush()
	printProblems(w, results)
	printSkips(w, results)
	fmt.Fprintf(w, "\nvmtest: %d passed, %d failed, %d skipped\n", pass, fail, skip)
}

func seconds(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// printProblems explains every run that did not end "ok".
func printProblems(w io.Writer, results []*kernelResult) {
	var lines []string
	for _, r := range results {
		add := func(format string, args ...any) {
			lines = append(lines, fmt.Sprintf("  [%s] ", r.Kernel)+fmt.Sprintf(format, args...))
		}
		if r.TimedOut {
			add("timed out after %s; qemu was killed%s", seconds(r.Duration), runningPkg(r))
		}
		if r.RunErr != nil {
			add("%v", r.RunErr)
		}
		if !r.TimedOut && r.RunErr == nil && (!r.Booted || !r.Done) {
			add("guest stopped before finishing (booted=%v)%s - see the console above", r.Booted, runningPkg(r))
		}
		for _, s := range r.SetupFailed {
			add("setup failed: %s", s)
		}
		for i, b := range r.BootPanics {
			add("boot %d panicked before any test started and was repeated (not a failure): %s", i+1, b)
		}
		for _, b := range r.KernelBugs {
			add("kernel: %s", b)
		}
		for _, m := range countModprobes(r.Modprobe, false) {
			add("kernel asked for a module the guest lacks (modprobe %s): add it to guestModules in tools/vmtest/kernels.go if a test needs it", m)
		}
		for _, b := range r.KernelWarns {
			add("kernel warning (not a failure): %s", b)
		}
		for _, p := range r.Pkgs {
			if len(p.Failed) > 0 {
				add("%s: failed: %s", p.Pkg, strings.Join(p.Failed, ", "))
			}
			if p.Panic != "" {
				add("%s: %s", p.Pkg, p.Panic)
			}
			if p.Ended && p.RC != 0 && p.Fail == 0 && p.Panic == "" {
				add("%s: test binary exited %d without a failed test (panic, bad flag or TestMain) - see the console above", p.Pkg, p.RC)
			}
		}
	}
	if len(lines) > 0 {
		fmt.Fprintln(w, "\nProblems:")
		fmt.Fprintln(w, strings.Join(lines, "\n"))
	}
	var notes []string
	for _, r := range results {
		for _, m := range countModprobes(r.Modprobe, true) {
			notes = append(notes, fmt.Sprintf("  [%s] modprobe %s", r.Kernel, m))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nModule requests the tests do not need (not problems):")
		fmt.Fprintln(w, strings.Join(notes, "\n"))
	}
}

// unneededModules are modules the guests' kernels ask for that no test needs, by a
// substring of the request, with the reason.
var unneededModules = []struct{ match, why string }{
	{"net-pf-2-proto-262", "IPPROTO_MPTCP: Go's TCP listeners try MPTCP first and fall back to TCP"},
	{"net-pf-10-proto-262", "IPPROTO_MPTCP: Go's TCP listeners try MPTCP first and fall back to TCP"},
	{"bpf_preload", "mounting a BPF filesystem tries the preload module (pinned iterators; not used)"},
	{"kedgenosuch", "internal/bpfx asks for a qdisc kind that does not exist, on purpose"},
}

// countModprobes returns the module requests, each once with its count ("args (N times)"),
// in the order first seen: the unneeded ones (with their reason) or the others.
func countModprobes(reqs []string, unneeded bool) []string {
	count := map[string]int{}
	var order []string
	for _, m := range reqs {
		if count[m] == 0 {
			order = append(order, m)
		}
		count[m]++
	}
	var out []string
	for _, m := range order {
		why := ""
		for _, u := range unneededModules {
			if strings.Contains(m, u.match) {
				why = u.why
			}
		}
		if (why != "") != unneeded {
			continue
		}
		line := m
		if count[m] > 1 {
			line += fmt.Sprintf(" (%d times)", count[m])
		}
		if why != "" {
			line += ": " + why
		}
		out = append(out, line)
	}
	return out
}

// runningPkg names the package whose binary was running when the guest stopped.
func runningPkg(r *kernelResult) string {
	for _, p := range r.Pkgs {
		if !p.Ended {
			return fmt.Sprintf(" while %s was running", p.Pkg)
		}
	}
	return ""
}

// printSkips lists skipped tests grouped by reason (with go test's file:line removed),
// most frequent first.
func printSkips(w io.Writer, results []*kernelResult) {
	type group struct {
		reason string
		where  []string
	}
	byReason := map[string]*group{}
	for _, r := range results {
		for _, p := range r.Pkgs {
			for _, s := range p.Skips {
				reason := logPrefixRe.ReplaceAllString(s.Reason, "")
				g := byReason[reason]
				if g == nil {
					g = &group{reason: reason}
					byReason[reason] = g
				}
				g.where = append(g.where, fmt.Sprintf("[%s] %s %s", r.Kernel, p.Pkg, s.Test))
			}
		}
	}
	if len(byReason) == 0 {
		return
	}
	groups := make([]*group, 0, len(byReason))
	for _, g := range byReason {
		groups = append(groups, g)
	}
	sort.Slice(groups, func(i, j int) bool {
		if len(groups[i].where) != len(groups[j].where) {
			return len(groups[i].where) > len(groups[j].where)
		}
		return groups[i].reason < groups[j].reason
	})
	fmt.Fprintln(w, "\nSkipped, by reason:")
	for _, g := range groups {
		fmt.Fprintf(w, "  %3d  %s\n", len(g.where), g.reason)
		for _, x := range g.where {
			fmt.Fprintf(w, "         %s\n", x)
		}
	}
}
