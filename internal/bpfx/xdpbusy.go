package bpfx

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// XDPBusyError says that an interface already has an XDP program, which one, and who
// holds it; attaching another (without a dispatcher) is refused with EBUSY.
type XDPBusyError struct {
	IfIndex int
	Iface   string
	ProgID  uint32
	Name    string   // the holder program's name ("" when its info could not be read)
	Mode    string   // "native", "generic" or "offload"
	Holders []string // processes holding the program or its link: "pid 123 (kedge)"
	err     error
}

func (e *XDPBusyError) Error() string {
	prog := fmt.Sprintf("program id %d", e.ProgID)
	if e.Name != "" {
		prog = fmt.Sprintf("%q (id %d)", e.Name, e.ProgID)
	}
	held := "attached through netlink, held by no process (it stays until detached)"
	if len(e.Holders) > 0 {
		held = "held by " + strings.Join(e.Holders, ", ")
	}
	what := fmt.Sprintf("interface %s (ifindex %d)", e.Iface, e.IfIndex)
	return fmt.Sprintf("%s already has an XDP program: %s in %s mode, %s", what, prog, e.Mode, held)
}

func (e *XDPBusyError) Unwrap() error { return e.err }

// xdpBusy describes the XDP program attached to ifindex in ns, for an EBUSY from attaching.
func xdpBusy(ns netns.NsHandle, ifindex int, err error) error {
	h, herr := NetlinkHandle(ns)
	if herr != nil {
		return err
	}
	defer h.Close()
	l, lerr := h.LinkByIndex(ifindex)
	if lerr != nil || l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached {
		return err
	}
	x := l.Attrs().Xdp
	e := &XDPBusyError{IfIndex: ifindex, Iface: l.Attrs().Name, ProgID: x.ProgId, err: err}
	switch x.AttachMode {
	case 1: // XDP_ATTACHED_DRV
		e.Mode = "native"
	case 2: // XDP_ATTACHED_SKB
		e.Mode = "generic"
	case 3: // XDP_ATTACHED_HW
		e.Mode = "offload"
	default:
		e.Mode = "multiple"
	}
	if p, perr := ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId)); perr == nil {
		if info, ierr := p.Info(); ierr == nil {
			e.Name = info.Name
		}
		p.Close()
	}
	e.Holders = progHolders(x.ProgId)
	return e
}

// progHolders lists the processes that hold a file descriptor of program id, or of a link
// to it (/proc/*/fdinfo has "prog_id:" for both).
func progHolders(id uint32) []string {
	want := "prog_id:\t" + strconv.FormatUint(uint64(id), 10)
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var out []string
	for _, proc := range procs {
		fds, _ := filepath.Glob(filepath.Join(proc, "fdinfo", "*"))
		for _, fd := range fds {
			if fdinfoHas(fd, want) {
				comm, _ := os.ReadFile(filepath.Join(proc, "comm"))
				out = append(out, fmt.Sprintf("pid %s (%s)", filepath.Base(proc), strings.TrimSpace(string(comm))))
				break
			}
		}
	}
	return out
}

func fdinfoHas(path, line string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() == line {
			return true
		}
	}
	return false
}

func isBusy(err error) bool { return errors.Is(err, unix.EBUSY) }
