package hedgebench

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kedge-dev/kedge/internal/bench"
)

// RateHold is one run merged into a rate result (MergeRate): a stretch of rounds under one
// hold of the benchmark lock.
type RateHold struct {
	Dir       string    `json:"dir"`
	Timestamp string    `json:"timestamp"`
	LoadAvg   []float64 `json:"load_avg"`
	Rounds    int       `json:"rounds"`
	// FirstRound is the merged round number of the hold's first round.
	FirstRound int `json:"first_round"`
}

// MergeRate merges rate results (each dir holds a result.json of the rate scenario) into
// one: runs of one binary with the same parameters, split over several holds of the
// benchmark lock so that no hold is long. The rounds are numbered on across the holds, the
// paired figures recomputed over all of them; the envelope is the first hold's (its
// timestamp and load), parameters "rounds" is the total and "holds" lists every hold's
// time, load and rounds. The programs' run times and the idle CPU are the holds' means.
func MergeRate(dirs []string, outDir string) (RateResult, error) {
	var res RateResult
	if len(dirs) < 2 {
		return res, errors.New("merge: at least two rate results")
	}
	var holds []RateHold
	next := 1 // the merged number of the next hold's first round
	prog := map[string][]ProgTime{}
	idle := map[string][]float64{}
	for i, dir := range dirs {
		var r RateResult
		if err := bench.ReadJSON(filepath.Join(dir, "result.json"), &r); err != nil {
			return res, err
		}
		if r.Schema != RateSchema {
			return res, fmt.Errorf("merge: %s: schema %q, want %q", dir, r.Schema, RateSchema)
		}
		rounds := 0
		for _, run := range r.Runs {
			rounds = max(rounds, run.Round)
		}
		if i == 0 {
			res = r
			res.Runs, res.Prog, res.IdleCPU = nil, nil, map[string]float64{}
			res.Parameters = maps.Clone(r.Parameters)
		} else if err := sameRateRun(res, r); err != nil {
			return res, fmt.Errorf("merge: %s: %w", dir, err)
		}
		first := next
		next += rounds
		for _, run := range r.Runs {
			run.Round += first - 1
			res.Runs = append(res.Runs, run)
		}
		for _, p := range r.Prog {
			prog[p.Arm] = append(prog[p.Arm], p)
		}
		for arm, v := range r.IdleCPU {
			idle[arm] = append(idle[arm], v)
		}
		holds = append(holds, RateHold{Dir: filepath.Base(dir), Timestamp: r.Timestamp.UTC().Format("2006-01-02T15:04:05Z"),
			LoadAvg: r.LoadAvg, Rounds: rounds, FirstRound: first})
	}
	res.Parameters["rounds"] = next - 1
	res.Parameters["holds"] = holds
	for _, arm := range res.Arms {
		if v := idle[arm]; len(v) > 0 {
			res.IdleCPU[arm] = mean(v)
		}
		ps := prog[arm]
		if len(ps) == 0 {
			continue
		}
		m := ProgTime{Arm: arm, Counters: map[string]uint64{}}
		var split, resp []float64
		for _, p := range ps {
			m.Requests += p.Requests
			split, resp = append(split, p.SplitNS), append(resp, p.RespNS)
			for k, v := range p.Counters {
				m.Counters[k] += v
			}
		}
		m.SplitNS, m.RespNS = mean(split), mean(resp)
		res.Prog = append(res.Prog, m)
	}
	levels := make([]int, 0, len(res.Levels))
	for _, l := range res.Levels {
		levels = append(levels, l.Concurrency)
	}
	res.Levels, res.Chaos = rateLevels(res.Runs, levels, res.Arms), chaosChecks(res.Runs, res.Arms)
	if err := bench.WriteJSON(filepath.Join(outDir, "result.json"), res); err != nil {
		return res, err
	}
	return res, writeRateCharts(outDir, res)
}

// sameRateRun: b ran the binary, arms and parameters (but the rounds) of a.
func sameRateRun(a, b RateResult) error {
	if a.Commit != b.Commit || a.Kernel != b.Kernel || a.Backend != b.Backend {
		return fmt.Errorf("commit %.12s, kernel %s, backend %s: not %.12s, %s, %s", b.Commit, b.Kernel, b.Backend, a.Commit, a.Kernel, a.Backend)
	}
	if !slices.Equal(a.Arms, b.Arms) {
		return fmt.Errorf("arms %v, not %v", b.Arms, a.Arms)
	}
	for k, v := range b.Parameters {
		if k != "rounds" && fmt.Sprint(v) != fmt.Sprint(a.Parameters[k]) {
			return fmt.Errorf("parameter %s %v, not %v", k, v, a.Parameters[k])
		}
	}
	if len(a.Parameters) != len(b.Parameters) {
		return fmt.Errorf("parameters %v, not %v", slices.Sorted(maps.Keys(b.Parameters)), slices.Sorted(maps.Keys(a.Parameters)))
	}
	return nil
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// holdsNote says how a merged result's rounds were split over holds of the lock (MergeRate),
// "" for a result of one run.
func holdsNote(r RateResult) string {
	var hs []RateHold
	if b, err := json.Marshal(r.Parameters["holds"]); err != nil || json.Unmarshal(b, &hs) != nil || len(hs) == 0 {
		return ""
	}
	var parts []string
	for _, h := range hs {
		load := "?"
		if len(h.LoadAvg) > 0 {
			load = fmt.Sprint(h.LoadAvg[0])
		}
		parts = append(parts, fmt.Sprintf("%d rounds from %s, load %s", h.Rounds, h.Timestamp, load))
	}
	return fmt.Sprintf("%v rounds in %d holds of the benchmark lock, each alternating every arm (%s)", r.Parameters["rounds"], len(hs), strings.Join(parts, "; "))
}
