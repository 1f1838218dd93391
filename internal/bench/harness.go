package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The process harness every benchmark drives its lab with: servers and clients are real
// processes started inside lab hosts, CPU pressure is real busy loops, and CPU cost is read
// from /proc/stat around a run.

// Place is where a benchmark's process runs: a network namespace that makes commands and
// starts them inside itself (a lab host, a netnsx.Netns).
type Place interface {
	Command(name string, args ...string) *exec.Cmd
	Start(cmd *exec.Cmd) error
}

// StartProcess starts name with args inside h, its stdout discarded and its stderr on
// kedge's, and returns a function that stops it: SIGTERM, then SIGKILL after 5 s.
func StartProcess(h Place, name string, args ...string) (stop func(), err error) {
	_, stop, err = StartProcessPID(h, name, args...)
	return stop, err
}

// StartProcessPID is StartProcess that also returns the process's PID (for ProcCPU).
func StartProcessPID(h Place, name string, args ...string) (pid int, stop func(), err error) {
	cmd := h.Command(name, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := h.Start(cmd); err != nil {
		return 0, nil, fmt.Errorf("start %s: %w", filepath.Base(name), err)
	}
	return cmd.Process.Pid, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}, nil
}

// RunProcess runs name with args inside h and waits for it; a failure carries its stderr.
// When ctx ends first the process is killed.
func RunProcess(ctx context.Context, h Place, stdout io.Writer, name string, args ...string) error {
	_, err := RunProcessCPU(ctx, h, stdout, name, args...)
	return err
}

// RunProcessCPU is RunProcess that also returns the CPU time (user + system, rusage) the
// process used.
func RunProcessCPU(ctx context.Context, h Place, stdout io.Writer, name string, args ...string) (time.Duration, error) {
	cmd := h.Command(name, args...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := h.Start(cmd); err != nil {
		return 0, fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return 0, fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(stderr.String()))
		}
		return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return 0, ctx.Err()
	}
}

// ProcCPU is the CPU time (user + system) process pid has used so far, from
// /proc/<pid>/stat (its threads included, its children not).
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read process CPU time: %w", err)
	}
	return parseProcStatCPU(string(b))
}

// parseProcStatCPU reads utime and stime (fields 14 and 15, in USER_HZ ticks) of a
// /proc/<pid>/stat line; the command name (field 2) may hold spaces and parentheses.
func parseProcStatCPU(line string) (time.Duration, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("read process CPU time: no command name in %q", line)
	}
	f := strings.Fields(line[i+1:]) // field 3 (state) onwards
	if len(f) < 13 {
		return 0, fmt.Errorf("read process CPU time: %d fields after the name, want at least 13", len(f))
	}
	var sum time.Duration
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read process CPU time: %q: %w", s, err)
		}
		sum += time.Duration(v) * time.Second / userHZ
	}
	return sum, nil
}

// SelfCPU is the CPU time (user + system, all threads) this process has used so far.
func SelfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("read own CPU time: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// KsoftirqdPIDs lists the PIDs of the kernel's ksoftirqd threads, which run the softirq
// work (network receive, qdisc timers) that does not run on the back of another task.
func KsoftirqdPIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.HasPrefix(string(b), "ksoftirqd/") {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return nil, errors.New("list ksoftirqd threads: none found in /proc")
	}
	return pids, nil
}

// Spin starts n busy-looping processes (CPU pressure) and returns a function that kills
// them by PID. They die with kedge too (PDEATHSIG).
func Spin(n int) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for i := 0; i < n; i++ {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("start CPU spinner: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// CPUTimes is the machine-wide CPU time of /proc/stat's "cpu" line.
type CPUTimes struct {
	Busy    time.Duration // every state but idle and iowait
	Softirq time.Duration // the softirq part of Busy
	Wall    time.Duration // when read (monotonic), for rates
}

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux architecture kedge runs on).
const userHZ = 100

var monoStart = time.Now()

// ReadCPU reads the machine's CPU times now.
func ReadCPU() (CPUTimes, error) { return readCPUFrom("/proc/stat") }

func readCPUFrom(path string) (CPUTimes, error) {
	all, err := readStat(path)
	if err != nil {
		return CPUTimes{}, err
	}
	t, ok := all["cpu"]
	if !ok {
		return CPUTimes{}, fmt.Errorf("read CPU times: no cpu line in %s", path)
	}
	return t, nil
}

// ReadSteal reads the time the hypervisor took from this machine's CPUs so far (/proc/stat's
// cpu line, its eighth field, steal, in USER_HZ ticks), summed over the CPUs. On a VM whose
// host runs other work, a run with steal in it ran on a slower machine than its neighbours.
func ReadSteal() (time.Duration, error) { return readStealFrom("/proc/stat") }

func readStealFrom(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read steal: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("read steal: %s: first line %q: want cpu and at least 8 fields", path, line)
	}
	ticks, err := strconv.ParseUint(f[8], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read steal: %s: %q: %w", path, f[8], err)
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// ReadPerCPU reads each CPU's times now (index N: /proc/stat's cpuN line), for placements
// that pin processes to CPUs.
func ReadPerCPU() ([]CPUTimes, error) { return readPerCPUFrom("/proc/stat") }

func readPerCPUFrom(path string) ([]CPUTimes, error) {
	all, err := readStat(path)
	if err != nil {
		return nil, err
	}
	var out []CPUTimes
	for name, t := range all {
		n, err := strconv.Atoi(strings.TrimPrefix(name, "cpu"))
		if err != nil || n < 0 || n > 4096 {
			continue
		}
		for len(out) <= n {
			out = append(out, CPUTimes{})
		}
		out[n] = t
	}
	return out, nil
}

// readStat reads the cpu and cpuN lines of a /proc/stat file, by name.
func readStat(path string) (map[string]CPUTimes, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read CPU times: %w", err)
	}
	defer f.Close()
	out := map[string]CPUTimes{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || !strings.HasPrefix(fields[0], "cpu") {
			continue
		}
		// user nice system idle iowait irq softirq [steal guest guest_nice]; guest time is
		// already part of user.
		var t CPUTimes
		for i, f := range fields[1:min(len(fields), 9)] {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("read CPU times: %s: %s field %d %q: %w", path, fields[0], i+1, f, err)
			}
			d := time.Duration(v) * time.Second / userHZ
			switch i {
			case 3, 4: // idle, iowait
			case 6:
				t.Softirq = d
				t.Busy += d
			default:
				t.Busy += d
			}
		}
		t.Wall = time.Since(monoStart)
		out[fields[0]] = t
	}
	return out, nil
}

// Sub is the CPU time from b to a.
func (a CPUTimes) Sub(b CPUTimes) CPUTimes {
	return CPUTimes{Busy: a.Busy - b.Busy, Softirq: a.Softirq - b.Softirq, Wall: a.Wall - b.Wall}
}

// BusyCPUs is the average number of busy CPUs over the interval (2.0: two cores busy).
func (a CPUTimes) BusyCPUs() float64 {
	if a.Wall <= 0 {
		return 0
	}
	return a.Busy.Seconds() / a.Wall.Seconds()
}

// IdleCPU measures the busy CPUs over d while the caller sends nothing: the machine's
// background load, and what an attached program costs with no traffic.
func IdleCPU(ctx context.Context, d time.Duration) (float64, error) {
	a, err := ReadCPU()
	if err != nil {
		return 0, err
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	b, err := ReadCPU()
	if err != nil {
		return 0, err
	}
	return b.Sub(a).BusyCPUs(), nil
}
