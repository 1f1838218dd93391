package runstate

import (
	"fmt"
	"slices"
	"sync"

	"github.com/vishvananda/netns"
)

// The cleanup registry: every kind of thing a run can leave behind has a Cleaner that lists
// them with their owners. `kedge cleanup` (internal/cleanup) judges each owner and removes
// only what belongs to dead ones; it imports no capability. A capability registers a
// Cleaner for its own kinds in init(); namespaces (netnsx), tc filters and pin directories
// (bpfx) and status files (here) are registered by the packages that make them, and
// persistent labs (lab) as a Persistent kind.

// Kinds registered by kedge's shared packages.
const (
	KindNetns  = "netns"
	KindFilter = "tc filter"
	KindPinDir = "pin dir"
	KindStatus = "status file"
	KindVeth   = "veth" // veths a run adds to a namespace it does not own (an owner alias marks them)
)

// Scope tells cleaners where to look.
type Scope struct {
	// Netns is the network namespace whose interfaces are searched for tc filters;
	// -1: the caller's.
	Netns netns.NsHandle
	// Named are further namespaces to search, by their /run/netns name (cleanup passes
	// every one there, so a dead run's filters in a lab or a user's namespace are found).
	Named map[string]netns.NsHandle
	// StatusDir holds the status files; "": Dir.
	StatusDir string
}

// Leftover is one thing found, with its owner and how to remove it.
type Leftover struct {
	Kind   string
	Name   string // as the user should see it (path, namespace name, "<iface> <hook> filter <name>")
	Owner  string // owner ID (legacy: a bare pid)
	Remove func() error
}

// Cleaner lists the leftovers of one kind. List must not remove anything, and must list
// everything of its kind that carries an owner ID, live owners' included: the caller judges.
type Cleaner struct {
	Kind string
	// Order sorts cleaners (lower first): tc filters (10) go before pin directories (20)
	// and namespaces (30), status files (90) last, so a run's status stays while its
	// resources are being removed.
	Order int
	List  func(Scope) ([]Leftover, error)
}

var (
	regMu    sync.Mutex
	registry []Cleaner
)

// Register adds a cleaner. It panics when the kind is registered twice (a programming error).
func Register(c Cleaner) {
	regMu.Lock()
	defer regMu.Unlock()
	if c.Kind == "" || c.List == nil {
		panic("runstate: Register needs a kind and a List function")
	}
	for _, r := range registry {
		if r.Kind == c.Kind {
			panic(fmt.Sprintf("runstate: cleaner %q registered twice", c.Kind))
		}
	}
	registry = append(registry, c)
	slices.SortStableFunc(registry, func(a, b Cleaner) int { return a.Order - b.Order })
}

// Persistent is a kind of thing made to outlive the runs that made it, with no owner to
// judge (persistent labs, `kedge lab up`): cleanup removes it only when asked for everything
// (`kedge cleanup --all`).
type Persistent struct {
	Kind string
	// List returns the names present, including half-built or half-removed ones.
	List func() ([]string, error)
	// Remove removes one; an error wrapping os.ErrNotExist means it went meanwhile.
	Remove func(name string) error
}

var persistent []Persistent

// RegisterPersistent adds a persistent kind. It panics when the kind is registered twice.
func RegisterPersistent(p Persistent) {
	regMu.Lock()
	defer regMu.Unlock()
	if p.Kind == "" || p.List == nil || p.Remove == nil {
		panic("runstate: RegisterPersistent needs a kind, List and Remove")
	}
	for _, r := range persistent {
		if r.Kind == p.Kind {
			panic(fmt.Sprintf("runstate: persistent kind %q registered twice", p.Kind))
		}
	}
	persistent = append(persistent, p)
}

// PersistentKinds returns the registered persistent kinds in registration order.
func PersistentKinds() []Persistent {
	regMu.Lock()
	defer regMu.Unlock()
	return slices.Clone(persistent)
}

// Cleaners returns the registered cleaners in order.
func Cleaners() []Cleaner {
	regMu.Lock()
	defer regMu.Unlock()
	return slices.Clone(registry)
}
