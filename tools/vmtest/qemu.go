package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// guestCmdline is the kernel command line: console on the first serial port (qemu's
// stdout), reboot at once on panic (-no-reboot turns that into qemu exiting), and only
// warnings and worse on the console so they stand out from test output.
const guestCmdline = "console=ttyS0 panic=-1 quiet"

// qemuConfig is how to run one guest.
type qemuConfig struct {
	Timeout time.Duration // whole guest run; the qemu process is killed after it
	Memory  string
	CPUs    int
	Shell   bool      // attach stdin and pass output through unprefixed (interactive)
	Out     io.Writer // the guest console, each line prefixed with "[<kernel>] "
	Log     io.Writer // the raw guest console, for the work dir
}

func qemuArgs(img *kernelImage, initrd string, cfg qemuConfig) []string {
	return []string{
		// TCG: this machine's /dev/kvm cannot run qemu; the microvm machine hangs under TCG.
		"-M", "pc", "-accel", "tcg",
		"-m", cfg.Memory, "-smp", fmt.Sprint(cfg.CPUs),
		"-nographic", "-nodefaults", "-serial", "stdio", "-no-reboot",
		"-kernel", img.Vmlinuz, "-initrd", initrd,
		"-append", guestCmdline,
	}
}

// runGuest boots img with initrd and parses its console until qemu exits or the
// timeout kills it. It only ends the qemu process it started.
func runGuest(ctx context.Context, img *kernelImage, initrd string, cfg qemuConfig) *kernelResult {
	start := time.Now()
	res := newKernelResult(img.Kernel.Name, img.Package.String(), start)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", qemuArgs(img, initrd, cfg)...)
	cmd.WaitDelay = 5 * time.Second // after the kill, do not wait on the pipe forever
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if cfg.Shell {
		cmd.Stdin = os.Stdin
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		res.finish(time.Now(), false, fmt.Errorf("start qemu: %w", err))
		return res
	}
	if err := cmd.Start(); err != nil {
		res.finish(time.Now(), false, fmt.Errorf("start qemu (is qemu-system-x86 installed?): %w", err))
		return res
	}
	readConsole(stdout, res, cfg, "["+img.Kernel.Name+"] ")
	err = cmd.Wait()
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
	if err != nil && !timedOut {
		err = fmt.Errorf("run qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
	} else {
		err = nil
	}
	res.finish(time.Now(), timedOut, err)
	return res
}

// readConsole streams the guest console: to the log raw, to Out prefixed per line (or
// raw in shell mode, where a prompt has no newline), and line by line into res.
func readConsole(r io.Reader, res *kernelResult, cfg qemuConfig, prefix string) {
	if cfg.Shell {
		r = io.TeeReader(r, cfg.Out)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := cleanLine(sc.Text())
		now := time.Now()
		if cfg.Log != nil {
			fmt.Fprintln(cfg.Log, line)
		}
		if !cfg.Shell {
			fmt.Fprintln(cfg.Out, prefix+line)
		}
		res.feed(line, now)
	}
	if err := sc.Err(); err != nil {
		// Keep draining so qemu does not block on a full pipe; the run ends incomplete.
		fmt.Fprintf(cfg.Out, "%svmtest: stopped parsing the console: %v\n", prefix, err)
		_, _ = io.Copy(io.Discard, r)
	}
}
