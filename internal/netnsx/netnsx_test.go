package netnsx

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/runstate/runstatetest"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
}

func TestOwnerPID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		pid  int
		want bool
	}{
		{"kedge-123-lab-a", 123, true},
		{"kedge-123", 123, true},
		{"kedge-x-lab", 0, false},
		{"other-123-lab", 0, false},
		{"kedge-0-lab", 0, false},
	} {
		pid, ok := OwnerPID(tc.in)
		if ok != tc.want || (ok && pid != tc.pid) {
			t.Errorf("OwnerPID(%q) = %d, %v; want %d, %v", tc.in, pid, ok, tc.pid, tc.want)
		}
	}
}

func TestCleanupStaleRemovesDeadOwners(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	// A pid far above pid_max cannot be alive.
	dead := "kedge-99999999-stale"
	ns, err := New(dead)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	ns.Handle.Close()
	live, err := New(OwnedName("live"))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer live.Close()
	removed, err := CleanupStale()
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	for _, r := range removed {
		if r == live.Name {
			t.Errorf("cleanup removed the live namespace %s", r)
		}
	}
	if _, err := os.Stat(filepath.Join(Dir, dead)); !os.IsNotExist(err) {
		t.Errorf("cleanup did not remove %s (removed %v, stat: %v)", dead, removed, err)
	}
}

// TestRemoveHiddenEntry: a namespace mounted while /run/netns was a plain directory (as
// kedge did before it prepared the directory as iproute2 does), then `ip netns add`, which
// bind-mounts /run/netns over itself and hides that mount. Removing the entry must
// uncover and remove it, and leave ip's namespace working. In private namespaces.
func TestRemoveHiddenEntry(t *testing.T) {
	requireRoot(t)
	if out, err := exec.Command("ip", "-V").CombinedOutput(); err != nil || !strings.Contains(string(out), "iproute2") {
		t.Skip("needs iproute2's ip (ip netns add); not found, or another ip (busybox's, in the matrix guests, has no netns)")
	}
	if runstatetest.Private(t) {
		return
	}
	old := "kedge-99999999-hidden"
	p := filepath.Join(Dir, old)
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"unshare", "--net", "mount", "--bind", "/proc/self/ns/net", p},
		{"ip", "netns", "add", "y"},
		{"ip", "netns", "exec", "y", "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// What kedge met before: the entry can be neither unmounted nor removed through the path.
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
		t.Fatalf("unmount the visible copy: %v", err)
	}
	if err := os.Remove(p); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("remove %s: %v, want EBUSY (a hidden mount below)", p, err)
	}
	removed, err := CleanupStale()
	if err != nil || !slices.Contains(removed, old) {
		t.Fatalf("CleanupStale = %v, %v; want it to remove %s", removed, err, old)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", p, err)
	}
	if out, err := exec.Command("ip", "netns", "exec", "y", "ip", "-br", "link", "show", "lo").CombinedOutput(); err != nil || !strings.Contains(string(out), "UP") {
		t.Errorf("ip's namespace y after the removal: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "del", "y").CombinedOutput(); err != nil {
		t.Errorf("ip netns del y: %v: %s", err, out)
	}
}

// TestLoopbackUp: a new namespace's lo is down; LoopbackUp brings it up there, and only there.
func TestLoopbackUp(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	ns, err := New(OwnedName("lo"))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer ns.Close()
	up := func() bool {
		var flags net.Flags
		if err := ns.Do(func() error {
			lo, err := net.InterfaceByName("lo")
			if err == nil {
				flags = lo.Flags
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return flags&net.FlagUp != 0
	}
	if up() {
		t.Fatal("lo is up in a new namespace before LoopbackUp")
	}
	if err := ns.LoopbackUp(); err != nil {
		t.Fatal(err)
	}
	if !up() {
		t.Fatal("lo is still down after LoopbackUp")
	}
}
