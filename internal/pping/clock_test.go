package pping

import (
	"compress/gzip"
	"io"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestKernelJiffyClock: the tick measured is the kernel's (CONFIG_HZ, where the kernel
// exports its config), and converting CLOCK_MONOTONIC to jiffies lands within a tick or two
// of the jiffies the kernel reports a moment later. Not in an emulated matrix guest: its
// timer interrupts come late and in bursts, so jiffies against the clock mean nothing there
// (a 6.1 guest measured a 3.3 ms tick for its HZ=250).
func TestKernelJiffyClock(t *testing.T) {
	bpftest.RequireRoot(t)
	c, err := measureJiffies()
	if err != nil {
		t.Fatal(err)
	}
	if hz := configHZ(t); hz != 0 && c.tick != time.Second/time.Duration(hz) {
		t.Errorf("tick %v, the kernel's CONFIG_HZ=%d says %v", c.tick, hz, time.Second/time.Duration(hz))
	}
	d, err := measureJiffies() // a second reference, later: both clocks moved alike
	if err != nil {
		t.Fatal(err)
	}
	if diff := int64(c.jiffies(d.refNs)) - int64(d.refJ); (diff < -2 || diff > 2) && !emulated {
		t.Errorf("jiffies from the first reference at the second's time: off by %d ticks", diff)
	} else if diff != 0 {
		t.Logf("jiffies from the first reference at the second's time: off by %d ticks", diff)
	}
	t.Logf("tick %v; reference %d jiffies at %v", c.tick, c.refJ, time.Duration(c.refNs))
}

// configHZ reads CONFIG_HZ from /proc/config.gz, or returns 0.
func configHZ(t *testing.T) int {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		t.Logf("no /proc/config.gz: the tick is not compared with CONFIG_HZ")
		return 0
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CONFIG_HZ=(\d+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	hz, _ := strconv.Atoi(string(m[1]))
	return hz
}
