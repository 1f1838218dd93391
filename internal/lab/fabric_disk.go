package lab

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// Disk stalls: one process's block writes throttled so that its fsyncs take hundreds of
// milliseconds, as on a disk that stalls (the failure etcd's and CockroachDB's users report).
// The process goes into a cgroup of its own whose write IOPS on the device holding a path
// are limited (cgroup v1 blkio.throttle.write_iops_device, or cgroup v2 io.max where the io
// controller is enabled at the root); nothing else moves, no device or host setting
// changes, and Stop puts the process back. The cgroup's name carries the owner ID, so
// `kedge cleanup` removes one left by a run that died.

// KindStallCgroup is the cleanup kind of the disk-stall cgroups.
const KindStallCgroup = "disk-stall cgroup"

const stallPrefix = "kedge-stall-" // + owner ID + "-" + pid

// DiskStall is one process's throttled writes.
type DiskStall struct {
	PID       int
	Device    string // "major:minor" of the whole disk throttled
	WriteIOPS int
	Cgroup    string // the cgroup's directory

	v2   bool
	orig string // the process's cgroup before (relative to the hierarchy's root)
	root string // the hierarchy's mount point
}

// StallDisk limits pid's writes to the disk holding path to writeIOPS (>= 1) write requests
// per second: at 10, an fsync that writes a few blocks takes a few hundred milliseconds.
func StallDisk(pid int, path string, writeIOPS int) (_ *DiskStall, err error) {
	if writeIOPS < 1 {
		return nil, fmt.Errorf("stall disk of pid %d: %d write IOPS: use at least 1", pid, writeIOPS)
	}
	dev, err := wholeDisk(path)
	if err != nil {
		return nil, fmt.Errorf("stall disk of pid %d: %w", pid, err)
	}
	s := &DiskStall{PID: pid, Device: dev, WriteIOPS: writeIOPS}
	if s.root, s.v2, err = ioHierarchy(); err != nil {
		return nil, fmt.Errorf("stall disk of pid %d: %w", pid, err)
	}
	if s.orig, err = procCgroup(pid, s.v2); err != nil {
		return nil, fmt.Errorf("stall disk of pid %d: %w", pid, err)
	}
	s.Cgroup = filepath.Join(s.root, fmt.Sprintf("%s%s-%d", stallPrefix, runstate.SelfID(), pid))
	if err := os.Mkdir(s.Cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("stall disk of pid %d: make cgroup: %w", pid, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Stop())
		}
	}()
	file, limit := "blkio.throttle.write_iops_device", fmt.Sprintf("%s %d", dev, writeIOPS)
	if s.v2 {
		file, limit = "io.max", fmt.Sprintf("%s wiops=%d", dev, writeIOPS)
	}
	if err := os.WriteFile(filepath.Join(s.Cgroup, file), []byte(limit), 0o644); err != nil {
		return nil, fmt.Errorf("stall disk of pid %d: write %s %q: %w", pid, file, limit, err)
	}
	if err := os.WriteFile(filepath.Join(s.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return nil, fmt.Errorf("stall disk of pid %d: move it into %s: %w", pid, s.Cgroup, err)
	}
	return s, nil
}

// Stop puts the process back into its cgroup (if it still runs) and removes the stall's.
func (s *DiskStall) Stop() error {
	var errs []error
	back := filepath.Join(s.root, s.orig, "cgroup.procs")
	if err := os.WriteFile(back, []byte(strconv.Itoa(s.PID)), 0o644); err != nil && !errors.Is(err, syscall.ESRCH) {
		errs = append(errs, fmt.Errorf("move pid %d back to %s: %w", s.PID, s.orig, err))
	}
	if err := removeCgroupDir(s.Cgroup); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeCgroupDir removes an emptied cgroup; a process that just died may keep it busy for a
// moment (EBUSY until the kernel has released it).
func removeCgroupDir(dir string) error {
	var err error
	for try := 0; try < 100; try++ {
		if err = unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond) // waiting for the kernel to release the cgroup
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}

// wholeDisk is "major:minor" of the disk holding path (the whole disk when it is on a
// partition: the throttle applies to disks).
func wholeDisk(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	major, minor := unix.Major(st.Dev), unix.Minor(st.Dev)
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)
	if _, err := os.Stat(sys); err != nil {
		return "", fmt.Errorf("%s is on device %d:%d, which is no block device (tmpfs, overlay?): put the data on a disk", path, major, minor)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		b, err := os.ReadFile(filepath.Join(sys, "..", "dev"))
		if err != nil {
			return "", fmt.Errorf("find the disk of partition %d:%d: %w", major, minor, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return fmt.Sprintf("%d:%d", major, minor), nil
}

// ioHierarchy finds where block-I/O limits are set: the cgroup v1 blkio hierarchy, else the
// cgroup v2 root when its io controller is enabled for children.
func ioHierarchy() (root string, v2 bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	var unified string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mount-point ... - fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 3 {
			continue
		}
		switch tail[0] {
		case "cgroup":
			for _, o := range strings.Split(tail[2], ",") {
				if o == "blkio" {
					return fields[4], false, nil
				}
			}
		case "cgroup2":
			if unified == "" {
				unified = fields[4]
			}
		}
	}
	if unified != "" {
		if b, err := os.ReadFile(filepath.Join(unified, "cgroup.subtree_control")); err == nil && strings.Contains(" "+string(b)+" ", " io ") {
			return unified, true, nil
		}
	}
	return "", false, errors.New("no cgroup v1 blkio hierarchy and no cgroup v2 io controller enabled at the root: block writes cannot be throttled here")
}

// procCgroup is pid's cgroup in the blkio (v1) or unified (v2) hierarchy.
func procCgroup(pid int, v2 bool) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[0] == "0" && parts[1] == "" {
			return parts[2], nil
		}
		if !v2 && strings.Contains(","+parts[1]+",", ",blkio,") {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("pid %d has no %s cgroup", pid, map[bool]string{true: "unified", false: "blkio"}[v2])
}

func init() {
	runstate.Register(runstate.Cleaner{Kind: KindStallCgroup, Order: 5, List: func(runstate.Scope) ([]runstate.Leftover, error) {
		root, _, err := ioHierarchy()
		if err != nil {
			return nil, nil // nothing can have been made
		}
		entries, err := os.ReadDir(root)
		if err != nil {
			return nil, err
		}
		var out []runstate.Leftover
		for _, e := range entries {
			rest, ok := strings.CutPrefix(e.Name(), stallPrefix)
			i := strings.LastIndexByte(rest, '-')
			if !ok || !e.IsDir() || i < 0 {
				continue
			}
			dir := filepath.Join(root, e.Name())
			out = append(out, runstate.Leftover{Kind: KindStallCgroup, Name: dir, Owner: rest[:i], Remove: func() error {
				// Its process (a lab node) goes back to the hierarchy's root.
				if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
					for _, p := range strings.Fields(string(b)) {
						os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(p), 0o644) //nolint:errcheck // best effort: rmdir says
					}
				}
				return removeCgroupDir(dir)
			}})
		}
		return out, nil
	}})
}
