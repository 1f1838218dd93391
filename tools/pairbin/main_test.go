package main

import (
	"encoding/json"
	"testing"
)

const doc = `{"rows": [
  {"method": "kedge", "fanout": 16, "rps": 100},
  {"method": "kedge", "fanout": 64, "rps": 40},
  {"method": "epoll", "fanout": 16, "rps": 80},
  {"method": "kedge", "fanout": 16, "rps": 120, "label": "x"}],
 "top": {"n": 3, "flag": true}}`

func TestLookup(t *testing.T) {
	var d any
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		mean bool
		want float64
		err  bool
	}{
		{path: "top.n", want: 3},
		{path: "rows[method=kedge,fanout=64].rps", want: 40},
		{path: "rows[method=kedge,fanout=16].rps", mean: true, want: 110}, // two match: their mean
		{path: "rows[method=kedge,fanout=16].rps", err: true},             // two match, no mean asked for
		{path: "rows[method=kedge,fanout=16,label=].rps", want: 100},      // the one without a label
		{path: "rows[method=kedge,fanout=16,label=x].rps", want: 120},
		{path: "rows[method=epoll].rps", want: 80},
		{path: "rows[method=none].rps", err: true},
		{path: "top.flag", err: true}, // not a number
		{path: "rows[method=kedge.rps", err: true},
		{path: "rows[method].rps", err: true},
		{path: "missing", err: true},
	} {
		got, err := Metric{Path: c.path, Mean: c.mean}.value(d)
		if c.err {
			if err == nil {
				t.Errorf("%s: got %v, want an error", c.path, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %v, %v; want %v", c.path, got, err, c.want)
		}
	}
}

func TestSummarise(t *testing.T) {
	spec := &Spec{Benches: []Bench{{Name: "x", Metrics: []Metric{{Name: "m"}}}}}
	runs := []Run{
		{Round: 1, Binary: "a", Bench: "x", Values: map[string]float64{"m": 100}},
		{Round: 1, Binary: "b", Bench: "x", Values: map[string]float64{"m": 110}},
		{Round: 2, Binary: "b", Bench: "x", Values: map[string]float64{"m": 90}},
		{Round: 2, Binary: "a", Bench: "x", Values: map[string]float64{"m": 100}},
		{Round: 3, Binary: "a", Bench: "x", Values: map[string]float64{"m": 50}},
		{Round: 3, Binary: "b", Bench: "x", Values: map[string]float64{"m": 50}},
	}
	s := summarise(spec, runs)
	if len(s) != 1 {
		t.Fatalf("got %d summaries", len(s))
	}
	if s[0].Median != 1 || s[0].Min != 0.9 || s[0].Max != 1.1 || len(s[0].Ratios) != 3 {
		t.Errorf("got %+v", s[0])
	}
}
