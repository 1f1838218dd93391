package sg

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	isg "github.com/kedge-dev/kedge/internal/sg"
)

// TestLabFloat: float reductions with real `kedge sg worker` processes on two lab hosts,
// each answering in its float wire form: a float64 mean and a float32 sum checked against
// the exact mean and sum of what each answered worker sent (within SumErrorBound), a
// float32 max and a float64 min with NaN and infinities (NaN wins, -0 < +0) through
// `kedge sg scatter -o json`, and a worker whose values have no fixed-point form: its
// replies are worker errors, never in the sum (an all-request expires without it).
func TestLabFloat(t *testing.T) {
	bpftest.RequireRoot(t)
	bin := bpftest.KedgeBinary(t)
	l, err := lab.Up(lab.Spec{Name: "sgf", Fabric: lab.Bridge, Hosts: []string{"coord", "w1", "w2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	coord, w1, w2 := l.Host("coord"), l.Host("w1"), l.Host("w2")
	port := uint16(9400)
	// workers starts 3 worker processes' sockets on each of w1 and w2 (the w2 ones with
	// extra2 appended, when given) and returns their addresses.
	workers := func(t *testing.T, args []string, extra2 ...string) []netip.AddrPort {
		port += 10
		startWorkers(t, bin, w1, w1.IPv4, port, 3, args...)
		startWorkers(t, bin, w2, w2.IPv4, port, 3, append(args, extra2...)...)
		var ws []netip.AddrPort
		for _, h := range []*lab.Host{w1, w2} {
			for k := range 3 {
				ws = append(ws, netip.AddrPortFrom(h.IPv4, port+uint16(k)))
			}
		}
		return ws
	}
	open := func(t *testing.T, cfg Config) *Group {
		// Deadlines are generous: a loaded machine delays worker processes (TestLab).
		cfg.Interface, cfg.Netns, cfg.Timeout = coord.Iface, coord.Path(), 2*time.Second
		g, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}
	// exact is the exact sum over the answered workers of their values (float32: rounded
	// as the worker sends them), as float64 and the bound's n.
	exact := func(res Result, j int, f32 bool) (sum float64, n int) {
		var xs []float64
		for _, w := range res.Answered {
			x := isg.FloatValueFor(uint16(w), res.ID, j)
			if f32 {
				x = float64(float32(x))
			}
			xs = append(xs, x)
		}
		s := 0.0
		var c float64 // Kahan-Babuska: the reference is far more precise than the bound
		for _, x := range xs {
			t := s + x
			if math.Abs(s) >= math.Abs(x) {
				c += (s - t) + x
			} else {
				c += (x - t) + s
			}
			s = t
		}
		return s + c, len(xs)
	}

	t.Run("float64 mean", func(t *testing.T) {
		ws := workers(t, []string{"--type", "float64", "--reduction", "mean", "--elems", "4"})
		g := open(t, Config{Workers: ws, Reduction: Mean, Type: Float64, Elems: 4})
		for range 10 {
			res, err := g.Scatter(context.Background(), []byte("lab"))
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != OK || res.Count != len(ws) || len(res.Floats) != 4 || res.Values != nil {
				t.Fatalf("result %+v", res)
			}
			for j, m := range res.Floats {
				sum, n := exact(res, j, false)
				want := sum / float64(n)
				if bound := SumErrorBound(n, DefaultFracBits, m*float64(n))/float64(n) + math.Abs(m)*0x1p-53; math.Abs(m-want) > bound {
					t.Fatalf("request %#x element %d: mean %g, want %g within %g", res.ID, j, m, want, bound)
				}
			}
		}
	})

	t.Run("float32 sum", func(t *testing.T) {
		ws := workers(t, []string{"--type", "float32", "--reduction", "sum", "--frac-bits", "20", "--elems", "5"})
		g := open(t, Config{Workers: ws, Reduction: Sum, Type: Float32, FracBits: 20, Elems: 5})
		for range 10 {
			res, err := g.Scatter(context.Background(), []byte("lab"))
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != OK || res.Count != len(ws) || res.Overflow {
				t.Fatalf("result %+v", res)
			}
			for j, s := range res.Floats {
				want, n := exact(res, j, true)
				if bound := SumErrorBound(n, 20, s); math.Abs(s-want) > bound {
					t.Fatalf("request %#x element %d: sum %g, want %g within %g", res.ID, j, s, want, bound)
				}
			}
		}
	})

	// The CLI's coordinator over the same kind of workers: its JSON carries NaN and the
	// infinities as strings.
	scatterJSON := func(t *testing.T, ws []netip.AddrPort, args ...string) []Result {
		var list []string
		for _, w := range ws {
			list = append(list, w.String())
		}
		cmd := exec.Command(bin, append([]string{"sg", "scatter", "--netns", coord.Path(), "-i", coord.Iface,
			"--workers", strings.Join(list, ","), "--timeout", "2s", "--count", "3", "-o", "json"}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kedge sg scatter: %v (%s)", err, out)
		}
		var rep struct{ Results []Result }
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("kedge sg scatter -o json: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), `"NaN"`) {
			t.Errorf("no NaN in %s", out)
		}
		return rep.Results
	}
	for _, c := range []struct {
		typ, red  string
		v1, v2    string
		want      []float64
		wantBits0 uint64 // element 0's exact bits (signed zero)
	}{
		{"float32", "max", "-0,-inf,2,inf", "0,nan,-1e30,1", []float64{0, math.NaN(), 2, math.Inf(1)}, 0},
		{"float64", "min", "0,-inf,2,nan", "-0,1e300,-1e-300,inf", []float64{math.Copysign(0, -1), math.Inf(-1), -1e-300, math.NaN()}, 1 << 63},
	} {
		t.Run(c.typ+" "+c.red, func(t *testing.T) {
			ws := workers(t, []string{"--type", c.typ, "--reduction", c.red, "--elems", "4", "--values=" + c.v1}, "--values="+c.v2)
			res := scatterJSON(t, ws, "--type", c.typ, "--reduction", c.red, "--elems", "4")
			for _, r := range res {
				if r.Status != OK || r.Count != len(ws) || len(r.Floats) != 4 {
					t.Fatalf("result %+v", r)
				}
				for j, x := range r.Floats {
					if !(x == c.want[j] || math.IsNaN(x) && math.IsNaN(c.want[j])) {
						t.Errorf("element %d: %g, want %g (all: %v)", j, x, c.want[j], r.Floats)
					}
				}
				if math.Float64bits(r.Floats[0]) != c.wantBits0 {
					t.Errorf("element 0 bits %#x, want %#x", math.Float64bits(r.Floats[0]), c.wantBits0)
				}
			}
		})
	}

	t.Run("unencodable sum", func(t *testing.T) {
		// A constant vector that cannot be summed is refused when the worker starts.
		port += 10
		out, err := exec.Command(bin, "sg", "worker", "--netns", w1.Path(), "--listen", netip.AddrPortFrom(w1.IPv4, port).String(),
			"--type", "float64", "--reduction", "sum", "--elems", "2", "--values", "1,+Inf", "--duration", "1s").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "NaN or infinity") {
			t.Fatalf("a worker with --values 1,+Inf for a sum: %v %s", err, out)
		}
		// Workers 0-3 answer a constant vector; worker 4 its generated values, about
		// 1000 * 4 / 3, and 53 fraction bits leave |x| < 2^10: it never fits.
		const frac = 53
		port += 10
		good := []string{"--type", "float64", "--reduction", "sum", "--elems", "2", "--frac-bits", fmt.Sprint(frac)}
		startWorkers(t, bin, w1, w1.IPv4, port, 4, append(good, "--values=1.5,-2")...)
		startWorkers(t, bin, w2, w2.IPv4, port, 1, good...)
		var ws []netip.AddrPort
		for k := range 4 {
			ws = append(ws, netip.AddrPortFrom(w1.IPv4, port+uint16(k)))
		}
		ws = append(ws, netip.AddrPortFrom(w2.IPv4, port))
		if _, err := isg.Quantize(isg.FloatValueFor(4, 0, 0), frac); err == nil {
			t.Fatal("worker 4's values fit")
		}
		g := open(t, Config{Workers: ws, Reduction: Sum, Type: Float64, FracBits: frac, Elems: 2})
		// The first request waits for all five: it expires with worker 4's bit clear. The
		// others complete with the four good workers (need 4), worker 4's reply never in.
		for i := range 5 {
			opts, want := RequestOptions{Timeout: 500 * time.Millisecond}, Timeout
			if i > 0 {
				opts, want = RequestOptions{Need: 4}, OK
			}
			res, err := g.ScatterWith(context.Background(), []byte("lab"), opts)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 && res.Count < 4 {
				continue // a good worker starved past the deadline: checked by the rest
			}
			if res.Status != want || fmt.Sprint(res.Answered) != "[0 1 2 3]" || res.Overflow || fmt.Sprint(res.Floats) != "[6 -8]" {
				t.Fatalf("request %#x: %v, %v answered, sum %v (overflow %v); want %v, [0 1 2 3], [6 -8]",
					res.ID, res.Status, res.Answered, res.Floats, res.Overflow, want)
			}
		}
		// Worker 4 answers every request, with its error status: 5 worker errors once its
		// replies are in (polled: the last may come after its request completed).
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, err := g.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.WorkerErrors >= 5 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d worker errors, want 5 (worker 4's replies)", st.WorkerErrors)
			}
			time.Sleep(20 * time.Millisecond) // polling a counter with a deadline
		}
	})
}
