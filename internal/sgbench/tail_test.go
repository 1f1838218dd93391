package sgbench

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestResendPolicy: the user-space baseline's budget and delay follow the data plane's
// rules: the bucket starts full at the burst, a request deposits ratio x copies while below
// it, a copy takes one and is refused with none left, a repeat or a round's retry past its
// first lateMax only from above half the burst (a hedge there down to the last copy); the
// delay is fixed until the first sample, then the estimate clamped to [floor, ceiling]; a
// round after a round is due at half of it with replicas (at least the floor).
func TestResendPolicy(t *testing.T) {
	p := newResendPolicy(ClientOptions{Resend: 10 * time.Millisecond, ResendQuantile: 0.9, ResendRatio: 0.5, ResendBurst: 2, MaxResends: 1})
	if !p.take(false, 0, 3, false) || !p.take(false, 1, 3, false) || p.take(false, 2, 3, false) {
		t.Fatal("a burst of 2: want two copies paid, the third refused")
	}
	p.deposit(4) // 0.5 x 4 copies
	if !p.take(false, 0, 3, false) || p.take(true, 1, 3, true) || !p.take(false, 1, 3, false) || p.take(false, 2, 3, false) {
		t.Fatal("after a deposit of 2 copies: want a first re-send paid, a repeat refused (it leaves half the cap, 1), the second first re-send paid, the third refused")
	}
	p.deposit(4)
	if !p.take(false, 3, 3, false) || p.take(false, 3, 3, false) || !p.take(false, 2, 3, false) {
		t.Fatal("after a deposit of 2 copies: want a round's retry past its first 3 paid from above half the cap, the next one refused, a copy among the first 3 paid")
	}
	p.deposit(4)
	if !p.take(false, 3, 3, true) || !p.take(false, 4, 3, true) || p.take(false, 5, 3, true) {
		t.Fatal("after a deposit of 2 copies: want a round's hedges past its first 3 paid down to the last copy, then refused")
	}
	if d := p.next(); d != 10*time.Millisecond {
		t.Fatalf("no sample: delay %v, want the fixed 10ms", d)
	}
	p.sample(uint64(50 * time.Microsecond))
	if d := p.next(); d != time.Millisecond {
		t.Fatalf("a 50us sample: delay %v, want the floor (Resend/10 = 1ms)", d)
	}
	p.est.Store(uint64(time.Second))
	if d := p.next(); d != 10*time.Millisecond {
		t.Fatalf("an estimate of 1s: delay %v, want the ceiling", d)
	}
	// After a round (resend_again_delay): with replicas half the delay, at least the floor;
	// without (retries), or with the fixed delay, the whole delay.
	p.est.Store(uint64(4 * time.Millisecond))
	if d, r := p.again(true), p.again(false); d != 2*time.Millisecond || r != 4*time.Millisecond {
		t.Fatalf("an estimate of 4ms: after a round %v with replicas, %v without; want 2ms and 4ms", d, r)
	}
	p.est.Store(uint64(1500 * time.Microsecond))
	if d := p.again(true); d != time.Millisecond {
		t.Fatalf("an estimate of 1.5ms: after a round %v with replicas, want the floor (1ms)", d)
	}
	if f := newResendPolicy(ClientOptions{Resend: 10 * time.Millisecond}); f.again(true) != 10*time.Millisecond {
		t.Fatalf("the fixed delay: after a round %v with replicas, want 10ms", f.again(true))
	}
	// The estimate settles near the quantile: 90% of samples at 1 ms, 10% at 5 ms.
	p.est.Store(0)
	for i := range 20000 {
		ns := uint64(time.Millisecond)
		if i%10 == 9 {
			ns = uint64(5 * time.Millisecond)
		}
		p.sample(ns)
	}
	if e := time.Duration(p.est.Load()); e < time.Millisecond || e > 5*time.Millisecond {
		t.Fatalf("estimate %v, want between the two sample values", e)
	}
}

// TestResendPolicyCensored: a shard re-sent once the estimate's time has passed steps the
// estimate up (a censored sample above it), one step per shard, none before that time and
// none without an estimate; and, over reply times like the tail scenario's (lognormal about
// 300 us, 1% stragglers of 20-50 ms; seeded), with the round's re-sends 20 us after their
// due time, the estimate stays near the 99th percentile and re-sends about 1% of the copies.
// Without the censored steps the same run settles near 500 us and re-sends about 5%.
func TestResendPolicyCensored(t *testing.T) {
	const ms = uint64(time.Millisecond)
	o := ClientOptions{Resend: 10 * time.Millisecond, ResendMin: 200 * time.Microsecond, ResendQuantile: 0.99, MaxResends: 1}
	p := newResendPolicy(o)
	if p.censors(5 * ms) {
		t.Fatal("no estimate: a round censors nothing")
	}
	p.est.Store(3 * ms)
	if p.censors(3*ms - 1) {
		t.Fatal("a round before the estimate censors nothing")
	}
	if !p.censors(3 * ms) {
		t.Fatal("a round at the estimate: its re-sends lie above it")
	}
	p.up()
	p.up()
	m1 := quantileStep(3*ms, 3*ms+1, 990)
	if want := quantileStep(m1, m1+1, 990); p.est.Load() != want {
		t.Fatalf("two censored re-sends: estimate %d, want %d (two steps up)", p.est.Load(), want)
	}

	sim := func(censor bool) (est time.Duration, resent float64) {
		rng := rand.New(rand.NewPCG(1, 2))
		p := newResendPolicy(o)
		const n, lag = 200000, 20 * time.Microsecond
		k := 0
		for range n {
			x := time.Duration(math.Exp(12.6+0.35*rng.NormFloat64())) * time.Nanosecond
			if rng.IntN(100) == 0 {
				x = time.Duration(20+rng.IntN(31)) * time.Millisecond
			}
			at := p.next() + lag
			if x <= at {
				p.sample(uint64(x))
				continue
			}
			k++
			if censor && p.censors(uint64(at)) {
				p.up()
			}
		}
		return time.Duration(p.est.Load()), float64(k) / n
	}
	est, resent := sim(true)
	t.Logf("censored: estimate %v, re-sent %.2f%%", est, 100*resent)
	if resent > 0.015 || est < 600*time.Microsecond {
		t.Errorf("with censored re-sends: estimate %v, re-sent %.2f%% of copies; want about 1%% (the quantile)", est, 100*resent)
	}
	est, resent = sim(false)
	t.Logf("not censored: estimate %v, re-sent %.2f%%", est, 100*resent)
	if resent < 0.03 {
		t.Errorf("without censored re-sends: re-sent %.2f%% (estimate %v); the model says about 5%%: the simulation no longer shows the bias", 100*resent, est)
	}
}

// TestTailTargets: the targets are judged from the summary and each round's figures.
func TestTailTargets(t *testing.T) {
	row := func(mode, m string, round int, p99 float64, req, to int64, c ResendCounts, budget float64) TailRow {
		lat := make([]float64, 0, req)
		for range req - to {
			lat = append(lat, p99)
		}
		for range to {
			lat = append(lat, 100000)
		}
		return TailRow{Mode: mode, Round: round, Fanout: TargetFanout, Method: m, Requests: req, Timeouts: to, P99US: p99,
			ResendCounts: c, ExtraLoad: float64(c.Hedges+c.Retries) / max(float64(c.Copies), 1), Budget: budget, latencies: lat}
	}
	hc := ResendCounts{Copies: 6400, Hedges: 100, HedgesWon: 60}
	r := &TailResult{Rows: []TailRow{
		row(ModeStraggle, "kedge-clean", 1, 1000, 100, 0, ResendCounts{Copies: 6400}, 0),
		row(ModeStraggle, "kedge-hedged", 1, 1400, 100, 0, hc, 0.12),
		row(ModeStraggle, "user-hedged", 1, 1500, 100, 0, hc, 0.12),
		row(ModeStraggle, "kedge-clean", 2, 1000, 100, 0, ResendCounts{Copies: 6400}, 0),
		row(ModeStraggle, "kedge-hedged", 2, 1600, 100, 0, hc, 0.12), // above 1.5x, and above user-hedged
		row(ModeStraggle, "user-hedged", 2, 1500, 100, 0, hc, 0.12),
		row(ModeLoss, "kedge-retry", 1, 900, 20000, 1, ResendCounts{Copies: 1280000, Retries: 13000}, 0.11),
	}}
	r.Summary = summarizeTail(r.Rows)
	got := tailTargets(r, TailOptions{BudgetRatio: 0.1})
	r.Targets = got
	want := []bool{false, false, true, true}
	if len(got) != len(want) {
		t.Fatalf("targets %+v, want %d", got, len(want))
	}
	for i, g := range got {
		if g.Met != want[i] {
			t.Errorf("target %q (%s): met %v, want %v", g.Target, g.Measured, g.Met, want[i])
		}
	}
	if s := r.summary(ModeStraggle, TargetFanout, "kedge-hedged"); s.Requests != 200 || len(s.RoundP99US) != 2 || s.Hedges != 200 ||
		s.ExtraLoad != 200.0/12800 || s.P99US != 1600 {
		t.Errorf("summary %+v", s)
	}
	var b strings.Builder
	WriteTailMarkdown(&b, r)
	if !strings.Contains(b.String(), "| straggle | 64 | kedge-hedged | 200 | 0 |") || !strings.Contains(b.String(), "| missed |") {
		t.Errorf("markdown:\n%s", b.String())
	}
	if strings.Contains(b.String(), "steal") {
		t.Errorf("markdown of a result without steal readings has a steal column:\n%s", b.String())
	}
	r.Rows[1].StealCPUs, r.Rows[4].StealCPUs = 0.25, 0.02 // kedge-hedged, rounds 1 and 2
	b.Reset()
	WriteTailMarkdown(&b, r)
	if !strings.Contains(b.String(), "steal per round (CPUs) |") || !strings.Contains(b.String(), " 0.25, 0.02 |\n") {
		t.Errorf("markdown with steal readings:\n%s", b.String())
	}
}

// TestTailScenario runs the tail scenario at a tiny size with real `kedge sg worker`
// processes in a lab (fan-out 4, one round of 300 ms per method, both modes), with
// stragglers and loss frequent enough that every re-sending method re-sends: every method
// completes requests with the right sums, hedges and retries are counted where they
// belong, and the result has its summary and loss target. Figures are not judged.
func TestTailScenario(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (lab namespaces, BPF)")
	}
	o := DefaultTailOptions()
	o.Kedge = bpftest.KedgeBinary(t)
	o.Fanouts, o.Rounds, o.Duration, o.Warmup = []int{4}, 1, 300*time.Millisecond, 5
	o.Straggle, o.Loss = 0.2, 0.2
	o.Timeout, o.LossTimeout = 500*time.Millisecond, 500*time.Millisecond
	o.ResendQuantile, o.HedgeQuantile, o.Resend = 0, 0, 5*time.Millisecond
	o.BudgetRatio = 1
	o.Out = t.TempDir()
	var log strings.Builder
	res, err := RunTail(context.Background(), o, &log)
	t.Log("\n" + log.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 7 || len(res.Summary) != 7 {
		t.Fatalf("%d rows, %d summaries, want 7 of each (4 straggle methods, 3 loss methods)", len(res.Rows), len(res.Summary))
	}
	for _, x := range res.Rows {
		if x.Requests == 0 || x.Mismatches != 0 || x.Copies == 0 {
			t.Errorf("%s %s: %d requests, %d mismatches, %d copies: want requests, right sums, copies counted", x.Mode, x.Method, x.Requests, x.Mismatches, x.Copies)
		}
		switch x.Method {
		case "kedge-hedged", "user-hedged":
			if x.Hedges == 0 || x.Retries != 0 {
				t.Errorf("%s: %d hedges, %d retries: want hedges (1 in 5 replies straggles), no retries", x.Method, x.Hedges, x.Retries)
			}
		case "kedge-retry", "user-retry":
			if x.Retries == 0 || x.Hedges != 0 {
				t.Errorf("%s: %d retries, %d hedges: want retries (1 in 5 requests lost), no hedges", x.Method, x.Retries, x.Hedges)
			}
		default:
			if x.Hedges+x.Retries != 0 {
				t.Errorf("%s %s: re-sent %d copies without re-sends", x.Mode, x.Method, x.Hedges+x.Retries)
			}
		}
	}
	if len(res.Targets) != 1 || !strings.Contains(res.Targets[0].Target, "loss") {
		t.Errorf("targets %+v: want the loss target only (no fan-out %d in the run)", res.Targets, TargetFanout)
	}
	if err := WriteTailCharts(o.Out, res); err != nil {
		t.Fatal(err)
	}
}
