package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// The process harness every benchmark drives its lab with: servers and clients are real
// processes started inside lab hosts, CPU pressure is real busy loops, and CPU cost is read
// from /proc/stat around a run.

// StartProcess starts name with args inside h, its stdout discarded and its stderr on
// kedge's, and returns a function that stops it: SIGTERM, then SIGKILL after 5 s.
func StartProcess(h *lab.Host, name string, args ...string) (stop func(), err error) {
	cmd := h.Command(name, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := h.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(name), err)
	}
	return func() {
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
func RunProcess(ctx context.Context, h *lab.Host, stdout io.Writer, name string, args ...string) error {
	cmd := h.Command(name, args...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := h.Start(cmd); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(stderr.String()))
		}
		return nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
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
	f, err := os.Open(path)
	if err != nil {
		return CPUTimes{}, fmt.Errorf("read CPU times: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[0] != "cpu" {
			continue
		}
		// user nice system idle iowait irq softirq [steal guest guest_nice]; guest time is
		// already part of user.
		var t CPUTimes
		for i, f := range fields[1:min(len(fields), 9)] {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return CPUTimes{}, fmt.Errorf("read CPU times: %s: field %d %q: %w", path, i+1, f, err)
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
		return t, nil
	}
	return CPUTimes{}, fmt.Errorf("read CPU times: no cpu line in %s", path)
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
