package bench_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/hedgebench"
	"github.com/kedge-dev/kedge/internal/ppingbench"
	"github.com/kedge-dev/kedge/internal/raftbench"
	"github.com/kedge-dev/kedge/internal/sgbench"
)

// TestCommittedResultsReadable: every result.json under docs/results still decodes into
// its schema's type with no field unknown (the envelope keeps the first results' names),
// and writing it again keeps every field it had.
func TestCommittedResultsReadable(t *testing.T) {
	if bpftest.InGuest() {
		t.Skip("reads the repository's committed results (docs/results), which matrix guests do not have (runs on the host)")
	}
	types := map[string]func() any{
		bench.SchemaVersion:        func() any { return new(bench.Result) },
		hedgebench.RateSchema:      func() any { return new(hedgebench.RateResult) },
		hedgebench.MemcachedSchema: func() any { return new(hedgebench.MemcachedResult) },
		ppingbench.Schema:          func() any { return new(ppingbench.Result) },
		raftbench.Schema:           func() any { return new(raftbench.Result) },
		sgbench.Schema:             func() any { return new(sgbench.Result) },
		sgbench.TailSchema:         func() any { return new(sgbench.TailResult) },
		sgbench.LoopSchema:         func() any { return new(sgbench.LoopResult) },
	}
	var paths []string
	err := filepath.WalkDir(filepath.Join("..", "..", "docs", "results"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "result.json" {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no committed result under docs/results")
	}
	for _, p := range paths {
		env, err := bench.ReadEnvelope(p)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if env.Timestamp.IsZero() || env.Kernel == "" || env.Commit == "" || env.Machine.NProc == 0 {
			t.Errorf("%s: envelope incomplete: %+v", p, env)
		}
		newT, ok := types[env.Schema]
		if !ok {
			t.Errorf("%s: schema %q has no result type", p, env.Schema)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		v := newT()
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Errorf("%s (%s): %v", p, env.Schema, err)
			continue
		}
		if env.Schema == bench.SchemaVersion {
			if _, err := bench.ReadFile(p); err != nil {
				t.Errorf("bench.ReadFile: %v", err)
			}
		}
		// Round trip: the keys written are the keys read.
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var before, after map[string]any
		_ = json.Unmarshal(b, &before)
		_ = json.Unmarshal(again, &after)
		for k := range before {
			if _, ok := after[k]; !ok {
				t.Errorf("%s: field %q lost when written again", p, k)
			}
		}
	}
}
