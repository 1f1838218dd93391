package hedgebench

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// TestArmOrder: over a cycle of rounds every arm runs in every position equally often, right
// after every other arm equally often, and before every other arm in half the rounds; each
// round is a permutation. A plain rotation fails the second condition from three arms on
// (each arm always follows the same one).
func TestArmOrder(t *testing.T) {
	for n := 1; n <= 7; n++ {
		cycle := orderCycle(n)
		pos := make([][]int, n)  // pos[arm][position]
		next := make([][]int, n) // next[a][b]: b right after a
		before := make([][]int, n)
		for i := range n {
			pos[i], next[i], before[i] = make([]int, n), make([]int, n), make([]int, n)
		}
		for k := range cycle {
			o := armOrder(n, k)
			if s := slices.Sorted(slices.Values(o)); len(o) != n || (n > 0 && (s[0] != 0 || s[n-1] != n-1 || len(slices.Compact(s)) != n)) {
				t.Fatalf("n %d round %d: %v is not a permutation", n, k, o)
			}
			if !slices.Equal(armOrder(n, k+cycle), o) {
				t.Errorf("n %d: round %d and %d differ: the cycle is not %d", n, k, k+cycle, cycle)
			}
			for p, a := range o {
				pos[a][p]++
				if p > 0 {
					next[o[p-1]][a]++
				}
				for _, b := range o[p+1:] {
					before[a][b]++
				}
			}
		}
		for a := range n {
			for p := range n {
				if pos[a][p] != cycle/n {
					t.Errorf("n %d: arm %d in position %d in %d of %d rounds, want %d", n, a, p, pos[a][p], cycle, cycle/n)
				}
			}
			for b := range n {
				if a == b {
					continue
				}
				// cycle x (n-1) neighbours over n x (n-1) ordered pairs
				if next[a][b] != cycle/n {
					t.Errorf("n %d: arm %d right after arm %d in %d of %d rounds, want %d", n, b, a, next[a][b], cycle, cycle/n)
				}
				if before[a][b] != cycle/2 {
					t.Errorf("n %d: arm %d before arm %d in %d of %d rounds, want half", n, a, b, before[a][b], cycle)
				}
			}
		}
	}
	if got := armOrder(4, 0); !slices.Equal(got, []int{0, 1, 3, 2}) {
		t.Errorf("four arms, round 0: %v", got)
	}
}

// TestPositionEffect: runs whose req/s depends only on their position in the round (the
// first 20% faster) read as such: position 1 at 1.20x, the rest at 1.00x, and the
// control arm (the same path as unhedged) faster than unhedged when it ran before it and
// slower when after, its overall ratio 1.00x.
func TestPositionEffect(t *testing.T) {
	arms := []string{ArmUnhedged, ArmControl, ArmStored, ArmClone}
	var runs []RateRun
	for k := range 8 {
		for p, i := range armOrder(len(arms), k) {
			rps := 1000.0
			if p == 0 {
				rps = 1200
			}
			runs = append(runs, RateRun{Concurrency: 64, Round: k + 1, Order: p, Arm: arms[i], Service: "fast", RPS: rps, P50US: 100})
		}
	}
	l := rateLevels(runs, []int{64}, arms)[0]
	if len(l.ByPosition) != 4 || l.ByPosition[0].Median != 1.2 || l.ByPosition[1].Median != 1 || l.ByPosition[0].N != 8 {
		t.Errorf("by position %+v: want the first 1.20x (its arms' medians are the later runs'), the others 1.00x, 8 runs each", l.ByPosition)
	}
	c, _ := armAt(l, ArmControl)
	if c.RPSRatioBefore.N+c.RPSRatioAfter.N != 8 || c.RPSRatioBefore.Max != 1.2 || c.RPSRatioAfter.Min != 1/1.2 || c.RPSRatio.Median != 1 {
		t.Errorf("control: before %+v, after %+v, all %+v: want 1.2x when first before unhedged, 0.83x when after an unhedged first, 1.00x overall",
			c.RPSRatioBefore, c.RPSRatioAfter, c.RPSRatio)
	}
	// Against both unhedged runs (their geometric mean): 1.20x when stored ran first,
	// 1/sqrt(1.2) = 0.91x when unhedged or control did; the control has no such figure.
	if st, _ := armAt(l, ArmStored); st.RPSRatioBoth.N != 8 || c.RPSRatioBoth.N != 0 || st.RPSRatioBoth.Max != 1.2 || math.Abs(st.RPSRatioBoth.Min-1/math.Sqrt(1.2)) > 1e-9 {
		t.Errorf("stored against both %+v (want 8 rounds, 0.91x..1.20x), control against both %+v (want none)", st.RPSRatioBoth, c.RPSRatioBoth)
	}
	var b strings.Builder
	b.WriteString(positionNote(RateResult{Levels: []RateLevel{l}}))
	if !strings.Contains(b.String(), "1: req/s 1.20x") || !strings.Contains(b.String(), "control 1.") {
		t.Errorf("position note:\n%s", b.String())
	}
}

// TestSignInterval: the sign test's interval for the median takes the order statistics the
// binomial tables give (28 values: the 9th and 20th, 96.4%; 12: the 3rd and 10th, 96.1%) and
// none below six values.
func TestSignInterval(t *testing.T) {
	for _, c := range []struct {
		n, k  int
		level float64
	}{{5, 0, 0}, {6, 1, 0.969}, {12, 3, 0.961}, {28, 9, 0.964}, {36, 12, 0.971}} {
		k, level := signInterval(c.n)
		if k != c.k || math.Abs(level-c.level) > 0.001 {
			t.Errorf("n %d: k %d level %.4f, want %d %.3f", c.n, k, level, c.k, c.level)
		}
	}
	v := []float64{9, 1, 8, 2, 7, 3, 6, 4, 5, 10, 11, 12}
	if p := paired(v); p.CILo != 3 || p.CIHi != 10 || p.Median != 6.5 {
		t.Errorf("paired %+v: want the interval 3..10 around 6.5", p)
	}
}
