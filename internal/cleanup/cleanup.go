// Package cleanup removes what killed kedge runs left behind: their network namespaces,
// their cls_bpf filters (named kedge:<pid>:...), their bpffs pin directories
// (<pin root>/<name>.<pid>) and their hedger status files (/run/kedge/hedge.<pid>.json),
// recognised by an owner pid that no longer runs. With All it
// also removes persistent labs (`kedge lab up`), which have no owner process.
//
// It never touches anything of a live process, nor anything without kedge's name on it.
package cleanup

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/lab"
)

// Options selects what Run removes.
type Options struct {
	// All also removes persistent labs (made by `kedge lab up`). Live runs are never touched.
	All bool
	// FilterNetns is where stale cls_bpf filters are looked for; nil: the caller's namespace.
	FilterNetns *lab.Netns
	// StatusDir holds the hedgers' status files; "": hedge.StatusDir.
	StatusDir string
}

// Result lists what Run removed.
type Result struct {
	Namespaces  []string `json:"namespaces"` // namespaces of dead runs
	Filters     []string `json:"filters"`    // "<iface> <hook> filter <name>"
	PinDirs     []string `json:"pin_dirs"`
	StatusFiles []string `json:"status_files"` // hedge.<pid>.json of dead hedgers
	Labs        []string `json:"labs"`         // persistent labs (with All)
}

// Count is the number of things removed.
func (r *Result) Count() int {
	return len(r.Namespaces) + len(r.Filters) + len(r.PinDirs) + len(r.StatusFiles) + len(r.Labs)
}

// alive reports whether pid may still own kedge resources.
func alive(pid int) bool { return pid == os.Getpid() || lab.ProcessAlive(pid) }

// Run removes leftovers and reports what it removed. It keeps going after an error and
// returns every error joined, with the Result of what did succeed.
func Run(opts Options) (*Result, error) {
	res := &Result{Namespaces: []string{}, Filters: []string{}, PinDirs: []string{}, StatusFiles: []string{}, Labs: []string{}}
	var errs []error

	// Filters first: a dead run's filters in its own namespaces vanish with them, but those
	// in the caller's namespace (a run attached to a real interface) stay until removed.
	ns := netns.NsHandle(-1)
	if opts.FilterNetns != nil {
		ns = opts.FilterNetns.Handle
	}
	filters, err := bpfx.CleanupFilters(ns, alive)
	res.Filters = append(res.Filters, filters...)
	errs = append(errs, wrap("remove stale tc filters", err))

	nss, err := lab.CleanupStale(false)
	res.Namespaces = append(res.Namespaces, nss...)
	errs = append(errs, wrap("remove stale namespaces", err))

	dirs, err := removePinDirs()
	res.PinDirs = append(res.PinDirs, dirs...)
	errs = append(errs, err)

	statusDir := opts.StatusDir
	if statusDir == "" {
		statusDir = hedge.StatusDir
	}
	files, err := hedge.RemoveStaleStatuses(statusDir)
	res.StatusFiles = append(res.StatusFiles, files...)
	errs = append(errs, err)

	if opts.All {
		names, err := lab.ListPersistent()
		errs = append(errs, err)
		labs, err := removeLabs(names)
		res.Labs = append(res.Labs, labs...)
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// removePinDirs removes the pin directories of dead owners.
func removePinDirs() ([]string, error) {
	dirs, err := bpfx.ListPinDirs()
	if err != nil {
		return nil, fmt.Errorf("list pin dirs: %w", err)
	}
	var removed []string
	var errs []error
	for _, d := range dirs {
		if alive(d.PID) {
			continue
		}
		if err := bpfx.RemovePinDir(d.Dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, d.Dir)
	}
	return removed, errors.Join(errs...)
}

// removeLabs takes down the named persistent labs.
func removeLabs(names []string) ([]string, error) {
	var removed []string
	var errs []error
	for _, n := range names {
		_, err := lab.Down(n)
		if errors.Is(err, lab.ErrNotFound) {
			continue // removed concurrently
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}
