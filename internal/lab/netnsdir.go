package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// ErrHidden: a namespace's mount lies beneath a later mount of NetnsDir over itself (made by
// 'ip netns add' while the namespace existed, before kedge prepared NetnsDir as iproute2
// does), and could not be uncovered (see removeHidden).
var ErrHidden = errors.New("its mount is hidden beneath a later bind mount of " + NetnsDir)

// prepareNetnsDir makes NetnsDir what iproute2's `ip netns add` makes it before creating a
// namespace: a shared mount (MS_SHARED|MS_REC), turning the directory into a bind mount of
// itself first when it is not a mount point yet. Once it is one, `ip netns add` finds it
// prepared and mounts nothing over it, so namespaces made by either tool stay visible to
// both, in any order. (Were NetnsDir left a plain directory, ip's first `netns add` would
// bind-mount it over itself and hide the mounts under it: kedge could then neither unmount
// nor remove its entries - EINVAL, EBUSY.) kedge processes take turns through a flock on
// the directory, so two of them never stack two bind mounts.
func prepareNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", NetnsDir, err)
	}
	err := makeShared()
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	d, err := lockNetnsDir(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer d.Close()
	// Made a mount point by another process meanwhile?
	if err := makeShared(); !errors.Is(err, unix.EINVAL) {
		return err
	}
	if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount --bind %s %s: %w", NetnsDir, NetnsDir, err)
	}
	return makeShared()
}

// lockNetnsDir takes a flock (LOCK_EX or LOCK_SH) on NetnsDir; closing the file drops it.
func lockNetnsDir(how int) (*os.File, error) {
	d, err := os.Open(NetnsDir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", NetnsDir, err)
	}
	if err := unix.Flock(int(d.Fd()), how); err != nil {
		d.Close()
		return nil, fmt.Errorf("lock %s: %w", NetnsDir, err)
	}
	return d, nil
}

// makeShared is `mount --make-rshared NetnsDir`; EINVAL (returned as is) means NetnsDir is
// not a mount point.
func makeShared() error {
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("mount --make-shared %s: %w", NetnsDir, err)
	}
	return err
}

// newNamed creates a network namespace, moves the calling (locked) thread into it and
// bind-mounts it at NetnsDir/name, as `ip netns add` does. (Through /proc/thread-self: in a
// PID namespace of its own, this thread's tid does not name it in /proc.)
func newNamed(name string) (netns.NsHandle, error) {
	if err := prepareNetnsDir(); err != nil {
		return -1, err
	}
	// Shared lock: removeHidden (exclusive) never moves NetnsDir's mount away while a
	// kedge process mounts a namespace in it.
	d, err := lockNetnsDir(unix.LOCK_SH)
	if err != nil {
		return -1, err
	}
	defer d.Close()
	p := filepath.Join(NetnsDir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return -1, err
	}
	f.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		_ = os.Remove(p)
		return -1, fmt.Errorf("new netns: %w", err)
	}
	h, err := bpfx.ThreadNetns()
	if err != nil {
		_ = os.Remove(p)
		return -1, fmt.Errorf("new netns: %w", err)
	}
	if err := unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, ""); err != nil {
		h.Close()
		_ = os.Remove(p)
		return -1, fmt.Errorf("bind-mount netns at %s: %w", p, err)
	}
	return h, nil
}

// deleteNamed unmounts and removes NetnsDir/name. It returns an error wrapping
// os.ErrNotExist when there is no such entry, and one wrapping ErrHidden when the entry is
// a mount point hidden beneath a later mount of NetnsDir (see prepareNetnsDir).
func deleteNamed(name string) error {
	p := filepath.Join(NetnsDir, name)
	// MNT_DETACH as `ip netns del`: a process still inside (or an fd) keeps the namespace,
	// not the entry. EINVAL: not a mount point (any more), or hidden - the removal decides.
	uerr := unix.Unmount(p, unix.MNT_DETACH)
	if uerr != nil && !errors.Is(uerr, unix.EINVAL) && !errors.Is(uerr, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", p, uerr)
	}
	err := os.Remove(p)
	if errors.Is(err, unix.EBUSY) {
		return removeHidden(name)
	}
	return err
}

// removeHidden removes the entry name whose namespace mount is hidden: NetnsDir was
// bind-mounted over itself after the mount was made, so the path reaches the upper mount's
// (empty) file, the mount cannot be unmounted through it, and the file, a mount point
// below, cannot be removed (EBUSY). It uncovers the mount for a moment: a recursive clone of
// the upper mount (with every namespace mounted in it) is taken, the upper mount detached,
// the hidden entry unmounted and removed, and the clone moved back into place, all under
// the flock that prepareNetnsDir takes. Namespaces mounted in the upper layer stay alive
// throughout (the clone holds them); for that moment they are out of sight of other tools.
// It is done only where NetnsDir's parent mount is private: beneath a shared parent
// (systemd's /run) the detach would propagate to other mount namespaces.
func removeHidden(name string) error {
	p := filepath.Join(NetnsDir, name)
	d, err := lockNetnsDir(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer d.Close()
	shared, err := parentShared(NetnsDir)
	if err != nil {
		return fmt.Errorf("remove %s: %w (%w)", p, ErrHidden, err)
	}
	if shared {
		return fmt.Errorf("remove %s: %w, below a shared mount that kedge does not reshuffle; the entry stays until that bind mount goes (at the latest at reboot)", p, ErrHidden)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, NetnsDir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("remove %s: %w; clone the mount of %s: %w", p, ErrHidden, NetnsDir, err)
	}
	defer unix.Close(tree)
	// The clone is a peer of what it copies: unless made private, detaching the upper
	// mount would propagate into the clone and unmount the namespaces it holds.
	attr := unix.MountAttr{Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("remove %s: %w; make the clone of %s private (kernel 5.12+): %w", p, ErrHidden, NetnsDir, err)
	}
	if err := unix.Unmount(NetnsDir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("remove %s: %w; detach the mount of %s: %w", p, ErrHidden, NetnsDir, err)
	}
	uerr := unix.Unmount(p, unix.MNT_DETACH)
	if errors.Is(uerr, unix.EINVAL) {
		uerr = nil // nothing mounted here either: the removal decides
	}
	rerr := os.Remove(p)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, NetnsDir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("put the mount of %s back: %w - the namespaces mounted there are out of sight until it is (mount --bind %s %s and recreate them)",
			NetnsDir, err, NetnsDir, NetnsDir)
	}
	if err := makeShared(); err != nil {
		return err
	}
	if err := errors.Join(uerr, rerr); err != nil {
		return fmt.Errorf("remove %s (uncovered): %w", p, err)
	}
	return nil
}

// parentShared reports whether the mount under the topmost mount at dir is shared.
func parentShared(dir string) (bool, error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false, err
	}
	type mnt struct {
		parent string
		shared bool
	}
	byID := map[string]mnt{}
	top := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		m := mnt{parent: f[1]}
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			m.shared = m.shared || strings.HasPrefix(opt, "shared:")
		}
		byID[f[0]] = m
		if f[4] == dir {
			top = f[0] // later lines are mounted later: the last one is on top
		}
	}
	if top == "" {
		return false, fmt.Errorf("%s is not a mount point", dir)
	}
	return byID[byID[top].parent].shared, nil
}
