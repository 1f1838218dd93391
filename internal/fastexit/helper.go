package fastexit

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// The helper runs in this package's init, before the program's main: a process started by
// Keep with helperEnv set serves its socket pair and exits.
func init() {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	if typ, err := unix.GetsockoptInt(helperFD, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_SEQPACKET {
		fmt.Fprintf(os.Stderr, "%s=1 is set, but descriptor %d is not the socket pair fastexit passes: unset it\n", helperEnv, helperFD)
		os.Exit(2)
	}
	if dir := os.Getenv(runstateEnv); dir != "" {
		runstate.Dir = dir // the owner's, for judging it
	}
	os.Exit(serve(helperFD))
}

// held is one Hold's files and namespaces, in the helper.
type held struct {
	id         uint64
	fds        []int
	namespaces []string
}

// ownerGone bounds how long the helper waits, after the owner's end of the socket pair
// closed, for the owner to be provably dead before it removes the owner's namespaces.
const ownerGone = 5 * time.Second

// serve is the helper: it keeps what it is given until released or until the owner's end
// closes; then it releases everything and removes the namespaces of holds never released.
func serve(fd int) int {
	// The owner decides when the helper ends (by closing its end, or by dying): a signal
	// meant for the owner's process group or session must not end it first.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	var holds []held
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(maxFiles*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			break // the owner closed its end, or died
		}
		fds := rights(oob[:oobn])
		reply := "ok"
		if h, err := apply(&holds, string(buf[:n]), fds); err != nil {
			reply = "error: " + err.Error()
			closeAll(fds)
		} else if h != nil {
			holds = append(holds, *h)
		}
		if err := unix.Sendmsg(fd, []byte(reply), nil, nil, 0); err != nil {
			break
		}
	}
	for _, h := range holds {
		closeAll(h.fds)
	}
	for _, h := range holds {
		for _, ns := range h.namespaces {
			removeWhenOwnerDead(ns)
		}
	}
	return 0
}

// apply carries out one request: "keep ID\nNS..." (returns the new hold) or "release ID".
func apply(holds *[]held, msg string, fds []int) (*held, error) {
	lines := strings.Split(msg, "\n")
	verb, arg, _ := strings.Cut(lines[0], " ")
	id, err := strconv.ParseUint(arg, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad request %q", lines[0])
	}
	switch verb {
	case "keep":
		return &held{id: id, fds: fds, namespaces: lines[1:]}, nil
	case "release":
		closeAll(fds) // none are sent with a release
		i := slices.IndexFunc(*holds, func(h held) bool { return h.id == id })
		if i < 0 {
			return nil, fmt.Errorf("no hold %d", id)
		}
		closeAll((*holds)[i].fds)
		*holds = slices.Delete(*holds, i, i+1)
		return nil, nil
	}
	return nil, fmt.Errorf("bad request %q", lines[0])
}

// rights returns the descriptors passed in a control message.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if r, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// removeWhenOwnerDead removes namespace name once the owner its name carries is certainly
// dead: the owner's end of the socket pair may close before the kernel has released the
// owner's record lock (files close one by one). A namespace without an owner in its name,
// or whose owner stays alive, is left alone.
func removeWhenOwnerDead(name string) {
	id, ok := netnsx.OwnerID(name)
	if !ok {
		return
	}
	deadline := time.Now().Add(ownerGone)
	for runstate.Judge(id).State != runstate.Dead {
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond) // polling the owner's record lock
	}
	_ = netnsx.Delete(name) // gone already (a supervisor's cleanup): nothing to do
}
