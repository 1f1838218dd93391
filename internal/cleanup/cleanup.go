// Package cleanup removes what ended kedge runs left behind. It asks every cleaner
// registered with runstate (namespaces, tc filters, pin directories, status files, and
// whatever a capability registers) for the leftovers it sees, judges each owner with
// runstate.Judge and removes only what belongs to owners that have certainly ended. With
// All it also removes what registered as runstate.Persistent: persistent labs (`kedge lab
// up`), which have no owner, when the binary links internal/lab.
//
// It never touches anything of a live run, of an owner it cannot judge, nor anything
// without kedge's name on it. It imports no capability: capabilities register cleaners.
package cleanup

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vishvananda/netns"

	// The shared packages register the cleaners of what they create.
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// Options selects what Run removes.
type Options struct {
	// All also removes persistent labs (made by `kedge lab up`). Live runs are never touched.
	All bool
	// DryRun removes nothing: the Result lists what would be removed, and why.
	DryRun bool
	// FilterNetns is where stale cls_bpf filters are looked for; nil: the caller's namespace.
	FilterNetns *netnsx.Netns
	// StatusDir holds the status files; "": runstate.Dir.
	StatusDir string
}

// Action is what Run did (or, dry, would do) with a leftover.
type Action string

const (
	Removed     Action = "removed"      // its owner has ended; removed
	WouldRemove Action = "would-remove" // DryRun: would be removed
	Failed      Action = "failed"       // its owner has ended, but removing it failed (Error says why)
	Kept        Action = "kept"         // its owner is alive, or cannot be judged (Reason says why)
)

// Item is one leftover with what Run did with it and why.
type Item struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Owner  string `json:"owner"`
	Action Action `json:"action"`
	State  string `json:"owner_state"`     // alive, dead or unknown (runstate.State)
	Reason string `json:"reason"`          // why, in words
	Error  string `json:"error,omitempty"` // Failed: why removal failed
}

// Result reports a Run. The lists per kind name what was removed (with DryRun: what would
// be); Items holds every leftover found, live owners' included, with the reason.
type Result struct {
	DryRun      bool     `json:"dry_run"`
	Namespaces  []string `json:"namespaces"`
	Filters     []string `json:"filters"` // "<iface> <hook> filter <name>"
	PinDirs     []string `json:"pin_dirs"`
	StatusFiles []string `json:"status_files"`
	Veths       []string `json:"veths"`  // veths added to namespaces a run does not own: "[netns <name>: ]<link>"
	Labs        []string `json:"labs"`   // persistent labs and other runstate.Persistent kinds (with All)
	Owners      []string `json:"owners"` // records of ended owners with nothing left
	Items       []Item   `json:"items"`
}

// Count is the number of things removed (with DryRun: that would be).
func (r *Result) Count() int {
	n := len(r.Labs)
	for _, it := range r.Items {
		if it.Action == Removed || it.Action == WouldRemove {
			n++
		}
	}
	return n
}

// Failures returns the items that could not be removed.
func (r *Result) Failures() []Item {
	var out []Item
	for _, it := range r.Items {
		if it.Action == Failed {
			out = append(out, it)
		}
	}
	return out
}

// Run removes leftovers of ended runs and reports every leftover it found. A leftover that
// cannot be removed is a Failed item, not an error: errors are for what Run could not look
// at (a cleaner's list failing, a persistent lab failing to go). It keeps going after
// either and returns the errors joined, with the Result.
func Run(opts Options) (*Result, error) {
	res := &Result{DryRun: opts.DryRun, Namespaces: []string{}, Filters: []string{}, PinDirs: []string{},
		StatusFiles: []string{}, Veths: []string{}, Labs: []string{}, Owners: []string{}, Items: []Item{}}
	scope := runstate.Scope{Netns: netns.NsHandle(-1), StatusDir: opts.StatusDir, Named: map[string]netns.NsHandle{}}
	if opts.FilterNetns != nil {
		scope.Netns = opts.FilterNetns.Handle
	}
	// tc filters are looked for in every named namespace too: a dead run's filters in a lab
	// or in a user's namespace outlive it, and its record must not go while they stay. An
	// entry that is no namespace (any more) holds nothing to look for; the netns cleaner
	// removes it when a dead run's name is on it.
	names, err := netnsx.List()
	var errs []error
	errs = append(errs, err)
	for _, n := range names {
		if h, err := netnsx.OpenNamed(n); err == nil {
			scope.Named[n] = h
			defer h.Close()
		}
	}
	verdicts := map[string]runstate.Verdict{}
	judge := func(id string) runstate.Verdict {
		v, ok := verdicts[id]
		if !ok {
			v = runstate.Judge(id)
			verdicts[id] = v
		}
		return v
	}
	keep := map[string]bool{} // owners with something left: their records stay
	for _, c := range runstate.Cleaners() {
		found, err := c.List(scope)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %ss: %w", c.Kind, err))
		}
		for _, l := range found {
			v := judge(l.Owner)
			it := Item{Kind: l.Kind, Name: l.Name, Owner: l.Owner, State: v.State.String(), Reason: v.Reason}
			switch {
			case v.State != runstate.Dead:
				it.Action = Kept
			case opts.DryRun:
				it.Action = WouldRemove
			default:
				if err := l.Remove(); err != nil && !errors.Is(err, os.ErrNotExist) {
					it.Action, it.Error = Failed, err.Error()
				} else {
					it.Action = Removed
				}
			}
			if it.Action != Removed {
				keep[l.Owner] = true
			}
			res.Items = append(res.Items, it)
			if it.Action == Removed || it.Action == WouldRemove {
				res.add(it)
			}
		}
	}
	res.Owners = removeRecords(opts.DryRun, keep)

	if opts.All {
		for _, p := range runstate.PersistentKinds() {
			names, err := p.List()
			errs = append(errs, err)
			if !opts.DryRun {
				names, err = removePersistent(p, names)
				errs = append(errs, err)
			}
			res.Labs = append(res.Labs, names...)
		}
	}
	return res, errors.Join(errs...)
}

func (r *Result) add(it Item) {
	switch it.Kind {
	case runstate.KindNetns:
		r.Namespaces = append(r.Namespaces, it.Name)
	case runstate.KindFilter:
		r.Filters = append(r.Filters, it.Name)
	case runstate.KindPinDir:
		r.PinDirs = append(r.PinDirs, it.Name)
	case runstate.KindStatus:
		r.StatusFiles = append(r.StatusFiles, it.Name)
	case runstate.KindVeth:
		r.Veths = append(r.Veths, it.Name)
	}
}

// removeRecords removes the records of ended owners that have nothing left (keep: owners
// with something left, or not yet removed) and returns their IDs.
func removeRecords(dry bool, keep map[string]bool) []string {
	ids, _ := runstate.Records()
	out := []string{}
	for _, id := range ids {
		if keep[id] || runstate.Judge(id).State != runstate.Dead {
			continue
		}
		if dry {
			out = append(out, id)
		} else if ok, _ := runstate.RemoveRecord(id); ok {
			out = append(out, id)
		}
	}
	if !dry {
		for _, p := range runstate.StaleTemps() {
			_ = os.Remove(p)
		}
	}
	slices.Sort(out)
	return out
}

// removePersistent removes the named things of kind p and returns the names it removed.
func removePersistent(p runstate.Persistent, names []string) ([]string, error) {
	var removed []string
	var errs []error
	for _, n := range names {
		err := p.Remove(n)
		if errors.Is(err, os.ErrNotExist) {
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
