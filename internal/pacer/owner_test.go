package pacer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

func TestOwner(t *testing.T) {
	for alias, want := range map[string]string{"kedge:123": "123", "kedge:4242_9f3a1c": "4242_9f3a1c"} {
		if id, ok := Owner(alias); !ok || id != want {
			t.Errorf("Owner(%q) = %q, %v; want %q", alias, id, ok, want)
		}
	}
	for _, a := range []string{"", "kedge:", "kedge:x", "other:5", "kedge:-1", "kedge:0", "kedge:12_xyz"} {
		if _, ok := Owner(a); ok {
			t.Errorf("Owner(%q) accepted", a)
		}
	}
}

// TestConsumerVethOwner is issue 10's fault 2: a leftover veth is judged by its owner's lock
// (runstate), not by kill(pid, 0), which says "gone" for a live hedger in another PID
// namespace. The owner here records a pid no process has, as a run in another PID namespace
// would; while another open file description holds its lock the veth is kept and the start
// refused, once the lock is free the veth is removed and made anew.
func TestConsumerVethOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	consumer := testNetns(t, "pacer-own-c")
	pacerNS := testNetns(t, "pacer-own-p")
	self := runstate.SelfID() // made in the real Dir before the private one below
	dir := t.TempDir()
	old := runstate.Dir
	runstate.Dir = dir
	t.Cleanup(func() { runstate.Dir = old })

	nh, err := netlink.NewHandleAt(consumer.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	p := &Pacer{ns: pacerNS, nh: nh, opts: Options{Name: "own-test"}}

	const foreign = "4194303_c0ffee" // pid above any pid_max: kill(pid, 0) fails here
	lockFile := writeRecord(t, dir, foreign)
	if err := unix.Flock(int(lockFile.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	const name = "kedge-own0"
	for _, tc := range []struct {
		alias  string
		unlock bool // release the foreign owner's lock first
		keep   bool
		want   string // in the refusal
	}{
		{alias: "kedge:" + foreign, keep: true, want: "alive"},
		{alias: "kedge:4194302_abcdef", keep: true, want: "unknown"}, // no record here
		{alias: "kedge:" + foreign, unlock: true},
		{alias: "kedge:4194303"}, // legacy bare pid: old pid rule, no such pid
		{alias: "unrelated"},     // not ours to judge, in the way: removed as before
	} {
		if tc.unlock {
			if err := unix.Flock(int(lockFile.Fd()), unix.LOCK_UN); err != nil {
				t.Fatal(err)
			}
		}
		// The ended run's pacer namespace, which a killed run leaves behind.
		var left *netnsx.Netns
		if id, ok := Owner(tc.alias); ok {
			if left, err = netnsx.New(netnsx.Prefix + "-" + id + "-own-test"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { left.Close() }) // on a failure below; closed after each case
		}
		old := leftoverVeth(t, nh, name, tc.alias)
		ifx, err := p.consumerVeth(name, "kedge-own0p", true)
		l, lerr := nh.LinkByName(name)
		if lerr != nil {
			t.Fatalf("%s: %s gone: %v", tc.alias, name, lerr)
		}
		if tc.keep {
			if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(tc.alias, "kedge:")) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: consumerVeth error %v; want a refusal naming the owner, %s", tc.alias, err, tc.want)
			}
			if l.Attrs().Index != old || l.Attrs().Alias != tc.alias {
				t.Errorf("%s: veth replaced (ifindex %d -> %d, alias %q)", tc.alias, old, l.Attrs().Index, l.Attrs().Alias)
			}
		} else {
			if err != nil {
				t.Errorf("%s: consumerVeth: %v", tc.alias, err)
			}
			if l.Attrs().Index == old || l.Attrs().Index != ifx || l.Attrs().Alias != "kedge:"+self {
				t.Errorf("%s: leftover not replaced: ifindex %d (old %d, returned %d), alias %q; want alias kedge:%s", tc.alias, l.Attrs().Index, old, ifx, l.Attrs().Alias, self)
			}
			if left != nil {
				if _, err := os.Stat(left.Path()); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: the ended run's pacer namespace %s left in place (%v)", tc.alias, left.Name, err)
				}
			}
		}
		if tc.keep && left != nil {
			if _, err := os.Stat(left.Path()); err != nil {
				t.Errorf("%s: the live run's pacer namespace %s removed (%v)", tc.alias, left.Name, err)
			}
		}
		if err := nh.LinkDel(l); err != nil {
			t.Fatal(err)
		}
		if err := left.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// The cleaner lists a veth by its alias's owner, so cleanup keeps a dead owner's record
	// until the veth is gone, and removes it.
	prev := leftoverVeth(t, nh, name, "kedge:"+foreign)
	var cleaner runstate.Cleaner
	for _, c := range runstate.Cleaners() {
		if c.Kind == KindVeth {
			cleaner = c
		}
	}
	if cleaner.List == nil {
		t.Fatalf("no cleaner of kind %q registered", KindVeth)
	}
	found, err := cleaner.List(runstate.Scope{Netns: consumer.Handle})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var names []string
	for _, f := range found {
		names = append(names, f.Name+" "+f.Owner)
		if f.Name == name && f.Owner == foreign {
			if err := f.Remove(); err != nil {
				t.Fatalf("remove %s: %v", name, err)
			}
		}
	}
	if len(found) != 1 {
		t.Errorf("cleaner listed %v; want only %s of %s", names, name, foreign)
	}
	if l, err := nh.LinkByName(name); err == nil {
		t.Errorf("%s (ifindex %d, listed as %d) still there after Remove", name, l.Attrs().Index, prev)
	}
}

func testNetns(t *testing.T, name string) *netnsx.Netns {
	t.Helper()
	ns, err := netnsx.New(netnsx.OwnedName(name))
	if err != nil {
		t.Fatalf("create test namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Errorf("remove test namespace: %v", err)
		}
	})
	return ns
}

// writeRecord writes the owner record of id into dir and returns it opened: a file
// description of its own, as the owner's process would hold.
func writeRecord(t *testing.T, dir, id string) *os.File {
	t.Helper()
	path := filepath.Join(dir, "owners", id+".lock")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(runstate.Record{ID: id, PID: 4194303, PIDNS: "pid:[1]", Started: time.Now().UTC()})
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// leftoverVeth makes name (peer in the same namespace) with alias, as an earlier run left
// it, and returns its ifindex.
func leftoverVeth(t *testing.T, nh *netlink.Handle, name, alias string) int {
	t.Helper()
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "x"}); err != nil {
		t.Fatalf("add leftover veth: %v", err)
	}
	l, err := nh.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkSetAlias(l, alias); err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}
