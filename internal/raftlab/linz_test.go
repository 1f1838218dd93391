package raftlab

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func op(client int, k Kind, key string, call, ret int64, args ...string) Op {
	o := Op{Client: client, Kind: k, Key: key, Call: call, Return: ret}
	switch k {
	case Put:
		o.Value = args[0]
	case CAS:
		o.Expect, o.Value = args[0], args[1]
	}
	return o
}

func got(o Op, v string) Op                   { o.Out = Out{Found: true, Value: v}; return o }
func absent(o Op) Op                          { o.Out = Out{}; return o }
func ok(o Op) Op                              { o.Out.OK = true; return o }
func unknown(o Op) Op                         { o.Out = Out{Unknown: true, Err: "timeout"}; return o }
func casFailed(o Op, found bool, v string) Op { o.Out = Out{Found: found, Value: v}; return o }

func TestCheckSynthetic(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []Op
		ok   bool
	}{
		{"sequential", []Op{ok(op(0, Put, "a", 0, 10, "1")), got(op(1, Get, "a", 20, 30), "1")}, true},
		{"read before any write", []Op{absent(op(0, Get, "a", 0, 10)), ok(op(1, Put, "a", 20, 30, "1"))}, true},
		{"stale read", []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(0, Put, "a", 20, 30, "2")), got(op(1, Get, "a", 40, 50), "1")}, false},
		{"concurrent read sees either", []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(0, Put, "a", 20, 60, "2")),
			got(op(1, Get, "a", 30, 40), "1"), got(op(2, Get, "a", 30, 40), "2")}, true},
		{"new then old (no going back)", []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(0, Put, "a", 20, 100, "2")),
			got(op(1, Get, "a", 30, 40), "2"), got(op(2, Get, "a", 50, 60), "1")}, false},
		{"lost acknowledged write", []Op{ok(op(0, Put, "a", 0, 10, "1")), absent(op(1, Get, "a", 20, 30))}, false},
		{"unknown put taken", []Op{unknown(op(0, Put, "a", 0, 10, "1")), got(op(1, Get, "a", 50, 60), "1")}, true},
		{"unknown put never taken", []Op{unknown(op(0, Put, "a", 0, 10, "1")), absent(op(1, Get, "a", 50, 60))}, true},
		{"unknown put taken then undone", []Op{unknown(op(0, Put, "a", 0, 10, "1")), got(op(1, Get, "a", 50, 60), "1"),
			absent(op(1, Get, "a", 70, 80))}, false},
		{"cas twice from one value", []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(0, CAS, "a", 20, 30, "1", "2")),
			ok(op(1, CAS, "a", 40, 50, "1", "3"))}, false},
		{"cas chain", []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(0, CAS, "a", 20, 30, "1", "2")),
			ok(op(1, CAS, "a", 40, 50, "2", "3")), got(op(2, Get, "a", 60, 70), "3")}, true},
		{"cas failure reports the value", []Op{ok(op(0, Put, "a", 0, 10, "1")), casFailed(op(1, CAS, "a", 20, 30, "0", "2"), true, "1")}, true},
		{"cas failure reports a wrong value", []Op{ok(op(0, Put, "a", 0, 10, "1")), casFailed(op(1, CAS, "a", 20, 30, "0", "2"), true, "7")}, false},
		{"cas failed although it matched", []Op{ok(op(0, Put, "a", 0, 10, "1")), casFailed(op(1, CAS, "a", 20, 30, "1", "2"), true, "1")}, false},
		{"cas expect absent", []Op{ok(Op{Kind: CAS, Key: "a", ExpectAbsent: true, Value: "1", Call: 0, Return: 10}),
			casFailed(Op{Client: 1, Kind: CAS, Key: "a", ExpectAbsent: true, Value: "2", Call: 20, Return: 30}, true, "1")}, true},
		{"unknown cas", []Op{ok(op(0, Put, "a", 0, 10, "1")), unknown(op(0, CAS, "a", 20, 30, "1", "2")),
			got(op(1, Get, "a", 40, 50), "2"), ok(op(1, CAS, "a", 60, 70, "2", "3"))}, true},
		{"delete", []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(0, Del, "a", 20, 30)), absent(op(1, Get, "a", 40, 50))}, true},
		{"keys independent", []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(1, Put, "b", 0, 10, "2")),
			got(op(2, Get, "b", 20, 30), "2"), got(op(2, Get, "a", 40, 50), "1")}, true},
		{"keys not mixed", []Op{ok(op(0, Put, "a", 0, 10, "1")), got(op(2, Get, "b", 20, 30), "1")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Check(tc.ops, 10*time.Second, "", "")
			if tc.ok && err != nil {
				t.Errorf("linearizable history refused: %v (%+v)", err, v)
			}
			if !tc.ok && !errors.Is(err, ErrNotLinearizable) {
				t.Errorf("non-linearizable history accepted: %v (%+v)", err, v)
			}
		})
	}
}

// randomHistory simulates a linearizable register store: each op takes effect at a random
// instant inside its [call, return] window, and its output is what the store held then.
// With stale set, one read returns a value the key held before an earlier completed write.
func randomHistory(r *rand.Rand, n, clients int, stale bool) []Op {
	type event struct {
		at int64
		op *Op
	}
	ops := make([]Op, n)
	free := make([]int64, clients) // when each client is free again
	for i := range ops {
		c := r.IntN(clients)
		call := free[c] + r.Int64N(50)
		ret := call + 1 + r.Int64N(200)
		free[c] = ret + 1
		key := fmt.Sprintf("k%d", r.IntN(3))
		o := Op{Client: c, Key: key, Call: call, Return: ret}
		switch x := r.IntN(10); {
		case x < 4:
			o.Kind = Get
		case x < 7:
			o.Kind, o.Value = Put, fmt.Sprint(i)
		case x < 9:
			o.Kind, o.Expect, o.Value = CAS, fmt.Sprint(r.IntN(i+1)), fmt.Sprint(i)
		default:
			o.Kind = Del
		}
		ops[i] = o
	}
	// Linearization points, applied in time order.
	evs := make([]event, n)
	for i := range ops {
		evs[i] = event{ops[i].Call + r.Int64N(ops[i].Return-ops[i].Call+1), &ops[i]}
	}
	for i := 1; i < len(evs); i++ {
		for j := i; j > 0 && (evs[j].at < evs[j-1].at); j-- {
			evs[j], evs[j-1] = evs[j-1], evs[j]
		}
	}
	state := map[string]kvState{}
	for _, e := range evs {
		o, s := e.op, state[e.op.Key]
		switch o.Kind {
		case Get:
			o.Out = Out{Found: s.Present, Value: s.Value}
		case Put:
			s = kvState{true, o.Value}
			o.Out.OK = true
		case Del:
			s = kvState{}
			o.Out.OK = true
		case CAS:
			if s.Present && s.Value == o.Expect {
				s = kvState{true, o.Value}
				o.Out.OK = true
			} else {
				o.Out = Out{Found: s.Present, Value: s.Value}
			}
		}
		state[o.Key] = s
	}
	if stale {
		// Move a get after everything else and answer it with the value of a write that
		// completed before another write to its key began (values are unique, so it cannot
		// be current any more): not linearizable.
		writes := func(o Op) bool { return o.Kind == Put || o.Kind == Del || (o.Kind == CAS && o.Out.OK) }
		for i := range ops {
			g := &ops[i]
			if g.Kind != Get {
				continue
			}
			for _, p := range ops {
				if p.Key != g.Key || (p.Kind != Put && !(p.Kind == CAS && p.Out.OK)) {
					continue
				}
				for _, w := range ops {
					if w.Key == p.Key && writes(w) && w.Call > p.Return {
						g.Call, g.Return = 1<<40, 1<<40+10
						g.Out = Out{Found: true, Value: p.Value}
						return ops
					}
				}
			}
		}
		return nil
	}
	return ops
}

func TestCheckRandomHistories(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	stale := 0
	defer func() {
		if stale < 40 {
			t.Errorf("only %d of 50 histories had a stale read to plant", stale)
		}
	}()
	for i := range 50 {
		ops := randomHistory(r, 300, 5, false)
		if _, err := Check(ops, 30*time.Second, "", ""); err != nil {
			t.Fatalf("history %d (linearizable by construction) refused: %v", i, err)
		}
		bad := randomHistory(r, 300, 5, true)
		if bad == nil {
			continue
		}
		stale++
		if _, err := Check(bad, 30*time.Second, "", ""); !errors.Is(err, ErrNotLinearizable) {
			t.Fatalf("history %d with a stale read accepted: %v", i, err)
		}
	}
}

func TestCheckWritesVisualization(t *testing.T) {
	dir := t.TempDir()
	ops := []Op{ok(op(0, Put, "a", 0, 10, "1")), ok(op(0, Put, "a", 20, 30, "2")), got(op(1, Get, "a", 40, 50), "1")}
	v, err := Check(ops, time.Second, dir, "stale")
	if !errors.Is(err, ErrNotLinearizable) {
		t.Fatalf("want ErrNotLinearizable, got %v", err)
	}
	if v.HTML != filepath.Join(dir, "stale.html") || v.History != filepath.Join(dir, "stale.json") {
		t.Errorf("files %q %q", v.HTML, v.History)
	}
	html, err := os.ReadFile(v.HTML)
	if err != nil || !strings.Contains(string(html), `put(a, \"2\")`) {
		t.Errorf("visualization missing or without the ops (err %v)", err)
	}
	back, err := ReadJSON(v.History)
	if err != nil || len(back) != len(ops) || back[2] != ops[2] {
		t.Errorf("history round trip: %v, %+v", err, back)
	}
	if _, err := Check(back, time.Second, "", ""); !errors.Is(err, ErrNotLinearizable) {
		t.Errorf("re-check of the written history: %v", err)
	}
}

func TestHistoryAdd(t *testing.T) {
	h := NewHistory()
	h.Add(Op{Kind: Put, Key: "a", Value: "1", Out: Out{Err: "503 no leader"}}) // refused: did nothing
	h.Add(Op{Kind: Get, Key: "a", Out: Out{Unknown: true}})                    // unknown read: no effect
	h.Add(Op{Kind: Put, Key: "a", Value: "2", Call: 5, Out: Out{Unknown: true}})
	h.Add(Op{Kind: Get, Key: "a", Call: 1, Out: Out{Found: true, Value: "2"}})
	ops := h.Ops()
	if len(ops) != 2 || ops[0].Kind != Get || ops[1].Kind != Put {
		t.Errorf("recorded %+v", ops)
	}
}
