// Package fastexit lets a process that holds BPF links die at once when it is killed.
//
// When a process ends, the kernel releases its files one by one, and the release of some of
// them waits for an RCU grace period: a TCX link (tcx_link_release), an XDP link
// (bpf_xdp_link_release: the XDP dispatcher), a packet socket (packet_release). On a loaded
// 2-core machine each wait took 10-55 ms, so a killed raft node spent 55-99 ms in them, and
// its TCP sockets - closed by the same sequence, in an order the kernel does not promise -
// stayed open meanwhile: its clients hung instead of being refused.
//
// Keep hands duplicates of such files to a helper process, started at the first Keep from
// the program's own binary (/proc/self/exe, picked out by an environment variable in this
// package's init: it never reaches main). A killed owner then drops only one reference of
// each: its exit closes every socket without waiting. The helper sees the owner go (its end
// of a socket pair closes), releases the files - the grace periods are now its own - and
// removes the named network namespaces the owner registered, once the owner is certainly
// dead (runstate.Judge), as `kedge cleanup` would. If the helper dies too, what it held goes
// with it and the namespaces stay for the next start or `kedge cleanup`.
//
// A Hold must be released (Release) before the files are closed by their owner on a
// graceful stop: while the helper holds a link, closing the owner's descriptor does not
// detach it. With no holds left the helper exits.
package fastexit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// helperEnv marks the helper process: set to "1" only in its environment.
const helperEnv = "KEDGE_FASTEXIT_HELPER"

// runstateEnv passes the owner's runstate.Dir, where the helper judges the owner.
const runstateEnv = "KEDGE_FASTEXIT_RUNSTATE"

// helperFD is the helper's end of the socket pair (the first of exec.Cmd.ExtraFiles).
const helperFD = 3

// replyTimeout bounds a request to the helper: it answers at once unless it is stopped.
const replyTimeout = 5 * time.Second

// maxFiles is how many descriptors one Keep passes (SCM_MAX_FD is 253).
const maxFiles = 64

// Hold is one component's files kept by the helper.
type Hold struct {
	id       uint64
	what     string
	released bool
}

// keeper is this process's side of the helper.
type keeper struct {
	fd   int // our end of the socket pair
	cmd  *exec.Cmd
	live int // holds not released
}

var (
	mu     sync.Mutex
	cur    *keeper
	nextID uint64
)

// Keep hands duplicates of fds to the helper (starting it if none runs) and names the
// network namespaces (under /run/netns) it removes when this process dies without releasing
// the hold. what names the component in errors. The caller keeps its own descriptors and
// closes them as before, after Release.
func Keep(what string, fds []int, namespaces ...string) (*Hold, error) {
	if len(fds) > maxFiles {
		return nil, fmt.Errorf("fastexit: keep %s: %d files, at most %d", what, len(fds), maxFiles)
	}
	for _, ns := range namespaces {
		if ns == "" || strings.ContainsAny(ns, "/\n") {
			return nil, fmt.Errorf("fastexit: keep %s: namespace name %q", what, ns)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if cur == nil {
		k, err := startHelper()
		if err != nil {
			return nil, fmt.Errorf("fastexit: keep %s: %w", what, err)
		}
		cur = k
	}
	nextID++
	h := &Hold{id: nextID, what: what}
	msg := "keep " + strconv.FormatUint(h.id, 10)
	for _, ns := range namespaces {
		msg += "\n" + ns
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := cur.request(msg, oob); err != nil {
		cur.stop()
		cur = nil
		return nil, fmt.Errorf("fastexit: keep %s: %w", what, err)
	}
	cur.live++
	return h, nil
}

// Release drops the helper's duplicates (and its duty to remove the namespaces): the
// owner's own descriptors are then the last, and closing them detaches and releases as if
// nothing had been kept. With no holds left the helper exits. Safe on a nil Hold and twice.
func (h *Hold) Release() error {
	if h == nil {
		return nil
	}
	mu.Lock()
	defer mu.Unlock()
	if h.released {
		return nil
	}
	h.released = true
	if cur == nil {
		return nil
	}
	err := cur.request("release "+strconv.FormatUint(h.id, 10), nil)
	cur.live--
	if err != nil || cur.live == 0 {
		cur.stop()
		cur = nil
	}
	if err != nil {
		return fmt.Errorf("fastexit: release %s: %w (the helper exits and releases what it held)", h.what, err)
	}
	return nil
}

// HelperPID is the helper's process id (0: none runs), for tests and diagnostics.
func HelperPID() int {
	mu.Lock()
	defer mu.Unlock()
	if cur == nil {
		return 0
	}
	return cur.cmd.Process.Pid
}

// startHelper starts the helper with its end of a fresh socket pair.
func startHelper() (*keeper, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	child := os.NewFile(uintptr(pair[1]), "fastexit-helper")
	defer child.Close()
	tv := unix.NsecToTimeval(replyTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(pair[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(pair[0])
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	cmd := &exec.Cmd{
		Path: "/proc/self/exe",
		Args: []string{"kedge-fastexit"}, // what ps shows
		// Its own process group: a terminal's ^C reaches the owner, which releases; the
		// helper ignores those signals anyway. No stdio: it holds no pipe of the owner's
		// (a parent waiting for the owner's output would wait for the helper too).
		Env:         []string{helperEnv + "=1", runstateEnv + "=" + runstate.Dir, "GOMAXPROCS=1"},
		Dir:         "/",
		ExtraFiles:  []*os.File{child},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		unix.Close(pair[0])
		return nil, fmt.Errorf("start helper: %w", err)
	}
	go cmd.Wait() // reap it whenever it exits
	return &keeper{fd: pair[0], cmd: cmd}, nil
}

// request sends one message and waits for the helper's answer ("ok" or "error: ...").
func (k *keeper) request(msg string, oob []byte) error {
	if err := unix.Sendmsg(k.fd, []byte(msg), oob, nil, 0); err != nil {
		return fmt.Errorf("send to helper: %w", err)
	}
	buf := make([]byte, 512)
	for {
		n, _, _, _, err := unix.Recvmsg(k.fd, buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("helper's answer: %w", err)
		}
		if n == 0 {
			return errors.New("the helper exited")
		}
		if r := string(buf[:n]); r != "ok" {
			return errors.New(strings.TrimPrefix(r, "error: "))
		}
		return nil
	}
}

// stop closes our end: the helper releases whatever it still holds and exits.
func (k *keeper) stop() {
	unix.Close(k.fd)
}
