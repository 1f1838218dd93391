package bpfx

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrNoCgroup2 says that no cgroup2 hierarchy is mounted (a cgroup v1-only host).
var ErrNoCgroup2 = errors.New("no cgroup2 hierarchy is mounted")

// Cgroup2Root returns where the cgroup2 hierarchy's root is mounted (/sys/fs/cgroup on a
// unified host, /sys/fs/cgroup/unified on a hybrid one), read from /proc/self/mountinfo.
// Cgroup programs (sock_ops, cgroup_skb, ...) attach to directories below it.
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find the cgroup2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 && fields[3] == "/" {
				return unescapeMountinfo(fields[4]), nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("find the cgroup2 mount: %w", err)
	}
	return "", ErrNoCgroup2
}

// unescapeMountinfo undoes /proc's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
