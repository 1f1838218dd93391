package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

func init() { register(newStatusCmd) }

func newStatusCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List what kedge runs have attached and left: programs, links, tc filters, pins, namespaces",
		Long: `Status lists kedge's own attachments, per run (owner ID <pid>_<hex>, see
'kedge cleanup --help'), from what the runs name after themselves and what their
processes hold:
  - BPF links the run's process holds (TCX ingress/egress, XDP), with the interface
    and namespace they are attached to, and their program
  - the BPF programs the process holds
  - cls_bpf filters kedge:<owner>:... (clsact fallback) in this namespace and in
    every kedge namespace
  - pin directories, namespaces and status files
and the persistent labs. A run whose owner has ended is shown as dead: its leftovers
go with 'kedge cleanup'. Debian 12's bpftool (7.1) cannot show TCX links; this can.
Links and programs of a run in another PID namespace are not visible from here.`,
		Example: `  sudo kedge status
  sudo kedge status -o json | jq '.runs[] | {owner, links}'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			v, err := collectStatus()
			if err != nil {
				return rootHint(err)
			}
			return writeReport(cmd.OutOrStdout(), output, v, func(w io.Writer) error { return writeStatus(w, v) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

type statusView struct {
	Runs []*runView `json:"runs"`
	Labs []string   `json:"labs"` // persistent labs (kedge-lab-<name>-...)
}

type runView struct {
	Owner      string          `json:"owner"`
	State      string          `json:"state"` // alive, dead or unknown (runstate)
	Reason     string          `json:"reason"`
	PID        int             `json:"pid,omitempty"`
	Command    string          `json:"command,omitempty"`
	Started    *time.Time      `json:"started,omitempty"`
	Links      []linkView      `json:"links"`
	Programs   []progView      `json:"programs"`
	Filters    []filterView    `json:"tc_filters"`
	PinDirs    []pinView       `json:"pin_dirs"`
	Namespaces []string        `json:"namespaces"`
	Status     []string        `json:"status_files"`
	Other      []leftoverView  `json:"other"` // kinds capabilities registered
	seen       map[string]bool // "kind name" already listed
}

type linkView struct {
	ID      uint32   `json:"id"`
	Type    string   `json:"type"`           // tcx, xdp, ...
	Hook    string   `json:"hook,omitempty"` // ingress, egress
	IfIndex uint32   `json:"ifindex,omitempty"`
	Iface   string   `json:"iface,omitempty"` // found in Netns ("": not found in any kedge namespace or here)
	Netns   string   `json:"netns,omitempty"` // a kedge namespace, or "" for this one
	Program progView `json:"program"`
}

type progView struct {
	ID   uint32 `json:"id"`
	Name string `json:"name"`
	Type string `json:"type"`
}

type filterView struct {
	Netns string `json:"netns,omitempty"` // "" for this namespace
	Iface string `json:"iface"`
	Hook  string `json:"hook"`
	Name  string `json:"name"`
}

type pinView struct {
	Dir     string   `json:"dir"`
	Objects []string `json:"objects"`
}

type leftoverView struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
}

// collectStatus gathers every run's things: the registered cleaners' lists (what carries an
// owner), tc filters in every kedge namespace, and the links and programs each live run's
// process holds.
func collectStatus() (*statusView, error) {
	v := &statusView{Runs: []*runView{}, Labs: []string{}}
	byOwner := map[string]*runView{}
	run := func(id string) *runView {
		if r, ok := byOwner[id]; ok {
			return r
		}
		verdict := runstate.Judge(id)
		r := &runView{Owner: id, State: verdict.State.String(), Reason: verdict.Reason, Links: []linkView{}, Programs: []progView{},
			Filters: []filterView{}, PinDirs: []pinView{}, Namespaces: []string{}, Status: []string{}, Other: []leftoverView{}, seen: map[string]bool{}}
		if rec, err := runstate.ReadRecord(id); err == nil {
			r.PID, r.Command, r.Started = rec.PID, rec.Command, &rec.Started
		} else if pid, _, ok := runstate.ParseID(id); ok {
			r.PID = pid
		}
		byOwner[id] = r
		return r
	}
	ids, err := runstate.Records()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if runstate.Judge(id).State == runstate.Alive {
			run(id)
		}
	}

	// Namespaces to look into: this one, every kedge-owned one, every persistent lab's.
	nsNames, err := kedgeNamespaces()
	if err != nil {
		return nil, err
	}
	scopes := map[string]netns.NsHandle{"": netns.None()}
	for _, n := range nsNames {
		if h, err := netnsx.OpenNamed(n); err == nil {
			scopes[n] = h
			defer h.Close()
		}
	}
	var errs []error
	for _, c := range runstate.Cleaners() {
		found, err := c.List(runstate.Scope{Netns: netns.None()})
		errs = append(errs, err)
		for _, l := range found {
			r := run(l.Owner)
			r.seen[l.Kind+" "+l.Name] = true
			switch l.Kind {
			case runstate.KindNetns:
				r.Namespaces = append(r.Namespaces, l.Name)
			case runstate.KindStatus:
				r.Status = append(r.Status, l.Name)
			case runstate.KindPinDir:
				r.PinDirs = append(r.PinDirs, pinView{Dir: l.Name, Objects: pinned(l.Name)})
			case runstate.KindFilter:
				// listed per namespace below
			default:
				r.Other = append(r.Other, leftoverView{Kind: l.Kind, Name: l.Name})
			}
		}
	}
	for _, name := range sortedKeys(scopes) {
		fs, err := bpfx.ListFilters(scopes[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("list tc filters in %s: %w", nsLabel(name), err))
			continue
		}
		for _, f := range fs {
			r := run(f.Owner)
			r.Filters = append(r.Filters, filterView{Netns: name, Iface: f.Iface, Hook: f.Hook.String(), Name: f.Name})
		}
	}
	for _, r := range byOwner {
		if r.State == runstate.Alive.String() && r.PID > 0 && samePIDNamespace(r.Owner) {
			errs = append(errs, r.addHeld(scopes))
		}
	}

	for _, r := range byOwner {
		v.Runs = append(v.Runs, r)
	}
	slices.SortFunc(v.Runs, func(a, b *runView) int { return strings.Compare(a.Owner, b.Owner) })
	if v.Labs, err = lab.ListPersistent(); err != nil {
		errs = append(errs, err)
	}
	if v.Labs == nil {
		v.Labs = []string{}
	}
	return v, errors.Join(errs...)
}

// kedgeNamespaces lists the namespaces under /run/netns that kedge made: runs' and labs'.
func kedgeNamespaces() ([]string, error) {
	names, err := netnsx.List()
	var out []string
	for _, n := range names {
		if _, owned := netnsx.OwnerID(n); owned || strings.HasPrefix(n, lab.PersistentPrefix) {
			out = append(out, n)
		}
	}
	return out, err
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func nsLabel(name string) string {
	if name == "" {
		return "this namespace"
	}
	return "netns " + name
}

// pinned lists the objects pinned in dir.
func pinned(dir string) []string {
	entries, _ := os.ReadDir(dir)
	out := []string{}
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// samePIDNamespace reports whether the owner's pid means something here.
func samePIDNamespace(id string) bool {
	rec, err := runstate.ReadRecord(id)
	if err != nil {
		_, legacy, _ := runstate.ParseID(id)
		return legacy // legacy names: pids of this namespace by the old rule
	}
	own, _ := os.Readlink("/proc/self/ns/pid")
	return rec.PIDNS != "" && rec.PIDNS == own
}

// addHeld adds the BPF links and programs r's process holds (its /proc/<pid>/fdinfo).
func (r *runView) addHeld(scopes map[string]netns.NsHandle) error {
	dir := fmt.Sprintf("/proc/%d/fd", r.PID)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list the descriptors of run %s (pid %d): %w", r.Owner, r.PID, err)
	}
	progs := map[uint32]bool{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		info := fdinfo(r.PID, e.Name())
		switch target {
		case "anon_inode:bpf_link":
			if id := info["link_id"]; id != 0 {
				r.Links = append(r.Links, describeLink(link.ID(id), scopes))
			}
		case "anon_inode:bpf-prog":
			if id := info["prog_id"]; id != 0 && !progs[id] {
				progs[id] = true
				r.Programs = append(r.Programs, describeProg(ebpf.ProgramID(id)))
			}
		}
	}
	slices.SortFunc(r.Links, func(a, b linkView) int { return int(a.ID) - int(b.ID) })
	slices.SortFunc(r.Programs, func(a, b progView) int { return int(a.ID) - int(b.ID) })
	return nil
}

// fdinfo parses the numeric fields of /proc/<pid>/fdinfo/<fd>.
func fdinfo(pid int, fd string) map[string]uint32 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	out := map[string]uint32{}
	for _, line := range strings.Split(string(b), "\n") {
		k, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(val), 10, 32); err == nil {
			out[k] = uint32(n)
		}
	}
	return out
}

func describeProg(id ebpf.ProgramID) progView {
	v := progView{ID: uint32(id)}
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		v.Name = fmt.Sprintf("(%v)", err)
		return v
	}
	defer p.Close()
	if info, err := p.Info(); err == nil {
		v.Name, v.Type = info.Name, info.Type.String()
	}
	return v
}

// describeLink reads a link's type, hook and program, and finds its interface: the one
// with that ifindex, in this or a kedge namespace, that has this link attached.
func describeLink(id link.ID, scopes map[string]netns.NsHandle) linkView {
	v := linkView{ID: uint32(id)}
	info, err := linkInfo(id)
	if err != nil {
		v.Type = fmt.Sprintf("(%v)", err)
		return v
	}
	v.Type = fmt.Sprintf("link type %d", info.Type) // the kernel's enum bpf_link_type
	v.Program = describeProg(info.Program)
	var attach ebpf.AttachType
	switch {
	case info.TCX() != nil:
		v.Type, v.IfIndex = "tcx", info.TCX().Ifindex
		attach = ebpf.AttachType(info.TCX().AttachType)
		v.Hook = "ingress"
		if attach == ebpf.AttachTCXEgress {
			v.Hook = "egress"
		}
	case info.XDP() != nil:
		v.Type, v.IfIndex = "xdp", info.XDP().Ifindex
		attach = ebpf.AttachXDP
	default:
		return v
	}
	for _, name := range sortedKeys(scopes) {
		var iface string
		_ = netnsx.In(scopes[name], func() error {
			res, err := link.QueryPrograms(link.QueryOptions{Target: int(v.IfIndex), Attach: attach})
			if err != nil {
				return err
			}
			for _, p := range res.Programs {
				if lid, ok := p.LinkID(); ok && lid == id {
					iface = ifName(int(v.IfIndex))
				}
			}
			return nil
		})
		if iface != "" {
			v.Iface, v.Netns = iface, name
			break
		}
	}
	return v
}

func linkInfo(id link.ID) (*link.Info, error) {
	l, err := link.NewFromID(id)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return l.Info()
}

// ifName is the name of ifindex in the calling thread's namespace.
func ifName(ifindex int) string {
	h, err := bpfx.NetlinkHandle(netns.None())
	if err != nil {
		return strconv.Itoa(ifindex)
	}
	defer h.Close()
	l, err := h.LinkByIndex(ifindex)
	if err != nil {
		return strconv.Itoa(ifindex)
	}
	return l.Attrs().Name
}

func writeStatus(w io.Writer, v *statusView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(v.Runs) == 0 {
		fmt.Fprintln(tw, "no kedge run has anything attached or left")
	}
	for _, r := range v.Runs {
		head := fmt.Sprintf("run %s\t%s", r.Owner, r.State)
		if r.PID > 0 {
			head += fmt.Sprintf(", pid %d", r.PID)
		}
		if r.Command != "" {
			head += ": " + r.Command
		}
		if r.State == runstate.Dead.String() {
			head += " (ended: 'kedge cleanup' removes what it left)"
		}
		fmt.Fprintln(tw, head)
		for _, l := range r.Links {
			where := fmt.Sprintf("ifindex %d", l.IfIndex)
			if l.Iface != "" {
				where = l.Iface + " (" + nsLabel(l.Netns) + ")"
			}
			fmt.Fprintf(tw, "  link %d\t%s %s on %s, program %d %s\n", l.ID, l.Type, l.Hook, where, l.Program.ID, l.Program.Name)
		}
		for _, p := range r.Programs {
			fmt.Fprintf(tw, "  program %d\t%s (%s)\n", p.ID, p.Name, p.Type)
		}
		for _, f := range r.Filters {
			fmt.Fprintf(tw, "  tc filter\t%s %s %s (%s)\n", f.Iface, f.Hook, f.Name, nsLabel(f.Netns))
		}
		for _, p := range r.PinDirs {
			fmt.Fprintf(tw, "  pin dir\t%s: %s\n", p.Dir, strings.Join(p.Objects, " "))
		}
		for _, n := range r.Namespaces {
			fmt.Fprintf(tw, "  netns\t%s\n", n)
		}
		for _, s := range r.Status {
			fmt.Fprintf(tw, "  status file\t%s\n", s)
		}
		for _, o := range r.Other {
			fmt.Fprintf(tw, "  %s\t%s\n", o.Kind, o.Name)
		}
	}
	if len(v.Labs) > 0 {
		fmt.Fprintf(tw, "labs\t%s (see 'kedge lab list')\n", strings.Join(v.Labs, ", "))
	}
	return tw.Flush()
}
