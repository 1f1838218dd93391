package hedge

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pacer"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// dl0Owner reports whether kedge-dl0 exists in h and which pid its alias names.
func dl0Owner(t *testing.T, h *lab.Host) (pid int, exists bool) {
	t.Helper()
	nh, err := netlink.NewHandleAt(h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	l, err := nh.LinkByName(dlClient)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return 0, false
	}
	if err != nil {
		t.Fatalf("look up %s: %v", dlClient, err)
	}
	if id, ok := pacer.Owner(l.Attrs().Alias); ok {
		pid, _, _ = runstate.ParseID(id)
	}
	return pid, true
}

// tcxPrograms counts the programs attached with TCX to h's eth0 (ingress, egress).
func tcxPrograms(t *testing.T, h *lab.Host) (in, out int) {
	t.Helper()
	err := h.Do(func() error {
		for _, q := range []struct {
			at ebpf.AttachType
			n  *int
		}{{ebpf.AttachTCXIngress, &in}, {ebpf.AttachTCXEgress, &out}} {
			r, err := link.QueryPrograms(link.QueryOptions{Target: h.IfIndex, Attach: q.at})
			if err != nil {
				return err
			}
			*q.n = len(r.Programs)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("query tcx programs: %v", err)
	}
	return in, out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// assertHedgerGone checks that nothing of hedger pid is left: no namespace, no status file,
// no kedge-dl0 of its own.
func assertHedgerGone(t *testing.T, h *lab.Host, pid int, dlNetns string) {
	t.Helper()
	if exists(filepath.Join(netnsx.Dir, dlNetns)) {
		t.Errorf("delay-line namespace %s left behind", dlNetns)
	}
	if left, _ := filepath.Glob(filepath.Join(netnsx.Dir, netnsx.Prefix+"-"+strconv.Itoa(pid)+"[-_]*")); len(left) > 0 {
		t.Errorf("namespaces of pid %d left behind: %v", pid, left)
	}
	if exists(StatusPath(StatusDir, pid)) {
		t.Errorf("status file of pid %d left behind", pid)
	}
	// A killed run's kedge-dl0 goes with its namespace, which the kernel destroys
	// asynchronously once nothing holds it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		owner, ok := dl0Owner(t, h)
		if !ok || owner != pid {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s of pid %d left behind", dlClient, pid)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// assertNoPrograms checks that no program is attached to h's eth0.
func assertNoPrograms(t *testing.T, h *lab.Host) {
	t.Helper()
	if in, out := tcxPrograms(t, h); in != 0 || out != 0 {
		t.Errorf("%d ingress and %d egress programs still attached to %s", in, out, h.Iface)
	}
}

// TestSigkillThenRestartLeavesCleanSystem: `kedge hedge run` killed with SIGKILL cannot
// clean up; its programs go with its file descriptors, but its delay-line namespace (and
// with it kedge-dl0 in the client namespace) and its status file stay. The next start must
// remove them, refuse to disturb a live hedger, and leave nothing itself after SIGTERM.
func TestSigkillThenRestartLeavesCleanSystem(t *testing.T) {
	requireRoot(t)
	l := hedgeLab(t, "hk")
	client := l.Host("client")
	svc := netip.AddrPortFrom(l.Host("srv1").IPv4, 9999)
	args := []string{"hedge", "run", "--interface", "eth0", "--service", svc.String(), "--delay", "5ms", "--duration", "2m"}

	killed := startKedge(t, client, args...)
	st1 := waitHedgerUp(t, killed, 15*time.Second)
	killed.stop(t, syscall.SIGKILL, 5*time.Second)
	if !exists(filepath.Join(netnsx.Dir, st1.DelayLineNetns)) {
		t.Errorf("after SIGKILL: delay-line namespace %s is gone already; this test expects a leftover", st1.DelayLineNetns)
	}
	if owner, ok := dl0Owner(t, client); !ok || owner != killed.pid() {
		t.Errorf("after SIGKILL: %s exists %v, owner %d; want the killed pid %d", dlClient, ok, owner, killed.pid())
	}
	if !exists(StatusPath(StatusDir, killed.pid())) {
		t.Errorf("after SIGKILL: no status file left; this test expects a leftover")
	}
	assertNoPrograms(t, client) // TCX links die with the process's file descriptors

	next := startKedge(t, client, args...)
	st2 := waitHedgerUp(t, next, 15*time.Second)
	assertHedgerGone(t, client, killed.pid(), st1.DelayLineNetns)
	if owner, ok := dl0Owner(t, client); !ok || owner != next.pid() {
		t.Errorf("%s exists %v, owner %d; want the new hedger %d", dlClient, ok, owner, next.pid())
	}
	if in, out := tcxPrograms(t, client); in != 1 || out != 1 {
		t.Errorf("%d ingress and %d egress programs attached; want 1 each (hedge_resp, hedge_split)", in, out)
	}

	// A second hedger in the same namespace is refused, and its attempt leaves nothing.
	_, err := Start(&Config{Interface: "eth0", Services: []ServiceConfig{{Address: svc.String(), Delay: DelaySpec{Fixed: 5 * time.Millisecond}}}},
		Options{Netns: client.Handle, Backend: BackendConveyor})
	if err == nil || !strings.Contains(err.Error(), "belongs to kedge run "+strconv.Itoa(next.pid())+"_") || !strings.Contains(err.Error(), "(alive: ") {
		t.Errorf("second hedger in the namespace: %v; want a refusal naming the live run of pid %d", err, next.pid())
	}
	if exists(filepath.Join(netnsx.Dir, netnsx.OwnedName("hedge-dl"))) {
		t.Errorf("the refused start left its delay-line namespace")
	}
	if owner, _ := dl0Owner(t, client); owner != next.pid() {
		t.Errorf("the refused start touched %s (owner now %d)", dlClient, owner)
	}

	if code := next.stop(t, syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM; output:\n%s", code, next.out.String())
	}
	assertHedgerGone(t, client, next.pid(), st2.DelayLineNetns)
	assertNoPrograms(t, client)

	t.Run("kedge cleanup", func(t *testing.T) {
		if code, _ := runKedge(t, client, "cleanup", "--help"); code != 0 {
			t.Skip("this kedge has no cleanup command")
		}
		killed := startKedge(t, client, args...)
		st := waitHedgerUp(t, killed, 15*time.Second)
		killed.stop(t, syscall.SIGKILL, 5*time.Second)
		if code, out := runKedge(t, client, "cleanup"); code != 0 || !strings.Contains(out, st.DelayLineNetns) {
			t.Errorf("kedge cleanup: exit %d, output:\n%s", code, out)
		}
		// Status files are the hedger's own business: `kedge hedge status` removes stale ones.
		if code, _ := runKedge(t, client, "hedge", "status"); code != 0 {
			t.Errorf("kedge hedge status: exit %d", code)
		}
		assertHedgerGone(t, client, killed.pid(), st.DelayLineNetns)
		assertNoPrograms(t, client)
	})
}
