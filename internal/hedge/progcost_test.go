package hedge

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"golang.org/x/sys/unix"
)

// BenchmarkStoredPath: what a request that needs no hedge costs the stored path's programs,
// with the kernel's clock (as in production): hedge_split on a request to a stored-path
// service (recorded, stored in its ring, a pacer tick coalesced) and hedge_resp on its first
// response (completed, its cell popped), one BPF_PROG_TEST_RUN each, ids cycling over more
// distinct requests than one CPU cache holds.
//
//	one-cpu: each response right after its request, on the same CPU.
//	two-cpus: requests on CPU 0 and their responses on CPU 1, the responses trailing by at
//	          most 16 requests - as at saturation, where the client's CPU sends and the
//	          server's receives: what the two CPUs share (the service's state, the ring's
//	          positions and cells, the scoreboard) moves between their caches.
//
// Reported per program: the program's own run time from BPF run-time statistics
// (split-run-ns, resp-run-ns: BPF_ENABLE_STATS, on for the benchmark only), the median test
// run (split-p50-ns, resp-p50-ns: the kernel's timing of one run, harness included).
func BenchmarkStoredPath(b *testing.B) {
	f := newFixture(b, fixtureOpts{realClock: true, noCarry: true})
	const ids = 4096
	reqs, resps := make([][]byte, ids), make([][]byte, ids)
	for i := range ids {
		p := idPayload(uint32(i+1), 32)
		reqs[i], resps[i] = datagram(client4, svcSt4, p), datagram(svcSt4, client4, p)
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Skipf("BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	progs := [2]*ebpf.Program{f.objs.HedgeSplit, f.objs.HedgeResp}
	for _, mode := range []string{"one-cpu", "two-cpus"} {
		b.Run(mode, func(b *testing.B) {
			if mode == "two-cpus" && runtime.NumCPU() < 2 {
				b.Skip("one CPU")
			}
			f.reset(b)
			var before [2]*ebpf.ProgramStats
			for i, p := range progs {
				if before[i], err = p.Stats(); err != nil {
					b.Fatal(err)
				}
			}
			runs := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
			run := func(j, i int) error {
				ret, d, err := progs[j].Benchmark([][][]byte{reqs, resps}[j][i%ids], 1, nil)
				if err != nil {
					return err
				}
				if ret != unspec {
					return fmt.Errorf("%s: verdict %s", progs[j], verdict(ret))
				}
				runs[j] = append(runs[j], d)
				return nil
			}
			delta, err := bpftest.Delta(f.counters, func() error {
				b.ResetTimer()
				if mode == "one-cpu" {
					return f.ns.Do(func() error {
						for i := 0; i < b.N; i++ {
							if err := run(0, i); err != nil {
								return err
							}
							if err := run(1, i); err != nil {
								return err
							}
						}
						return nil
					})
				}
				return pipelined(f, b.N, 16, run)
			})
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if delta["st4.Stored"] != int64(b.N) || delta["st4.StoredAnswered"] != int64(b.N) {
				b.Fatalf("stored %d, stored_answered %d in %d pairs: not the path under test", delta["st4.Stored"], delta["st4.StoredAnswered"], b.N)
			}
			for i, name := range []string{"split", "resp"} {
				after, err := progs[i].Stats()
				if err != nil {
					b.Fatal(err)
				}
				if n := after.RunCount - before[i].RunCount; n > 0 {
					b.ReportMetric(float64((after.Runtime-before[i].Runtime).Nanoseconds())/float64(n), name+"-run-ns")
				}
				slices.Sort(runs[i])
				b.ReportMetric(float64(runs[i][len(runs[i])/2].Nanoseconds()), name+"-p50-ns")
			}
		})
	}
}

// pipelined runs run(0, i) for i = 0..n-1 on CPU 0 and run(1, i) on CPU 1 after run(0, i),
// at most lag behind.
func pipelined(f *fixture, n, lag int, run func(j, i int) error) error {
	var sent, done atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for j := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[j] = f.pinned(j, func() error {
				for i := 0; i < n; i++ {
					for !stop.Load() && ((j == 0 && int64(i)-done.Load() >= int64(lag)) || (j == 1 && int64(i) >= sent.Load())) {
						runtime.Gosched()
					}
					if stop.Load() {
						return nil
					}
					if err := run(j, i); err != nil {
						stop.Store(true)
						return err
					}
					[]*atomic.Int64{&sent, &done}[j].Store(int64(i + 1))
				}
				return nil
			})
		}()
	}
	wg.Wait()
	if errs[0] != nil {
		return errs[0]
	}
	return errs[1]
}
