package lab

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MemcachedPort is the port the lab's memcached replicas serve on, UDP and TCP.
const MemcachedPort = 11211

// StartMemcached runs a real memcached (the binary bin) on h: UDP and TCP on port
// MemcachedPort of h's address, one worker thread, 64 MB. It returns once memcached accepts
// TCP connections; stop it with StopProcess.
func StartMemcached(h *Host, bin string) (*exec.Cmd, error) {
	cmd := h.Command(bin, "-U", strconv.Itoa(MemcachedPort), "-p", strconv.Itoa(MemcachedPort),
		"-l", h.IPv4.String(), "-u", "root", "-m", "64", "-t", "1")
	if err := h.Start(cmd); err != nil {
		return nil, fmt.Errorf("start memcached on %s: %w", h.HostName, err)
	}
	addr := netip.AddrPortFrom(h.IPv4, MemcachedPort).String()
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := h.Do(func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return cmd, nil
		}
		if time.Now().After(deadline) {
			StopProcess(cmd)
			return nil, fmt.Errorf("memcached on %s does not listen on %s: %w", h.HostName, addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StopProcess ends a process started in a lab host (continuing it first, should it be
// stopped) and reaps it.
func StopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// MemcachedStats reads the counters (`stats`) of the memcached on h over TCP from h's own
// namespace, so the request never passes a hedger attached elsewhere.
func MemcachedStats(h *Host) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := h.Do(func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(h.IPv4, MemcachedPort).String(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("stats\r\n")); err != nil {
			return err
		}
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 1 && f[0] == "END" {
				return nil
			}
			if len(f) == 3 && f[0] == "STAT" {
				if v, err := strconv.ParseUint(f[2], 10, 64); err == nil {
					out[f[1]] = v
				}
			}
		}
		return fmt.Errorf("no END (%v)", sc.Err())
	})
	if err != nil {
		return nil, fmt.Errorf("memcached stats on %s: %w", h.HostName, err)
	}
	return out, nil
}

// MemcachedStore stores value under each key on the memcached of h over TCP (from h's own
// namespace), pipelined, and checks every answer is STORED.
func MemcachedStore(h *Host, keys []string, value string) error {
	return h.Do(func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(h.IPv4, MemcachedPort).String(), time.Second)
		if err != nil {
			return fmt.Errorf("memcached store on %s: %w", h.HostName, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		w := bufio.NewWriter(c)
		for _, k := range keys {
			fmt.Fprintf(w, "set %s 0 0 %d\r\n%s\r\n", k, len(value), value)
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("memcached store on %s: %w", h.HostName, err)
		}
		sc := bufio.NewScanner(c)
		for i := range keys {
			if !sc.Scan() || sc.Text() != "STORED" {
				return fmt.Errorf("memcached store on %s: key %s answered %q (%v)", h.HostName, keys[i], sc.Text(), sc.Err())
			}
		}
		return nil
	})
}
