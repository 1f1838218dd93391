package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process faults for the processes a lab's hosts run: pause and resume (SIGSTOP/SIGCONT),
// kill -9 (the caller restarts what it started), and CPU starvation. They complement the
// fabric's packet faults; none of them touches anything but the given process.

// pauseWait bounds how long Pause waits for every thread of the process to stop.
const pauseWait = 5 * time.Second

// Pause stops pid (SIGSTOP): it keeps its sockets and state but runs no code until Resume.
// It returns once every thread of pid is stopped: SIGSTOP is only sent by kill(2); the group
// stop begins when one thread dequeues it and reaches the others after that, so on a busy
// machine another thread of a multi-threaded server (memcached's workers) can go on
// answering for milliseconds after kill returns.
func Pause(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(pauseWait)
	for {
		running, err := runningThreads(pid)
		if err != nil {
			return fmt.Errorf("pause pid %d: %w", pid, err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pause pid %d: %d threads still not stopped %v after SIGSTOP", pid, running, pauseWait)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// runningThreads counts the threads of pid that are not stopped (state T or t in
// /proc/<pid>/task/<tid>/stat) and not exiting (Z, X).
func runningThreads(pid int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tids, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	running := 0
	for _, tid := range tids {
		b, err := os.ReadFile(filepath.Join(dir, tid.Name(), "stat"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread exited
			}
			return 0, err
		}
		// The state follows the command name, which is in parentheses and may contain any byte.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return 0, fmt.Errorf("%s/%s/stat: unexpected format %q", dir, tid.Name(), b)
		}
		switch b[i+2] {
		case 'T', 't', 'Z', 'X':
		default:
			running++
		}
	}
	return running, nil
}

// Resume continues a paused pid (SIGCONT).
func Resume(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume pid %d: %w", pid, err)
	}
	return nil
}

// Starver starves one process of CPU: every thread of the process is pinned to one CPU
// (sched_setaffinity) and Spinners busy threads of this process, pinned to the same CPU,
// compete with it. With the default scheduler each runnable thread gets an equal share, so
// the target gets about 1/(Spinners+1) of that CPU. Stop restores the target's affinity.
// No cgroup or scheduler setting is changed.
type Starver struct {
	PID      int
	CPU      int
	Spinners int

	orig map[int]unix.CPUSet // per thread, to restore
	stop chan struct{}
	wg   sync.WaitGroup
}

// Starve starts starving pid on cpu with the given number of spinners (>= 1).
func Starve(pid, cpu, spinners int) (_ *Starver, err error) {
	if spinners < 1 {
		return nil, fmt.Errorf("starve pid %d: %d spinners: use at least 1", pid, spinners)
	}
	if cpu < 0 || cpu >= runtime.NumCPU() {
		return nil, fmt.Errorf("starve pid %d: cpu %d out of range 0-%d", pid, cpu, runtime.NumCPU()-1)
	}
	s := &Starver{PID: pid, CPU: cpu, Spinners: spinners, orig: map[int]unix.CPUSet{}, stop: make(chan struct{})}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Stop())
		}
	}()
	if err := s.pin(); err != nil {
		return nil, err
	}
	ready := make(chan error, spinners)
	for range spinners {
		s.wg.Add(1)
		go s.spin(ready)
	}
	for range spinners {
		if err := <-ready; err != nil {
			return nil, err
		}
	}
	return s, nil
}

// pin moves every thread of the target to s.CPU, remembering its old affinity. Threads the
// target starts later inherit the affinity of the thread that creates them.
func (s *Starver) pin() error {
	tids, err := threads(s.PID)
	if err != nil {
		return err
	}
	var set unix.CPUSet
	set.Set(s.CPU)
	for _, tid := range tids {
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &old); err != nil {
			continue // the thread exited
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			continue
		}
		if _, seen := s.orig[tid]; !seen {
			s.orig[tid] = old
		}
	}
	if len(s.orig) == 0 {
		return fmt.Errorf("starve pid %d: no thread could be pinned (process gone?)", s.PID)
	}
	return nil
}

func (s *Starver) spin(ready chan<- error) {
	defer s.wg.Done()
	// The thread gets its affinity back before it is unlocked: a locked thread that ended
	// with its goroutine would take down every child started from it with Pdeathsig (the
	// lab's node processes are).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		ready <- fmt.Errorf("read spinner affinity: %w", err)
		return
	}
	set.Set(s.CPU)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		ready <- fmt.Errorf("pin spinner to cpu %d: %w", s.CPU, err)
		return
	}
	defer unix.SchedSetaffinity(0, &old) //nolint:errcheck // the thread lives on either way
	ready <- nil
	for i := 0; ; i++ {
		if i&0xffff == 0 {
			select {
			case <-s.stop:
				return
			default:
			}
		}
	}
}

// Stop ends the spinners and gives the target's threads their old affinity back.
func (s *Starver) Stop() error {
	select {
	case <-s.stop:
		return nil
	default:
		close(s.stop)
	}
	s.wg.Wait()
	var errs []error
	for tid, old := range s.orig {
		if err := unix.SchedSetaffinity(tid, &old); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("restore affinity of thread %d: %w", tid, err))
		}
	}
	return errors.Join(errs...)
}

// threads lists the thread ids of pid.
func threads(pid int) ([]int, error) {
	entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, fmt.Errorf("list threads of pid %d: %w", pid, err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// CPUTime returns the user+system CPU time pid has used, in clock ticks (/proc/pid/stat).
func CPUTime(pid int) (uint64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 13 {
		return 0, fmt.Errorf("parse stat of pid %d: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parse stat of pid %d: %w", pid, err)
	}
	return u + st, nil
}

// procState returns the state letter of pid (R, S, T, ...).
func procState(pid int) (byte, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) == 0 || f[0] == "" {
		return 0, fmt.Errorf("parse stat of pid %d: no state", pid)
	}
	return f[0][0], nil
}

// statFields returns the fields of /proc/pid/stat after the command name (which may hold
// spaces and parentheses): state first.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	i := strings.LastIndexByte(string(b), ')')
	return strings.Fields(string(b[i+1:])), nil
}
