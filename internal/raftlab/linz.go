package raftlab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
)

// kvState is the model's state for one key.
type kvState struct {
	Present bool
	Value   string
}

// KVModel is the sequential specification of the key-value API for Porcupine, partitioned
// by key (keys are independent registers, which keeps the search small):
//
//	get          returns found/value of the state
//	put v        state := v (an acknowledged put has no output to check)
//	del          state := absent
//	cas e -> v   if state == e (or absent with ExpectAbsent): state := v, ok;
//	             else unchanged, not ok, and a failed cas's reported current value must match
//
// An op with unknown outcome returns at the end of time, so it may be linearized anywhere
// after its call, including after every other op (= it never took effect); wherever it is
// placed its effect follows from the state, and nothing about its output is checked.
var KVModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(Op).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return kvState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(kvState), input.(Op), output.(Out)
		switch in.Kind {
		case Get:
			return out.Found == s.Present && (!s.Present || out.Value == s.Value), s
		case Put:
			return true, kvState{Present: true, Value: in.Value}
		case Del:
			return true, kvState{}
		case CAS:
			match := (in.ExpectAbsent && !s.Present) || (!in.ExpectAbsent && s.Present && s.Value == in.Expect)
			next := s
			if match {
				next = kvState{Present: true, Value: in.Value}
			}
			if out.Unknown {
				return true, next
			}
			if out.OK != match {
				return false, s
			}
			if !match && (out.Found != s.Present || (s.Present && out.Value != s.Value)) {
				return false, s
			}
			return true, next
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(Op), output.(Out)
		res := ""
		switch {
		case out.Unknown:
			res = "?"
		case in.Kind == Get && !out.Found:
			res = "absent"
		case in.Kind == Get:
			res = fmt.Sprintf("%q", out.Value)
		case in.Kind == CAS && out.OK:
			res = "ok"
		case in.Kind == CAS && out.Found:
			res = fmt.Sprintf("failed (is %q)", out.Value)
		case in.Kind == CAS:
			res = "failed (absent)"
		default:
			res = "ok"
		}
		switch in.Kind {
		case Get:
			return fmt.Sprintf("get(%s) -> %s [node %d]", in.Key, res, in.Node)
		case Put:
			return fmt.Sprintf("put(%s, %q) -> %s [node %d]", in.Key, in.Value, res, in.Node)
		case Del:
			return fmt.Sprintf("del(%s) -> %s [node %d]", in.Key, res, in.Node)
		}
		exp := fmt.Sprintf("%q", in.Expect)
		if in.ExpectAbsent {
			exp = "absent"
		}
		return fmt.Sprintf("cas(%s, %s -> %q) -> %s [node %d]", in.Key, exp, in.Value, res, in.Node)
	},
	DescribeState: func(state any) string {
		if s := state.(kvState); s.Present {
			return fmt.Sprintf("%q", s.Value)
		}
		return "absent"
	},
}

// Operations converts a history for Porcupine (unknown outcomes return at the end of time).
func Operations(ops []Op) []porcupine.Operation {
	out := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		ret := op.Return
		if op.Out.Unknown {
			ret = endOfTime
		}
		out[i] = porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: op.Out, Return: ret}
	}
	return out
}

// Verdict is a check's result.
type Verdict struct {
	Result  string        `json:"result"` // Ok, Illegal, or Unknown (the check timed out)
	Ops     int           `json:"ops"`
	Unknown int           `json:"unknown_outcomes"`
	Took    time.Duration `json:"took_ns"`
	// Written on Illegal (and Unknown) when a directory was given: the Porcupine
	// visualization (open it in a browser) and the history as JSON.
	HTML    string `json:"html,omitempty"`
	History string `json:"history,omitempty"`
}

// ErrNotLinearizable is returned by Check when the history is not linearizable.
var ErrNotLinearizable = errors.New("history is not linearizable")

// Check runs Porcupine over ops (at most timeout; 0 = no limit). When the result is not Ok
// and dir is not empty it writes dir/<name>.html and dir/<name>.json. The error is
// ErrNotLinearizable (wrapped, with the file names) for Illegal, a timeout error for Unknown.
func Check(ops []Op, timeout time.Duration, dir, name string) (Verdict, error) {
	v := Verdict{Ops: len(ops)}
	for _, op := range ops {
		if op.Out.Unknown {
			v.Unknown++
		}
	}
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(KVModel, Operations(ops), timeout)
	v.Took, v.Result = time.Since(start), string(res)
	if res == porcupine.Ok {
		return v, nil
	}
	var werr error
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			werr = fmt.Errorf("make result dir: %w", err)
		} else {
			v.HTML = filepath.Join(dir, name+".html")
			v.History = filepath.Join(dir, name+".json")
			werr = errors.Join(porcupine.VisualizePath(KVModel, info, v.HTML), WriteJSON(v.History, ops))
		}
	}
	if res == porcupine.Illegal {
		return v, errors.Join(fmt.Errorf("%w (%d ops; see %s, history %s)", ErrNotLinearizable, len(ops), v.HTML, v.History), werr)
	}
	return v, errors.Join(fmt.Errorf("linearizability check of %d ops timed out after %v: result unknown", len(ops), timeout), werr)
}
