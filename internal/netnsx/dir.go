package netnsx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrHidden: a namespace's mount lies beneath a later mount of Dir over itself (made by
// 'ip netns add' while the namespace existed, before kedge prepared Dir as iproute2
// does), and could not be uncovered (see removeHidden).
var ErrHidden = errors.New("its mount is hidden beneath a later bind mount of " + Dir)

// prepareDir makes Dir what iproute2's `ip netns add` makes it before creating a
// namespace: a shared mount (MS_SHARED|MS_REC), turning the directory into a bind mount of
// itself first when it is not a mount point yet. Once it is one, `ip netns add` finds it
// prepared and mounts nothing over it, so namespaces made by either tool stay visible to
// both, in any order. (Were Dir left a plain directory, ip's first `netns add` would
// bind-mount it over itself and hide the mounts under it: kedge could then neither unmount
// nor remove its entries - EINVAL, EBUSY.) kedge processes take turns through a flock on
// the directory, so two of them never stack two bind mounts.
func prepareDir() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", Dir, err)
	}
	err := makeShared()
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	d, err := lockDir(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer d.Close()
	// Made a mount point by another process meanwhile?
	if err := makeShared(); !errors.Is(err, unix.EINVAL) {
		return err
	}
	if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount --bind %s %s: %w", Dir, Dir, err)
	}
	return makeShared()
}

// lockDir takes a flock (LOCK_EX or LOCK_SH) on Dir; closing the file drops it.
func lockDir(how int) (*os.File, error) {
	d, err := os.Open(Dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", Dir, err)
	}
	if err := unix.Flock(int(d.Fd()), how); err != nil {
		d.Close()
		return nil, fmt.Errorf("lock %s: %w", Dir, err)
	}
	return d, nil
}

// makeShared is `mount --make-rshared Dir`; EINVAL (returned as is) means Dir is
// not a mount point.
func makeShared() error {
	err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("mount --make-shared %s: %w", Dir, err)
	}
	return err
}

// newNamed creates a network namespace, moves the calling (locked) thread into it and
// bind-mounts it at Dir/name, as `ip netns add` does. (Through /proc/thread-self: in a
// PID namespace of its own, this thread's tid does not name it in /proc.)
func newNamed(name string) (netns.NsHandle, error) {
	if err := prepareDir(); err != nil {
		return -1, err
	}
	// Shared lock: removeHidden (exclusive) never moves Dir's mount away while a
	// kedge process mounts a namespace in it.
	d, err := lockDir(unix.LOCK_SH)
	if err != nil {
		return -1, err
	}
	defer d.Close()
	p := filepath.Join(Dir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return -1, err
	}
	f.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		_ = os.Remove(p)
		return -1, fmt.Errorf("new netns: %w", err)
	}
	h, err := Thread()
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

// Delete unmounts and removes Dir/name. It returns an error wrapping
// os.ErrNotExist when there is no such entry, and one wrapping ErrHidden when the entry is
// a mount point hidden beneath a later mount of Dir (see prepareDir).
func Delete(name string) error {
	p := filepath.Join(Dir, name)
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

// removeHidden removes the entry name whose namespace mount is hidden: Dir was
// bind-mounted over itself after the mount was made, so the path reaches the upper mount's
// (empty) file, the mount cannot be unmounted through it, and the file, a mount point
// below, cannot be removed (EBUSY). It uncovers the mount for a moment: a recursive clone of
// the upper mount (with every namespace mounted in it) is taken, the upper mount detached,
// the hidden entry unmounted and removed, and the clone moved back into place, all under
// the flock that prepareDir takes. Namespaces mounted in the upper layer stay alive
// throughout (the clone holds them); for that moment they are out of sight of other tools.
// It is done only where Dir's parent mount is private: beneath a shared parent
// (systemd's /run) the detach would propagate to other mount namespaces.
func removeHidden(name string) error {
	p := filepath.Join(Dir, name)
	d, err := lockDir(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer d.Close()
	shared, err := parentShared(Dir)
	if err != nil {
		return fmt.Errorf("remove %s: %w (%w)", p, ErrHidden, err)
	}
	if shared {
		return fmt.Errorf("remove %s: %w, below a shared mount that kedge does not reshuffle; the entry stays until that bind mount goes (at the latest at reboot)", p, ErrHidden)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, Dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("remove %s: %w; clone the mount of %s: %w", p, ErrHidden, Dir, err)
	}
	defer unix.Close(tree)
	// The clone is a peer of what it copies: unless made private, detaching the upper
	// mount would propagate into the clone and unmount the namespaces it holds.
	attr := unix.MountAttr{Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("remove %s: %w; make the clone of %s private (kernel 5.12+): %w", p, ErrHidden, Dir, err)
	}
	if err := unix.Unmount(Dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("remove %s: %w; detach the mount of %s: %w", p, ErrHidden, Dir, err)
	}
	uerr := unix.Unmount(p, unix.MNT_DETACH)
	if errors.Is(uerr, unix.EINVAL) {
		uerr = nil // nothing mounted here either: the removal decides
	}
	rerr := os.Remove(p)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, Dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("put the mount of %s back: %w - the namespaces mounted there are out of sight until it is (mount --bind %s %s and recreate them)",
			Dir, err, Dir, Dir)
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
