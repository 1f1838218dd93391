// Command pairbin compares two kedge binaries side by side in one sitting: it runs the same
// benchmarks with each, alternating which goes first in every round (A B, B A, A B, ...),
// reads each run's result.json and prints, per metric, every round's B/A ratio and their
// median; -out gets every run's files, pairbin.json (all values) and summary.md (the table,
// with the machine, kernel and both commits). It is how a change that should not move speed
// (a restructure) shows that it did not: both binaries see the same machine in the same
// minutes.
//
//	go run ./tools/pairbin -a /tmp/kedge-before -b bin/kedge -rounds 3 \
//	    -out /tmp/paired -spec tools/pairbin/restructure.json
//
// restructure.json is the restructure's set (hedge rate, sg at fan-out 16, raft throughput);
// hedge-stored.json a short look at the hedger's stored path alone: the stored arm beside
// idle-nocarry (the hedger attached, its traffic not hedged) and unhedged, at 1 and 64 loops.
//
// The spec names the benchmarks (arguments after the binary; "{out}" is replaced by the
// run's own directory) and the metrics read from their result.json. A metric's path is a
// dot-separated walk through the JSON: a field name, or name[key=value,...] to select the
// elements of a list whose fields match (numbers compare by value; key= with no value
// selects the elements that lack the field, as runs of older binaries do). A path must select one
// value, unless the metric says "mean": true (then their mean): a filter that also matched
// another run (the hedge benchmark's stall check at the same level, raft's second routing)
// would otherwise blend two measurements into one figure without a word.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
)

// Spec is the -spec file.
type Spec struct {
	Benches []Bench `json:"benches"`
}

// Bench is one benchmark command and the metrics it yields.
type Bench struct {
	Name    string   `json:"name"`
	Args    []string `json:"args"`
	Metrics []Metric `json:"metrics"`
	// Result is where the run writes result.json, relative to its directory
	// (default "result.json"; the hedge benchmark writes <scenario>/result.json).
	Result string `json:"result"`
}

// Metric is one figure read from a run's result.json.
type Metric struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Better is "higher" or "lower": printed beside the ratio so a reader knows which
	// way is a regression.
	Better string `json:"better"`
	// Mean allows a path that selects several values and takes their mean.
	Mean bool `json:"mean,omitempty"`
}

// Run is one benchmark run of one binary in one round.
type Run struct {
	Round   int                `json:"round"`
	Order   int                `json:"order"` // 0: ran first in its round
	Binary  string             `json:"binary"`
	Bench   string             `json:"bench"`
	Dir     string             `json:"dir"`
	Seconds float64            `json:"seconds"`
	Values  map[string]float64 `json:"values"`
}

// Summary is one metric's paired comparison.
type Summary struct {
	Bench  string    `json:"bench"`
	Metric string    `json:"metric"`
	Better string    `json:"better"`
	A      []float64 `json:"a"`
	B      []float64 `json:"b"`
	Ratios []float64 `json:"ratios"` // B/A per round
	Median float64   `json:"median_ratio"`
	Min    float64   `json:"min_ratio"`
	Max    float64   `json:"max_ratio"`
}

// Result is what pairbin writes to <out>/pairbin.json.
type Result struct {
	Schema    string        `json:"schema"`
	Timestamp string        `json:"timestamp"`
	A         Binary        `json:"a"`
	B         Binary        `json:"b"`
	Rounds    int           `json:"rounds"`
	Kernel    string        `json:"kernel"`
	Machine   bench.Machine `json:"machine"`
	Runs      []Run         `json:"runs"`
	Summary   []Summary     `json:"summary"`
}

// Binary names a compared binary by its path and the commit it reports.
type Binary struct {
	Path    string `json:"path"`
	Version string `json:"version"`
}

func main() {
	a := flag.String("a", "", "binary A (the reference, e.g. the build before a change)")
	b := flag.String("b", "", "binary B (compared with A: ratios are B/A)")
	rounds := flag.Int("rounds", 3, "rounds; each runs every benchmark with both binaries, the order alternating")
	out := flag.String("out", "", "directory for every run's output and pairbin.json")
	specPath := flag.String("spec", "", "JSON file naming the benchmarks and metrics")
	only := flag.String("from", "", "summarise an earlier pairbin.json (nothing is run)")
	flag.Parse()
	if err := run(*a, *b, *rounds, *out, *specPath, *only); err != nil {
		fmt.Fprintln(os.Stderr, "pairbin:", err)
		os.Exit(1)
	}
}

func run(a, b string, rounds int, out, specPath, from string) error {
	if from != "" {
		var res Result
		if err := readJSON(from, &res); err != nil {
			return err
		}
		printSummary(os.Stdout, &res)
		return nil
	}
	if a == "" || b == "" || out == "" || specPath == "" {
		return fmt.Errorf("-a, -b, -out and -spec are required (or -from FILE)")
	}
	if rounds < 1 {
		return fmt.Errorf("-rounds %d: need at least 1", rounds)
	}
	var spec Spec
	if err := readJSON(specPath, &spec); err != nil {
		return err
	}
	if len(spec.Benches) == 0 {
		return fmt.Errorf("%s names no benchmark", specPath)
	}
	res := Result{Schema: "kedge.pairbin/v1", Timestamp: time.Now().UTC().Format(time.RFC3339), Rounds: rounds}
	var err error
	if res.A, err = describe(a); err != nil {
		return err
	}
	if res.B, err = describe(b); err != nil {
		return err
	}
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		res.Kernel = strings.TrimSpace(string(k))
	}
	res.Machine = bench.LocalMachine()
	bins := map[string]string{"a": a, "b": b}
	for r := 1; r <= rounds; r++ {
		for _, bench := range spec.Benches {
			order := []string{"a", "b"}
			if r%2 == 0 {
				order = []string{"b", "a"}
			}
			for i, which := range order {
				dir := filepath.Join(out, bench.Name, fmt.Sprintf("round-%d", r), which)
				run, err := runOnce(bins[which], bench, dir)
				if err != nil {
					return fmt.Errorf("round %d, %s, binary %s: %w", r, bench.Name, which, err)
				}
				run.Round, run.Order, run.Binary = r, i, which
				res.Runs = append(res.Runs, run)
				fmt.Fprintf(os.Stderr, "pairbin: round %d %s %s: %.0f s %v\n", r, bench.Name, which, run.Seconds, run.Values)
			}
		}
	}
	res.Summary = summarise(&spec, res.Runs)
	f, err := os.Create(filepath.Join(out, "pairbin.json"))
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&res); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	var md strings.Builder
	printSummary(&md, &res)
	if err := os.WriteFile(filepath.Join(out, "summary.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	fmt.Print(md.String())
	return nil
}

func describe(bin string) (Binary, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return Binary{}, err
	}
	v, err := exec.Command(abs, "version").Output()
	if err != nil {
		return Binary{}, fmt.Errorf("%s version: %w", bin, err)
	}
	first, _, _ := strings.Cut(string(v), "\n")
	return Binary{Path: abs, Version: strings.TrimSpace(first)}, nil
}

func runOnce(bin string, bench Bench, dir string) (Run, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Run{}, err
	}
	args := make([]string, len(bench.Args))
	for i, s := range bench.Args {
		args[i] = strings.ReplaceAll(s, "{out}", dir)
	}
	log, err := os.Create(filepath.Join(dir, "run.log"))
	if err != nil {
		return Run{}, err
	}
	defer log.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return Run{}, fmt.Errorf("%s %s: %w (log: %s)", bin, strings.Join(args, " "), err, log.Name())
	}
	run := Run{Bench: bench.Name, Dir: dir, Seconds: time.Since(start).Seconds(), Values: map[string]float64{}}
	var doc any
	result := bench.Result
	if result == "" {
		result = "result.json"
	}
	if err := readJSON(filepath.Join(dir, result), &doc); err != nil {
		return Run{}, err
	}
	for _, m := range bench.Metrics {
		v, err := m.value(doc)
		if err != nil {
			return Run{}, fmt.Errorf("metric %s: %w", m.Name, err)
		}
		run.Values[m.Name] = v
	}
	return run, nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// value is the metric's figure in doc: the one number its path selects, or with Mean the
// mean of those it selects.
func (m Metric) value(doc any) (float64, error) {
	vs, err := lookup(doc, m.Path)
	if err != nil {
		return 0, err
	}
	if len(vs) > 1 && !m.Mean {
		return 0, fmt.Errorf("%q selects %d values: add a key=value that tells them apart, or \"mean\": true", m.Path, len(vs))
	}
	sum := 0.0
	for _, v := range vs {
		sum += v
	}
	return sum / float64(len(vs)), nil
}

// lookup walks path through doc and returns the numbers it selects.
func lookup(doc any, path string) ([]float64, error) {
	cur := []any{doc}
	for _, seg := range strings.Split(path, ".") {
		name, filter, err := parseSegment(seg)
		if err != nil {
			return nil, err
		}
		var next []any
		for _, v := range cur {
			obj, ok := v.(map[string]any)
			if !ok {
				continue
			}
			field, ok := obj[name]
			if !ok {
				continue
			}
			if filter == nil {
				next = append(next, field)
				continue
			}
			list, _ := field.([]any)
			for _, el := range list {
				if matches(el, filter) {
					next = append(next, el)
				}
			}
		}
		if len(next) == 0 {
			return nil, fmt.Errorf("%q selects nothing at %q", path, seg)
		}
		cur = next
	}
	out := make([]float64, 0, len(cur))
	for _, v := range cur {
		f, ok := v.(float64)
		if !ok {
			return nil, fmt.Errorf("%q selects a %T, not a number", path, v)
		}
		out = append(out, f)
	}
	return out, nil
}

func parseSegment(seg string) (string, map[string]string, error) {
	name, rest, ok := strings.Cut(seg, "[")
	if !ok {
		return seg, nil, nil
	}
	if !strings.HasSuffix(rest, "]") {
		return "", nil, fmt.Errorf("segment %q: missing ]", seg)
	}
	filter := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(rest, "]"), ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return "", nil, fmt.Errorf("segment %q: %q is not key=value", seg, kv)
		}
		filter[k] = v
	}
	return name, filter, nil
}

func matches(el any, filter map[string]string) bool {
	obj, ok := el.(map[string]any)
	if !ok {
		return false
	}
	for k, want := range filter {
		switch got := obj[k].(type) {
		case string:
			if got != want {
				return false
			}
		case float64:
			w, err := strconv.ParseFloat(want, 64)
			if err != nil || w != got {
				return false
			}
		case bool:
			if strconv.FormatBool(got) != want {
				return false
			}
		case nil: // the field is missing (or null)
			if want != "" {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func summarise(spec *Spec, runs []Run) []Summary {
	var out []Summary
	for _, bench := range spec.Benches {
		for _, m := range bench.Metrics {
			s := Summary{Bench: bench.Name, Metric: m.Name, Better: m.Better}
			byRound := map[int][2]float64{}
			for _, r := range runs {
				if r.Bench != bench.Name {
					continue
				}
				p := byRound[r.Round]
				if r.Binary == "a" {
					p[0] = r.Values[m.Name]
				} else {
					p[1] = r.Values[m.Name]
				}
				byRound[r.Round] = p
			}
			rounds := make([]int, 0, len(byRound))
			for r := range byRound {
				rounds = append(rounds, r)
			}
			slices.Sort(rounds)
			for _, r := range rounds {
				p := byRound[r]
				s.A, s.B = append(s.A, p[0]), append(s.B, p[1])
				if p[0] != 0 {
					s.Ratios = append(s.Ratios, p[1]/p[0])
				}
			}
			if len(s.Ratios) > 0 {
				sorted := slices.Clone(s.Ratios)
				slices.Sort(sorted)
				s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
				n := len(sorted)
				s.Median = sorted[n/2]
				if n%2 == 0 {
					s.Median = (sorted[n/2-1] + sorted[n/2]) / 2
				}
			}
			out = append(out, s)
		}
	}
	return out
}

func printSummary(w io.Writer, res *Result) {
	fmt.Fprintf(w, "A: %s\nB: %s\n", res.A.Version, res.B.Version)
	if m := res.Machine; m.NProc > 0 {
		fmt.Fprintf(w, "machine %s (%s, %d CPUs), ", m.Hostname, m.CPUModel, m.NProc)
	}
	fmt.Fprintf(w, "kernel %s, %s, %d rounds, order alternating (A first in odd rounds)\n\n", res.Kernel, res.Timestamp, res.Rounds)
	fmt.Fprintf(w, "| benchmark | metric | better | A per round | B per round | B/A median [min-max] |\n|---|---|---|---|---|---|\n")
	for _, s := range res.Summary {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.3f [%.3f-%.3f] |\n", s.Bench, s.Metric, s.Better, nums(s.A), nums(s.B), s.Median, s.Min, s.Max)
	}
}

func nums(v []float64) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = strconv.FormatFloat(f, 'g', 4, 64)
	}
	return strings.Join(s, ", ")
}
