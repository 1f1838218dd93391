package chaos

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestInNetworkNamespace checks what the lab relies on: Listen and RunClient open their
// sockets in the network namespace of the calling goroutine's thread, and everything they
// start later keeps working there, whatever thread it runs on.
func TestInNetworkNamespace(t *testing.T) {
	skipInEmulatedGuest(t)
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace needs root")
	}
	type outcome struct {
		addr    string
		res     ClientResult
		stalled int
		err     error
	}
	done := make(chan outcome, 1)
	go func() {
		// Never unlocked: the thread leaves the root namespace, so it must die with this
		// goroutine rather than go back to the runtime's pool.
		runtime.LockOSThread()
		var o outcome
		defer func() { done <- o }()
		if o.err = unix.Unshare(unix.CLONE_NEWNET); o.err != nil {
			return
		}
		if o.err = loopbackUp(); o.err != nil {
			return
		}
		srv, err := Listen(testFaults, []string{"127.0.0.1:0"})
		if err != nil {
			o.err = err
			return
		}
		o.addr = srv.Addrs()[0].String()
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ctx) }()
		o.res, o.err = RunClient(ctx, ModeAppHedge, ClientConfig{Target: o.addr, N: 30, Warmup: 2,
			BaseID: testBase(0), Timeout: testTimeout, Delay: 20 * time.Millisecond, Concurrency: 2})
		cancel()
		if err := <-served; err != nil && o.err == nil {
			o.err = err
		}
		o.stalled = int(srv.Stats()[0].Stalls)
	}()
	o := <-done
	if o.err != nil {
		t.Fatalf("in a fresh namespace: %v", o.err)
	}
	if o.res.Timeouts() != 0 || len(o.res.Samples) != 30 || o.stalled == 0 || o.res.HedgesSent < o.stalled {
		t.Fatalf("in the namespace: %d samples, %d timeouts, %d stalls, %d hedges",
			len(o.res.Samples), o.res.Timeouts(), o.stalled, o.res.HedgesSent)
	}
	// From the root namespace the same address does not answer (the server is gone by now,
	// but it never listened here in the first place).
	res, err := RunClient(context.Background(), ModeBaseline, ClientConfig{Target: o.addr, N: 1, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Timeouts() != 1 {
		t.Errorf("a server in another namespace answered in the root namespace")
	}
}

// loopbackUp sets lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open ioctl socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}
