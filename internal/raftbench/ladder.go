package raftbench

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The shortest safe election timeout under stress-disk is found by a ladder of runs, one
// system and timeout each (`--fe-until-change`: a run ends at its first leader change), so
// that each run has the machine's stress to itself. A ladder directory holds one result
// directory per run (false elections) and per failover run at the timeouts found.

// LadderDir is the committed ladder's directory under docs/results; LadderCommand makes one
// of its runs (system, timeout and directory vary from run to run).
const (
	LadderDir     = "raft-safe-timeout"
	LadderCommand = "kedge bench raft --offload etcd --scenarios false-elections --fe-phases stress-disk --tick 1ms --election-ticks 50 --fe-duration 10m --fe-until-change --out docs/results/raft-safe-timeout/etcd-50"
)

// ladderLabel names a run's system: its mode, with the kernel paths' lease and alive bound
// when the run set them (a configuration of its own).
func ladderLabel(r *Result, mode string) string {
	num := func(k string) float64 { v, _ := r.Parameters[k].(float64); return v }
	var set []string
	if v := num("heartbeat_lease_ms"); v > 0 && kernelHeartbeats(mode) {
		set = append(set, fmt.Sprintf("lease %g ms", v))
	}
	if v := num("offload_alive_ms"); v > 0 && kernelPaths(mode) {
		set = append(set, fmt.Sprintf("alive bound %g ms", v))
	}
	if len(set) == 0 && kernelPaths(mode) && adaptiveBound(r) {
		set = append(set, "adaptive bound")
	}
	if len(set) == 0 {
		return mode
	}
	return mode + " (" + strings.Join(set, ", ") + ")"
}

// adaptiveBound: the run's nodes reported the adaptive bound (its "bound" events, in the
// stall record); builds before it had the fixed default.
func adaptiveBound(r *Result) bool {
	for _, f := range r.FalseElections {
		if s := f.Stall; s != nil && s.Adaptive() {
			return true
		}
	}
	return false
}

// A timeout is safe when its run stayed quiet for the whole length asked for
// (--fe-duration: the 10 minutes, or a shorter length the table then names).

// runLengthS is the length a run asked for (its false_election_s), 600 if it did not say.
func runLengthS(r *Result) float64 {
	if v, ok := r.Parameters["false_election_s"].(float64); ok && v > 0 {
		return v
	}
	return 600
}

// minutes says a length in s as "10 minutes", "5 minutes", "90 s".
func minutes(s float64) string {
	if s >= 60 && int(s)%60 == 0 {
		return fmt.Sprintf("%d minutes", int(s)/60)
	}
	return fmt.Sprintf("%.0f s", s)
}

// ladderKernels names the kernels of runs (in the order run) with the runs on each, "" when
// they all ran on one: "kernels K1 (runs 1-5), K2 (runs 6-7)".
func ladderKernels(runs []*Result) string {
	var parts []string
	start := 0
	for i := 1; i <= len(runs); i++ {
		if i < len(runs) && runs[i].Kernel == runs[start].Kernel {
			continue
		}
		span := fmt.Sprintf("run %d", start+1)
		if i-1 > start {
			span = fmt.Sprintf("runs %d-%d", start+1, i)
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", runs[start].Kernel, span))
		start = i
	}
	if len(parts) < 2 {
		return ""
	}
	return "kernels " + strings.Join(parts, ", ")
}

// LadderFigures renders a ladder directory: every false-election run in the order run, the
// shortest safe timeout of each system with its ratio to etcd's, and the failover runs.
func LadderFigures(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var runs, failovers []*Result
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		r, err := ReadResult(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", err
		}
		if len(r.FalseElections) > 0 {
			runs = append(runs, r)
		}
		if len(r.Failover) > 0 {
			failovers = append(failovers, r)
		}
	}
	if len(runs) == 0 {
		return "", fmt.Errorf("%s: no false-election run: %w", dir, os.ErrNotExist)
	}
	byTime := func(a, b *Result) int { return a.Timestamp.Compare(b.Timestamp) }
	slices.SortFunc(runs, byTime)
	slices.SortFunc(failovers, byTime)
	var b strings.Builder
	first, last := runs[0], runs[len(runs)-1]
	head := *first // the runs' common configuration: each run's timeout is in its row
	head.Parameters = maps.Clone(first.Parameters)
	delete(head.Parameters, "election_ticks")
	end := last.Timestamp.Format("15:04 UTC")
	if last.Timestamp.YearDay() != first.Timestamp.YearDay() || last.Timestamp.Year() != first.Timestamp.Year() {
		end = last.Timestamp.Format("2006-01-02 15:04 UTC")
	}
	where := strings.Split(first.Describe(), ", load average")[0]
	if k := ladderKernels(runs); k != "" {
		where = strings.Replace(where, "kernel "+first.Kernel, k, 1)
	}
	fmt.Fprintf(&b, "%s to %s, %s; each run %s.\n", first.Timestamp.Format("2006-01-02 15:04"), end, where, configuration(&head))
	b.WriteString("\n| Run | System | Election timeout | Ran | Leader changes (term +) | Load at start / end | Writes acknowledged / failed | Stalled node's slow saves, p50 / max | Other nodes' longest save | WAL fsyncs over 100 ms, stalled node / the others (longest, at most) | Stalled node stopped answering: saves judged, heard late at the earliest (latest) reading | Commit |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	safe := map[string]float64{}
	var order []string
	for i, r := range runs {
		for _, f := range r.FalseElections {
			stall, others, judged, fsyncs := "-", "-", "-", "-"
			if w := f.WALFsync; w != nil {
				longest := func(ms float64, beyond bool) string {
					if beyond {
						return fmt.Sprintf("> %.0f ms", ms)
					}
					return fmt.Sprintf("%.0f ms", ms)
				}
				fsyncs = fmt.Sprintf("%d of %d (%s) / %d of %d (%s)", w.Slow, w.Fsyncs, longest(w.MaxLeMs, w.MaxBeyond), w.OtherSlow, w.OtherFsyncs, longest(w.OtherMaxLeMs, w.OtherMaxBeyond))
			}
			if s := f.Stall; s != nil {
				stall = fmt.Sprintf("%d, %.0f / %.0f ms", s.SlowSaves, s.SaveP50Ms, s.SaveMaxMs)
				others = fmt.Sprintf("%.0f ms", s.OtherSaveMaxMs)
				judged = fmt.Sprintf("%d, %d (%d maybe); last word at most %.0f ms (%.0f ms) after a save began; bound %s", s.Judged, s.Late, s.LateMaybe, s.LastWordMaxMs, s.LastWordMaxLateMs, s.BoundText())
				if s.Judged > 0 && s.LastWordMaxLateMs == 0 { // a record of before the two readings: the latest only
					judged = fmt.Sprintf("%d, - (%d maybe); last word at most - (%.0f ms) after a save began; bound %s", s.Judged, s.Late, s.LastWordMaxMs, s.BoundText())
				}
			}
			load := LoadSpan(f)
			if load == "-" && len(r.LoadAvg) == 3 { // a run of before the per-phase load: the bench's start
				load = fmt.Sprintf("%.1f / -", r.LoadAvg[0])
			}
			label := ladderLabel(r, f.Offload)
			fmt.Fprintf(&b, "| %d | %s | %.0f ms | %.0f s | %d (%d) | %s | %d / %d | %s | %s | %s | %s | %.7s |\n", i+1, label, f.ElectionTimeoutMs, f.DurationS,
				f.LeaderChanges, f.TermIncrease, load, f.Writes, f.WriteErrors, stall, others, fsyncs, judged, r.Commit)
			if !slices.Contains(order, label) {
				order = append(order, label)
			}
			if f.LeaderChanges == 0 && f.TermIncrease == 0 && f.DurationS >= runLengthS(r)-1 && (safe[label] == 0 || f.ElectionTimeoutMs < safe[label]) {
				safe[label] = f.ElectionTimeoutMs
			}
		}
	}
	var lengths []string
	for _, r := range runs {
		if l := minutes(runLengthS(r)); !slices.Contains(lengths, l) {
			lengths = append(lengths, l)
		}
	}
	fmt.Fprintf(&b, "\n| System | Shortest safe timeout (no leader or term change in a whole run of %s) | Timeouts run | / etcd's |\n|---|---:|---|---:|\n", strings.Join(lengths, " or "))
	for _, m := range order {
		var tried []string
		for _, r := range runs {
			for _, f := range r.FalseElections {
				if ladderLabel(r, f.Offload) == m {
					verdict := "quiet"
					switch {
					case f.LeaderChanges == 0 && f.TermIncrease == 0:
					case f.UntilChange:
						verdict = fmt.Sprintf("a change after %.0f s", f.DurationS)
					default:
						verdict = fmt.Sprintf("%d changes (term +%d) in %.0f s", f.LeaderChanges, f.TermIncrease, f.DurationS)
					}
					tried = append(tried, fmt.Sprintf("%.0f ms: %s", f.ElectionTimeoutMs, verdict))
				}
			}
		}
		s, ratio := "none of those run", "-"
		if v := safe[m]; v > 0 {
			s = fmt.Sprintf("%.0f ms", v)
			if e := safe[ModeEtcd]; e > 0 && m != ModeEtcd {
				ratio = fmt.Sprintf("%.2fx", v/e)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", m, s, strings.Join(tried, "; "), ratio)
	}
	for _, r := range failovers {
		r.FalseElections, r.Throughput, r.ThroughputRuns, r.ThroughputCompare, r.Heartbeats = nil, nil, nil, nil, nil
		body, err := renderResult(r, false)
		if err != nil {
			return "", err
		}
		b.WriteString("\nFailover, " + body)
	}
	return b.String(), nil
}
