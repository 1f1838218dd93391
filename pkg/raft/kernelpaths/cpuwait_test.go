package kernelpaths

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// The estimator: the bound stays at the floor while the loop's gaps are not CPU waits (a
// disk stall: the loop asleep in its fsync), rises with the longest wait of the window, is
// capped, and falls back to the floor two buckets after the waits end.
func TestAdaptiveBound(t *testing.T) {
	const floor = 100 * time.Millisecond
	a := newAdaptiveBound(floor)
	now := time.Hour
	step := func(dt, wait time.Duration) time.Duration {
		now += dt
		a.observe(now, dt, wait)
		return a.bound()
	}
	if b := a.bound(); b != floor {
		t.Fatalf("bound before any reading %v, want the floor %v", b, floor)
	}
	// A disk stall: 800 ms in the loop's fsync, no thread waiting for a CPU.
	if b := step(800*time.Millisecond, 0); b != floor {
		t.Errorf("after an 800 ms gap without CPU wait the bound is %v, want the floor %v", b, floor)
	}
	// A wait counts at most the interval it was read over.
	if b := step(200*time.Millisecond, 90*time.Millisecond); b != floor+waitGain*90*time.Millisecond {
		t.Errorf("200 ms interval with a 90 ms wait: bound %v, want %v", b, floor+waitGain*90*time.Millisecond)
	}
	// A loop waiting 150 ms of a 400 ms gap.
	want := floor + waitGain*150*time.Millisecond
	if b := step(400*time.Millisecond, 150*time.Millisecond); b != want {
		t.Errorf("after a 150 ms wait the bound is %v, want %v", b, want)
	}
	// Shorter waits do not lower it within the window.
	if b := step(20*time.Millisecond, 5*time.Millisecond); b != want {
		t.Errorf("a shorter wait moved the bound to %v, want %v", b, want)
	}
	// Starvation: a thread waited half an interval or more (here 12 of 20 ms): the ceiling.
	if b := step(20*time.Millisecond, 12*time.Millisecond); b != MaxAdaptiveBound {
		t.Errorf("after a 12 ms wait in 20 ms the bound is %v, want the ceiling %v", b, MaxAdaptiveBound)
	}
	// One bucket later the previous bucket's wait still holds; two later, the floor.
	if b := step(waitBucket, 0); b != MaxAdaptiveBound {
		t.Errorf("one bucket after the wait the bound is %v, want %v", b, MaxAdaptiveBound)
	}
	if b := step(waitBucket, 0); b != floor {
		t.Errorf("two buckets after the wait the bound is %v, want the floor %v", b, floor)
	}
	// A floor above the ceiling's default keeps the floor as ceiling.
	if b := newAdaptiveBound(2 * time.Second); b.ceil != 2*time.Second {
		t.Errorf("ceiling for a 2 s floor %v, want 2s", b.ceil)
	}
}

func TestRunDelay(t *testing.T) {
	for in, want := range map[string]time.Duration{"1234 5678 9\n": 5678, "0 0 0": 0} {
		if d, ok := runDelay([]byte(in)); !ok || d != want {
			t.Errorf("runDelay(%q) = %v, %v; want %v", in, d, ok, want)
		}
	}
	if _, ok := runDelay([]byte("12\n")); ok {
		t.Error("runDelay of one field: ok")
	}
}

// cpuWait sees the process's threads wait: more spinning threads than CPUs for 200 ms make
// one of them wait at least a tenth of that.
func TestCPUWaitSeesContention(t *testing.T) {
	c := newCPUWait()
	defer c.close()
	spinners := runtime.NumCPU() + 2
	prev := runtime.GOMAXPROCS(spinners + 1)
	defer runtime.GOMAXPROCS(prev)
	spin := func() {
		var wg sync.WaitGroup
		stop := time.Now().Add(200 * time.Millisecond)
		for range spinners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread() // a thread each, so that they outnumber the CPUs
				defer runtime.UnlockOSThread()
				for time.Now().Before(stop) {
				}
			}()
		}
		wg.Wait()
	}
	// A thread's first reading is its baseline: spin once so that the spinners' threads
	// exist and are listed (the list is read again a second later), then measure.
	if _, err := c.read(time.Duration(1)); err != nil {
		t.Fatal(err)
	}
	spin()
	if _, err := c.read(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	spin()
	w, err := c.read(2*time.Second + time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d threads spinning 200 ms on %d CPUs: the longest wait of one %v", spinners, runtime.NumCPU(), w)
	if w < 20*time.Millisecond {
		t.Errorf("%d threads spinning 200 ms on %d CPUs: the longest wait of one %v, want at least 20ms", spinners, runtime.NumCPU(), w)
	}
}

// BenchmarkCPUWaitRead: one reading of every thread's wait (the adaptive bound takes one at
// most every waitSample, 50 a second).
func BenchmarkCPUWaitRead(b *testing.B) {
	c := newCPUWait()
	defer c.close()
	for i := range b.N {
		if _, err := c.read(time.Duration(i+1) * time.Millisecond); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(c.files)), "threads")
}
