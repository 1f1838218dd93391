// Package netnsx is kedge's network-namespace plumbing, used by production code and labs
// alike: entering a namespace (In, Thread), opening one by name or path (OpenNamed, Open),
// creating and deleting named ones under /run/netns the way iproute2 does (New, Delete,
// List; dir.go), and the owner names that let cleanup tell a live run's namespaces from an
// ended one's (OwnedName, OwnerID, CleanupStale). It knows no topology (internal/lab builds
// those on top of it) and no capability.
package netnsx

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// Prefix starts the name of everything kedge creates (namespaces, pin directories), so
// leftovers are recognisable. Namespace names are Prefix-<owner ID>-<rest>, the owner ID
// being runstate's (<pid>_<hex>; a bare pid in names made before runstate).
const Prefix = "kedge"

// Dir is where named network namespaces are bind-mounted (as `ip netns` does).
const Dir = "/run/netns"

// Netns is a named network namespace owned by this process.
type Netns struct {
	Name   string
	Handle netns.NsHandle
}

// OwnedName returns Prefix-<owner ID>-<name> for this process's runstate owner: the owner
// lets cleanup tell a live run's namespaces from a killed run's, across PID namespaces.
func OwnedName(name string) string {
	return fmt.Sprintf("%s-%s-%s", Prefix, runstate.SelfID(), name)
}

// New creates the named namespace (bind-mounted under Dir) without moving the
// calling goroutine into it. The work happens on a dedicated, locked thread: should that
// thread fail to return to the original namespace, Go retires it with its goroutine
// instead of leaving the caller stranded in the new namespace.
func New(name string) (*Netns, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := Thread()
		if err != nil {
			runtime.UnlockOSThread()
			c <- result{-1, fmt.Errorf("get current netns: %w", err)}
			return
		}
		defer orig.Close()
		h, err := newNamed(name) // moves this thread into the new namespace
		if serr := netns.Set(orig); serr != nil {
			// The thread stays locked and is retired when this goroutine exits.
			if err == nil {
				h.Close()
				_ = Delete(name)
			}
			c <- result{-1, errors.Join(err, fmt.Errorf("return to original netns: %w", serr))}
			return
		}
		runtime.UnlockOSThread()
		if err != nil {
			c <- result{-1, fmt.Errorf("create netns %s: %w", name, err)}
			return
		}
		c <- result{h, nil}
	}()
	r := <-c
	if r.err != nil {
		return nil, r.err
	}
	return &Netns{Name: name, Handle: r.h}, nil
}

// Path is the namespace's bind-mount path (usable with nsenter --net=PATH).
func (n *Netns) Path() string { return filepath.Join(Dir, n.Name) }

// Close deletes the namespace; the kernel destroys its interfaces (and the peers of its
// veths), qdiscs and attached programs once no process or fd holds it.
func (n *Netns) Close() error {
	if n == nil || n.Handle == -1 {
		return nil
	}
	n.Handle.Close()
	n.Handle = -1
	if err := Delete(n.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete netns %s: %w", n.Name, err)
	}
	return nil
}

// Release closes the namespace's handle but leaves the namespace in place (a persistent
// lab's, which outlives this process). Close deletes it instead.
func (n *Netns) Release() {
	if n != nil && n.Handle != -1 {
		n.Handle.Close()
		n.Handle = -1
	}
}

// Do runs fn on an OS thread that is inside the namespace. fn must not start goroutines
// that expect to be in the namespace; sockets it opens stay in the namespace afterwards.
func (n *Netns) Do(fn func() error) error { return In(n.Handle, fn) }

// Start starts cmd with its network namespace set to n (the child inherits the namespace
// of the thread that forks it).
func (n *Netns) Start(cmd *exec.Cmd) error {
	return n.Do(cmd.Start)
}

// Command returns an exec.Cmd; start it with Start (not cmd.Start) to run it in n.
func (n *Netns) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Run runs a command in n and returns its combined output.
func (n *Netns) Run(name string, args ...string) (string, error) {
	cmd := n.Command(name, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := n.Start(cmd); err != nil {
		return "", fmt.Errorf("start %s: %w", name, err)
	}
	if err := cmd.Wait(); err != nil {
		return out.String(), fmt.Errorf("run %s %s: %w: %s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// SetSysctl writes a per-namespace sysctl (e.g. "net/ipv4/ip_forward") inside n.
func (n *Netns) SetSysctl(key, value string) error {
	return n.Do(func() error {
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
	})
}

// LoopbackUp sets n's loopback interface up (a new namespace's lo is down).
func (n *Netns) LoopbackUp() error {
	return n.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return fmt.Errorf("set lo up in %s: %w", n.Name, err)
		}
		return nil
	})
}

// OwnerID parses the runstate owner ID from a kedge namespace name; ok is false for other
// names (persistent labs, other tools' namespaces).
func OwnerID(name string) (id string, ok bool) {
	rest, found := strings.CutPrefix(name, Prefix+"-")
	if !found {
		return "", false
	}
	id, _, _ = strings.Cut(rest, "-")
	_, _, ok = runstate.ParseID(id)
	return id, ok
}

// OwnerPID parses the owner's pid from a kedge namespace name; ok is false for other names.
// The pid means something only in the owner's PID namespace: judge owners with
// runstate.Judge(OwnerID(name)).
func OwnerPID(name string) (pid int, ok bool) {
	id, ok := OwnerID(name)
	if !ok {
		return 0, false
	}
	pid, _, _ = runstate.ParseID(id)
	return pid, true
}

// CleanupStale deletes the kedge namespaces whose owner is certainly dead (runstate.Judge)
// and returns the names it removed. Persistent labs (kedge-lab-...) have no owner and are
// never removed here (see lab.Down). `kedge cleanup` does this and more (tc filters, pins,
// status files), with reasons.
func CleanupStale() ([]string, error) { return cleanupStale(0) }

// CleanupStaleOf is CleanupStale for the namespaces of one ended process (pid): a supervisor
// that SIGKILLed a child it started removes what the child left, and nobody else's.
func CleanupStaleOf(pid int) ([]string, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("cleanup stale namespaces: pid %d", pid)
	}
	return cleanupStale(pid)
}

// cleanupStale removes dead owners' namespaces; pid > 0 limits it to that owner's pid.
func cleanupStale(pid int) ([]string, error) {
	entries, err := List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, name := range entries {
		id, ok := OwnerID(name)
		if !ok || runstate.Judge(id).State != runstate.Dead {
			continue
		}
		if p, _, _ := runstate.ParseID(id); pid > 0 && p != pid {
			continue
		}
		if err := Delete(name); err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("delete netns %s: %w", name, err))
			}
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

func init() {
	runstate.Register(runstate.Cleaner{Kind: runstate.KindNetns, Order: 30, List: func(runstate.Scope) ([]runstate.Leftover, error) {
		names, err := List()
		var out []runstate.Leftover
		for _, n := range names {
			if id, ok := OwnerID(n); ok {
				out = append(out, runstate.Leftover{Kind: runstate.KindNetns, Name: n, Owner: id,
					Remove: func() error { return Delete(n) }})
			}
		}
		return out, err
	}})
}

// List returns the names under Dir, any tool's (none when it does not exist).
func List() ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// NameOf returns the name under Dir of the namespace at path (such as /proc/self/ns/net),
// "" when it has none.
func NameOf(path string) (string, error) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	names, err := List()
	for _, n := range names {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(Dir, n), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			return n, nil
		}
	}
	return "", err
}

// ---- entering and opening namespaces ----

// Thread returns a handle to the calling thread's network namespace. Unlike netns.Get
// (/proc/<getpid()>/task/<gettid()>), it works in a PID namespace of its own, where /proc
// may be the parent namespace's and the pid names another process.
func Thread() (netns.NsHandle, error) {
	return netns.GetFromPath("/proc/thread-self/ns/net")
}

// In runs fn on a thread inside ns (ns < 0: the caller's namespace). Interface indexes are
// per namespace, so attaching must happen inside the target namespace.
func In(ns netns.NsHandle, fn func() error) error {
	if ns < 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := Thread()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return to original netns: %w", err))
			return // thread stays locked; Go retires it
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// OpenNamed opens the network namespace name under Dir. An entry there whose namespace
// mount is gone is an error: a process in a mount namespace of its own (one run under `ip
// netns exec`) that named a namespace left, when it ended, only the empty file in this
// mount namespace's view.
func OpenNamed(name string) (netns.NsHandle, error) {
	h, err := openNamed(name)
	if err != nil {
		return -1, fmt.Errorf("open netns %s: %w", name, err)
	}
	return h, nil
}

func openNamed(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromPath(filepath.Join(Dir, name))
	if err != nil {
		return -1, err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(h), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		h.Close()
		return -1, errors.New("not a namespace (a mount made in another mount namespace, gone)")
	}
	return h, nil
}

// Open resolves a namespace argument as users give it (--netns, a config's netns): "" is
// the caller's namespace (netns.None(), which kedge's packages take as "here"), an argument
// with a '/' a path (/proc/PID/ns/net), anything else a name under Dir (checked as
// OpenNamed does). Its errors do not repeat arg: the caller wraps them with the argument as
// the user gave it. The caller closes a handle >= 0.
func Open(arg string) (netns.NsHandle, error) {
	switch {
	case arg == "":
		return netns.None(), nil
	case strings.Contains(arg, "/"):
		h, err := netns.GetFromPath(arg)
		if err != nil {
			return netns.None(), err
		}
		return h, nil
	}
	return openNamed(arg)
}
