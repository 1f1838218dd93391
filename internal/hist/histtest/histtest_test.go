package histtest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/hist"
)

func TestMain(m *testing.M) { os.Exit(bpftest.CheckFDLeaks(m)) }

// layouts: the ones in use (pping in ns, hedge in us) and the extremes of the parameters.
var layouts = []hist.Layout{
	{SubBits: 3, MinShift: 8, Buckets: 233},
	{SubBits: 4, MinShift: 4, Buckets: 400},
	{SubBits: 0, MinShift: 0, Buckets: 65},
	{SubBits: 2, MinShift: 10, Buckets: 50},
	{SubBits: 5, MinShift: 7, Buckets: 1000},
	{SubBits: 3, MinShift: 8, Buckets: 5},
}

// TestBPFMatchesGo runs hist_bucket() and hist_lower() in the kernel for every bucket index
// and for values around every bucket edge, every power of two and random values, under each
// layout, and compares every result with internal/hist.
func TestBPFMatchesGo(t *testing.T) {
	bpftest.RequireRoot(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, l := range layouts {
		if err := l.Validate(); err != nil {
			t.Fatal(err)
		}
		spec, err := loadHisttest()
		if err != nil {
			t.Fatalf("load histtest spec: %v", err)
		}
		lay := histtestHistLayout{SubBits: uint32(l.SubBits), MinShift: uint32(l.MinShift), Buckets: uint32(l.Buckets)}
		if err := spec.Variables[histtestVarLayout].Set(lay); err != nil {
			t.Fatalf("set layout: %v", err)
		}
		var objs histtestObjects
		if err := spec.LoadAndAssign(&objs, nil); err != nil {
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				t.Fatalf("load histtest: %+v", ve)
			}
			t.Fatalf("load histtest: %v", err)
		}
		values := []uint64{0, 1, 2, 3, math.MaxUint64, math.MaxUint64 - 1}
		for b := range l.Buckets {
			lo := l.Lower(b)
			values = append(values, lo-1, lo, lo+1)
		}
		for k := range 64 {
			values = append(values, 1<<k-1, 1<<k, 1<<k+1)
		}
		for range 1024 {
			values = append(values, rng.Uint64()>>rng.IntN(64))
		}
		// One case per batch of the cases map (HISTTEST_CASES entries, sized by the object):
		// Setup writes the values and indexes, hist_table computes every entry in one run,
		// Check compares them with internal/hist.
		nCases := int(spec.Maps[histtestMapCases].MaxEntries)
		n := max(len(values), l.Buckets)
		checked := 0
		r := bpftest.Runner{Prog: objs.HistTable}
		for start := 0; start < n; start += nCases {
			batch := make([]histtestHistCase, nCases)
			for i := range batch {
				batch[i].Value = values[(start+i)%len(values)]
				batch[i].Index = uint32((start + i) % l.Buckets)
			}
			r.RunCase(t, bpftest.Case{
				Name: fmt.Sprintf("%+v, cases %d-%d", l, start, start+nCases-1),
				Setup: func(tb testing.TB) {
					for i := range batch {
						if err := objs.Cases.Put(uint32(i), batch[i]); err != nil {
							tb.Fatalf("write case %d: %v", i, err)
						}
					}
				},
				In:      make([]byte, 64),
				WantRet: 0,
				Check: func(tb testing.TB, _ bpftest.Result) {
					for i := range batch {
						var got histtestHistCase
						if err := objs.Cases.Lookup(uint32(i), &got); err != nil {
							tb.Fatalf("read case %d: %v", i, err)
						}
						if want := l.Bucket(got.Value); int(got.Bucket) != want {
							tb.Errorf("hist_bucket(%d) = %d, Go: %d", got.Value, got.Bucket, want)
						}
						if want := l.Lower(int(got.Index)); got.Lower != want {
							tb.Errorf("hist_lower(%d) = %d, Go: %d", got.Index, got.Lower, want)
						}
						checked++
					}
				},
			})
		}
		t.Logf("%+v: %d values and all %d bucket edges agree", l, checked, l.Buckets)
		objs.Close()
	}
}
