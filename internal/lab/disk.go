package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// Disks: a filesystem of its own for one process, so that one process's disk stall (the
// disk-stall fault, fabric_disk.go) is that process's alone. Processes whose data share one
// filesystem share its journal: a commit waits for every ordered data write in it, so the
// throttled writes of one hold up the others' fsyncs (seconds, measured), and the stall is
// no longer one node's.
//
// A Disk is a sparse file with ext4 on it, attached to a loop device with direct I/O (the
// loop's writes go to the backing file's disk, not through the host's page cache). A
// process started with Disk.Mount runs in a mount namespace of its own where the disk is
// mounted over a directory; nothing is mounted in the caller's namespace, and the mount goes
// with the process (and with every other process of that namespace). A process restarted
// with Mount finds what the last one wrote. The disk-stall fault throttles the loop device
// (7:N) of the process it stalls, and only that one.
//
// The backing files are in DiskDir, named kedge-<owner>-<name>.img: `kedge cleanup` detaches
// and deletes those of owners that are gone. Close does it otherwise. The loop device is
// set to detach by itself when its last user closes it (the Disk holds it open until
// Close), so after a SIGKILL of the creator and of the processes that mounted it the device
// is free again and only the file is left for cleanup.

// KindDisk is the cleanup kind of the lab's disks (backing file and loop device).
const KindDisk = "lab disk"

// DiskDir holds the disks' backing files: on a disk (not tmpfs, whose pages are RAM), and
// kept across reboots only until the next cleanup.
const DiskDir = "/var/tmp/kedge-disks"

// DiskSize is the default size of a disk: the file is sparse, so it takes on the host's
// disk only what is written (a 10-minute benchmark run writes a few hundred megabytes).
const DiskSize = 4 << 30

// Disk is one filesystem on a loop device.
type Disk struct {
	Name string // kedge-<owner>-<name>
	File string // backing file in DiskDir
	Loop string // /dev/loopN
	Dev  string // "major:minor" of the loop device (what the disk-stall fault throttles)
	// DirectIO reports whether the loop device does direct I/O on its file (the kernel
	// falls back to buffered I/O where the backing filesystem cannot).
	DirectIO bool

	loop *os.File // held open: the device detaches (autoclear) when the last user closes it
}

// NewDisk makes a disk of size bytes (0: DiskSize) named after this process's owner ID and
// name (letters, digits, '_', '.', '-'). On error nothing is left.
func NewDisk(name string, size int64) (_ *Disk, err error) {
	if !hostNameRE.MatchString(name) {
		return nil, fmt.Errorf("disk name %q is not valid: use letters, digits, '_', '.' or '-'", name)
	}
	if size == 0 {
		size = DiskSize
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("make disk %s: %w (install e2fsprogs)", name, err)
	}
	if err := os.MkdirAll(DiskDir, 0o700); err != nil {
		return nil, fmt.Errorf("make disk %s: %w", name, err)
	}
	d := &Disk{Name: netnsx.OwnedName(name)}
	d.File = filepath.Join(DiskDir, d.Name+".img")
	f, err := os.OpenFile(d.File, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("make disk %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.Close())
		}
	}()
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("make disk %s: %w", name, err)
	}
	// The file reads as zeros: the kernel need not zero inode tables or the journal.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", "-L", "kedge-lab", d.File).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make disk %s: mkfs.ext4: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	if err := d.attach(); err != nil {
		return nil, fmt.Errorf("make disk %s: %w", name, err)
	}
	return d, nil
}

// attach attaches the file to a free loop device, direct I/O and autoclear on.
func (d *Disk) attach() error {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open loop control: %w", err)
	}
	defer ctl.Close()
	back, err := os.OpenFile(d.File, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer back.Close() // the loop device holds its own reference
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device: %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		loop, err := openLoop(path)
		if err != nil {
			return err
		}
		cfg := unix.LoopConfig{Fd: uint32(back.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:], d.File)
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && try < 10 {
			loop.Close() // taken by another process since GET_FREE
			continue
		}
		if err != nil {
			loop.Close()
			return fmt.Errorf("attach %s to %s: %w", d.File, path, err)
		}
		d.loop, d.Loop, d.Dev = loop, path, fmt.Sprintf("%d:%d", 7, n)
		var st unix.Stat_t
		if unix.Fstat(int(loop.Fd()), &st) == nil {
			d.Dev = fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(path), "loop", "dio"))
		d.DirectIO = strings.TrimSpace(string(b)) == "1"
		return nil
	}
}

// openLoop opens a loop device; devtmpfs creates the node of a new one a moment after
// loop-control added it.
func openLoop(path string) (*os.File, error) {
	for deadline := time.Now().Add(2 * time.Second); ; {
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil || !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("open %s: %w", path, err)
			}
			return f, nil
		}
		time.Sleep(5 * time.Millisecond) // waiting for devtmpfs
	}
}

// mountScript runs in the child's new mount namespace: the mount containing the mount point
// stops propagating to the parent's namespace (it is a copy of a mount that may be shared,
// as systemd's / is), the disk goes over the mount point, and the command runs. Mounts
// elsewhere (/run/netns, where a node's own namespaces are bound) keep their propagation.
const mountScript = `set -e
mount --make-slave "$(stat -c %m "$2")"
mount -t ext4 -o noinit_itable "$1" "$2"
shift 2
exec "$@"`

// Mount changes cmd (not started yet) so that it runs in a mount namespace of its own with
// the disk mounted over dir (which must exist). The process keeps its PID (sh execs it).
func (d *Disk) Mount(cmd *exec.Cmd, dir string) {
	args := append([]string{"sh", "-c", mountScript, "kedge-disk", d.Loop, dir, cmd.Path}, cmd.Args[1:]...)
	cmd.Path, cmd.Args = "/bin/sh", args
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Cloneflags, not Unshareflags: Go would make every mount private, /run/netns too.
	cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWNS
}

// Close lets the loop device go (it detaches once nothing has it mounted: at once, or
// when the last process that mounted it is gone) and deletes the backing file.
func (d *Disk) Close() error {
	if d == nil {
		return nil
	}
	var errs []error
	if d.loop != nil {
		errs = append(errs, detachLoop(d.loop, d.File))
		d.loop.Close()
		d.loop = nil
	}
	if err := os.Remove(d.File); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// detachLoop detaches loop if it is still attached to file. A device still mounted is
// set to detach when it is unmounted (the kernel's answer to LOOP_CLR_FD on a busy device).
func detachLoop(loop *os.File, file string) error {
	info, err := unix.IoctlLoopGetStatus64(int(loop.Fd()))
	if errors.Is(err, unix.ENXIO) {
		return nil // not attached
	}
	if err != nil {
		return fmt.Errorf("status of %s: %w", loop.Name(), err)
	}
	if name := unix.ByteSliceToString(info.File_name[:]); name != file && !strings.HasPrefix(file, name) {
		return nil // attached to another file meanwhile
	}
	if err := unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: %w", loop.Name(), err)
	}
	return nil
}

// loopsOf returns the loop devices (/dev/loopN) whose backing file is file.
func loopsOf(file string) []string {
	var out []string
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == file {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(m))))
		}
	}
	return out
}

// removeDiskFile detaches what is still attached to a backing file and deletes it.
func removeDiskFile(file string) error {
	var errs []error
	for _, l := range loopsOf(file) {
		f, err := os.OpenFile(l, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, detachLoop(f, file))
		f.Close()
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// A disk's owner is in its file's name; its mounts are in its processes' namespaces, which
// the owner's processes took with them (the lab's nodes die with their creator; a
// persistent cluster's nodes are killed by its own cleaner, which runs first).
func init() {
	runstate.Register(runstate.Cleaner{Kind: KindDisk, Order: 27, List: func(runstate.Scope) ([]runstate.Leftover, error) {
		entries, err := os.ReadDir(DiskDir)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", DiskDir, err)
		}
		var out []runstate.Leftover
		for _, e := range entries {
			base, ok := strings.CutSuffix(e.Name(), ".img")
			owner, owned := netnsx.OwnerID(base)
			if !ok || !owned || !e.Type().IsRegular() {
				continue
			}
			file := filepath.Join(DiskDir, e.Name())
			out = append(out, runstate.Leftover{Kind: KindDisk, Name: file, Owner: owner, Remove: func() error { return removeDiskFile(file) }})
		}
		return out, nil
	}})
}
