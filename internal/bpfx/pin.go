package bpfx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// BPFFS is where kedge expects (and, if absent, mounts) the BPF filesystem.
const BPFFS = "/sys/fs/bpf"

// PinRoot holds one directory per running kedge instance: <PinRoot>/<name>-<owner ID>
// (runstate), e.g. pping-4242_9f3a1c (bpffs refuses '.' in names).
var PinRoot = filepath.Join(BPFFS, "kedge")

// EnsureBPFFS mounts bpffs at BPFFS when nothing is mounted there yet.
func EnsureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs(BPFFS, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(BPFFS, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", BPFFS, err)
	}
	if err := unix.Mount("bpf", BPFFS, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w (pinning needs a BPF filesystem; mount one with 'mount -t bpf bpf %s')", BPFFS, err, BPFFS)
	}
	return nil
}

// PinDir creates <PinRoot>/<name>-<owner ID> for this process's run and returns it. name
// must not contain '.' (bpffs refuses it) or '/'.
func PinDir(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, "./") {
		return "", fmt.Errorf("create pin dir: name %q must be non-empty, without '.' or '/'", name)
	}
	if err := EnsureBPFFS(); err != nil {
		return "", err
	}
	dir := filepath.Join(PinRoot, name+"-"+runstate.SelfID())
	var err error
	// RemovePinDir of another instance may remove an empty PinRoot between MkdirAll's
	// steps; that shows as ENOENT and a retry settles it.
	for i := 0; i < 3; i++ {
		if err = os.MkdirAll(dir, 0o700); !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("create pin dir: %w", err)
	}
	return dir, nil
}

// RemovePinDir unpins everything in dir and removes it, and PinRoot when it is empty.
func RemovePinDir(dir string) error {
	err := os.RemoveAll(dir)
	_ = os.Remove(PinRoot) // only succeeds when empty
	if err != nil {
		return fmt.Errorf("remove pin dir %s: %w", dir, err)
	}
	return nil
}

// PinInstance is a pin directory with the instance name and owner parsed from it.
type PinInstance struct {
	Dir   string
	Name  string
	Owner string // runstate owner ID; a bare pid for directories named before runstate
	PID   int    // the owner's pid, for display: judge the owner with runstate.Judge(Owner)
}

// ListPinDirs returns the instance directories under PinRoot (any owner).
func ListPinDirs() ([]PinInstance, error) {
	entries, err := os.ReadDir(PinRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", PinRoot, err)
	}
	var out []PinInstance
	for _, e := range entries {
		// <name>-<pid>_<hex>; a bare pid as owner in names made before runstate (which
		// bpffs never accepted as <name>.<pid>: only plain directories hold those).
		i := strings.LastIndexAny(e.Name(), "-.")
		if i <= 0 {
			continue
		}
		name, owner := e.Name()[:i], e.Name()[i+1:]
		pid, _, valid := runstate.ParseID(owner)
		if !valid {
			continue
		}
		out = append(out, PinInstance{Dir: filepath.Join(PinRoot, e.Name()), Name: name, Owner: owner, PID: pid})
	}
	return out, nil
}

func init() {
	runstate.Register(runstate.Cleaner{Kind: runstate.KindPinDir, Order: 20, List: func(runstate.Scope) ([]runstate.Leftover, error) {
		dirs, err := ListPinDirs()
		var out []runstate.Leftover
		for _, d := range dirs {
			out = append(out, runstate.Leftover{Kind: runstate.KindPinDir, Name: d.Dir, Owner: d.Owner,
				Remove: func() error { return RemovePinDir(d.Dir) }})
		}
		return out, err
	}})
}
