// Package bench holds what every kedge benchmark shares: the result envelope (schema, time,
// machine, kernel, commit, load, parameters) that every result.json starts with and its
// writer (WriteJSON), the process and CPU harness that drives a lab (harness.go), latency
// statistics, the text table of the thesis's Table 4.2 and the latency charts of its
// Figures 4.1 and 4.2.
//
// A benchmark's result type embeds Envelope and adds its measurements; NewEnvelope fills
// the envelope, WriteJSON writes the result, ReadEnvelope reads the envelope of any result
// file. The latency Result (one series per client) is written by each client (the Go clients
// in internal/chaos and the Python client in clients/apphedge.py write the same schema) and
// merged by the driver that runs a scenario; analysis works on the merged file.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/version"
)

// SchemaVersion names the layout of Result. Bump it on any incompatible change;
// ReadFile rejects files of another version.
const SchemaVersion = "kedge.bench/v1"

// Envelope is what every result file records about its run, whatever it measured: its
// schema, when, where (machine, kernel), at which commit, how busy the machine was, and the
// parameters. Result types embed it, so its fields sit at the top level of their JSON
// (the names are those of kedge's first results; committed results stay readable).
type Envelope struct {
	// Schema names the result's layout, e.g. "kedge.bench/v1"; bump it on incompatible changes.
	Schema string `json:"schema"`
	// Scenario names what was run within the benchmark, when it has several.
	Scenario  string    `json:"scenario,omitempty"`
	Timestamp time.Time `json:"timestamp"`
	Machine   Machine   `json:"machine"`
	// Kernel is `uname -r` of the machine the benchmark ran on.
	Kernel string `json:"kernel"`
	// Commit is the commit the kedge binary was built from (internal/version), else the
	// working directory's (git rev-parse HEAD), else "unknown".
	Commit string `json:"commit"`
	// LoadAvg is /proc/loadavg (1, 5, 15 min) when the result was started: other work on the
	// machine shows up in latency tails, so a result says how busy the machine was.
	LoadAvg    []float64      `json:"load_avg,omitempty"`
	Parameters map[string]any `json:"parameters,omitempty"`
}

// NewEnvelope starts the envelope of a result of schema (and scenario, may be empty) on
// this machine, now, at the commit of the running binary (or of the working directory's
// checkout when the binary does not know its own, as in go test).
func NewEnvelope(ctx context.Context, schema, scenario string, params map[string]any) Envelope {
	return Envelope{
		Schema:     schema,
		Scenario:   scenario,
		Timestamp:  time.Now().UTC().Truncate(time.Second),
		Machine:    LocalMachine(),
		Kernel:     KernelRelease(),
		Commit:     binaryCommit(ctx),
		LoadAvg:    LoadAvg(),
		Parameters: params,
	}
}

// Describe says where and when the result was measured, in one line for reports:
// "kernel K, CPU (N CPUs), commit C[, load average a b c at start]".
func (e Envelope) Describe() string {
	s := fmt.Sprintf("kernel %s, %s (%d CPUs), commit %.12s", e.Kernel, e.Machine.CPUModel, e.Machine.NProc, e.Commit)
	if len(e.LoadAvg) == 3 {
		s += fmt.Sprintf(", load average %.2f %.2f %.2f at start", e.LoadAvg[0], e.LoadAvg[1], e.LoadAvg[2])
	}
	return s
}

// ReadJSON decodes the result file at path into v (a result type, or an Envelope alone).
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read result: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode result %s: %w", path, err)
	}
	return nil
}

// ReadEnvelope reads the envelope of any kedge result file (its measurements are ignored).
func ReadEnvelope(path string) (Envelope, error) {
	var e Envelope
	if err := ReadJSON(path, &e); err != nil {
		return e, err
	}
	if e.Schema == "" {
		return e, fmt.Errorf("read result %s: no schema: not a kedge result", path)
	}
	return e, nil
}

// Result is one latency benchmark run (schema SchemaVersion): its envelope and one series
// per client.
type Result struct {
	Envelope
	Series []Series `json:"series"`
}

// Machine identifies the host a result comes from.
type Machine struct {
	Hostname string `json:"hostname"`
	CPUModel string `json:"cpu_model"`
	NProc    int    `json:"nproc"`
}

// Series is the per-request record of one client in one run. IDs, LatenciesUS and OK are
// parallel arrays in send order, warm-up requests excluded. A request that timed out has
// OK false and the time it waited (the timeout) as latency, so percentiles that reach into
// timeouts are lower bounds; Timeouts counts them.
type Series struct {
	// Name labels the series in tables and legends ("baseline", "app-hedged (Go)", ...).
	Name string `json:"name"`
	// Client names the program that produced it ("go-baseline", "go-apphedge", "py-apphedge").
	Client      string    `json:"client,omitempty"`
	IDs         []uint32  `json:"ids"`
	LatenciesUS []float64 `json:"latencies_us"`
	OK          []bool    `json:"ok"`
	Timeouts    int       `json:"timeouts"`
	// HedgesSent is the number of hedge copies sent, nil when the client cannot know (the
	// baseline client under the kernel hedger: the lab fills it from the hedger's counters).
	HedgesSent *int `json:"hedges_sent,omitempty"`
	// LateDuplicates counts responses received for an id that was already answered or
	// abandoned (the loser of a hedge race reaching the application).
	LateDuplicates int `json:"late_duplicates"`
	// Duplicates counts those of LateDuplicates whose request had been answered already
	// (its second answer); the others answer a request that had timed out.
	Duplicates int `json:"duplicates"`
	// Backend says where hedges went ("same", "alt replica", ...); empty when not hedging.
	Backend string `json:"backend,omitempty"`
	// ElapsedS is the wall time of the measured part of the run, in seconds.
	ElapsedS float64 `json:"elapsed_s,omitempty"`
}

// Requests is the number of measured requests in s.
func (s Series) Requests() int { return len(s.LatenciesUS) }

// Validate checks the invariants of the parallel arrays.
func (s Series) Validate() error {
	if s.Name == "" {
		return errors.New("validate series: empty name")
	}
	if len(s.IDs) != len(s.LatenciesUS) || len(s.OK) != len(s.LatenciesUS) {
		return fmt.Errorf("validate series %q: ids, latencies_us and ok differ in length (%d, %d, %d)",
			s.Name, len(s.IDs), len(s.LatenciesUS), len(s.OK))
	}
	timeouts := 0
	for _, ok := range s.OK {
		if !ok {
			timeouts++
		}
	}
	if timeouts != s.Timeouts {
		return fmt.Errorf("validate series %q: timeouts is %d but %d requests are not ok", s.Name, s.Timeouts, timeouts)
	}
	return nil
}

// NewResult starts a latency result for scenario on this machine, now.
func NewResult(ctx context.Context, scenario string, params map[string]any) Result {
	return Result{Envelope: NewEnvelope(ctx, SchemaVersion, scenario, params)}
}

// LoadAvg is the 1, 5 and 15 minute load averages of this machine, nil if unreadable.
func LoadAvg() []float64 { return loadAvg("/proc/loadavg") }

// loadAvg reads the three load averages of a /proc/loadavg-formatted file; nil if unreadable.
func loadAvg(path string) []float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		if out[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil
		}
	}
	return out
}

// LocalMachine describes this host. Fields it cannot read stay empty.
func LocalMachine() Machine {
	m := Machine{NProc: runtime.NumCPU()}
	m.Hostname, _ = os.Hostname()
	m.CPUModel = cpuModel("/proc/cpuinfo")
	return m
}

// cpuModel returns the first "model name" in a /proc/cpuinfo-formatted file.
func cpuModel(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// KernelRelease is `uname -r`, read from /proc; empty when unreadable.
func KernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// binaryCommit is the commit the running binary was built from, else the working
// directory's: a binary built elsewhere and run here reports its own code, not this tree's.
func binaryCommit(ctx context.Context) string {
	if c := version.Revision(); c != "" {
		return c
	}
	return Commit(ctx, "")
}

// Commit is `git rev-parse HEAD` in dir ("" for the working directory), or "unknown".
func Commit(ctx context.Context, dir string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "rev-parse", "HEAD")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// WriteFile writes r as indented JSON, replacing path atomically.
func (r Result) WriteFile(path string) error { return WriteJSON(path, r) }

// WriteJSON writes a result (any type embedding Envelope) as indented JSON, creating
// path's directory and replacing path atomically. It is the one writer of result files.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create result directory: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// ReadFile reads and validates a result file.
func ReadFile(path string) (Result, error) {
	var r Result
	if err := ReadJSON(path, &r); err != nil {
		return r, err
	}
	if r.Schema != SchemaVersion {
		return r, fmt.Errorf("read result %s: schema %q, want %q", path, r.Schema, SchemaVersion)
	}
	for _, s := range r.Series {
		if err := s.Validate(); err != nil {
			return r, fmt.Errorf("read result %s: %w", path, err)
		}
	}
	return r, nil
}

// Merge combines results into one: the first result's metadata, the series of all in order.
// Parameters that differ between inputs are kept per series name as "<series>.<key>"; the
// load average is the highest any input started with (the busiest the machine was known to be).
func Merge(rs ...Result) (Result, error) {
	if len(rs) == 0 {
		return Result{}, errors.New("merge results: nothing to merge")
	}
	out := rs[0]
	out.Series = nil
	out.Parameters = map[string]any{}
	seen := map[string]bool{}
	for _, r := range rs[1:] {
		if len(r.LoadAvg) == 3 {
			if len(out.LoadAvg) != 3 {
				out.LoadAvg = make([]float64, 3)
			}
			out.LoadAvg = []float64{max(out.LoadAvg[0], r.LoadAvg[0]), max(out.LoadAvg[1], r.LoadAvg[1]), max(out.LoadAvg[2], r.LoadAvg[2])}
		}
	}
	for _, r := range rs {
		for _, s := range r.Series {
			if seen[s.Name] {
				return Result{}, fmt.Errorf("merge results: two series named %q (give clients distinct --name)", s.Name)
			}
			seen[s.Name] = true
			out.Series = append(out.Series, s)
		}
	}
	for k := range rs[0].Parameters {
		same := true
		for _, r := range rs[1:] {
			if !sameJSON(r.Parameters[k], rs[0].Parameters[k]) {
				same = false
			}
		}
		if same {
			out.Parameters[k] = rs[0].Parameters[k]
		}
	}
	for _, r := range rs {
		for k, v := range r.Parameters {
			if _, ok := out.Parameters[k]; ok {
				continue
			}
			for _, s := range r.Series {
				out.Parameters[s.Name+"."+k] = v
			}
		}
	}
	return out, nil
}

func sameJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}
