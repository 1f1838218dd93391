package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/runstate"
	"github.com/kedge-dev/kedge/internal/runstate/runstatetest"
)

// TestStatusListsOwnAttachments: this test process is a kedge run with a lab, a TCX link,
// a clsact filter and a pin dir; `kedge status` lists each under the run's owner, the
// link with its interface and namespace. In private namespaces: nothing else shows.
func TestStatusListsOwnAttachments(t *testing.T) {
	requireRoot(t)
	if runstatetest.Private(t) {
		return
	}
	l, err := lab.Up(lab.Spec{Name: "st", Hosts: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := l.Host("a")
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "st_pass", Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for _, mode := range []bpfx.TCMode{bpfx.TCX, bpfx.TCClsact} {
		a, err := bpfx.AttachTC(prog, bpfx.TCTarget{Netns: h.Handle, IfIndex: h.IfIndex, Dir: bpfx.Ingress, Mode: mode, Name: "st"})
		if err != nil {
			t.Fatalf("attach %v: %v", mode, err)
		}
		defer a.Close()
	}
	pin, err := bpfx.PinDir("st")
	if err != nil {
		t.Fatal(err)
	}
	defer bpfx.RemovePinDir(pin)
	if err := prog.Pin(filepath.Join(pin, "prog")); err != nil {
		t.Fatal(err)
	}
	self, err := runstate.Self()
	if err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runCLI(t, "", "status", "-o", "json")
	if code != exitOK {
		t.Fatalf("status: exit %d: %s", code, stderr)
	}
	var v statusView
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("status -o json: %v: %s", err, stdout)
	}
	r := ownRun(t, v.Runs, self.ID)
	if r.Owner != self.ID || r.State != "alive" || r.PID != os.Getpid() {
		t.Errorf("run %s %s pid %d, want %s alive pid %d", r.Owner, r.State, r.PID, self.ID, os.Getpid())
	}
	if len(r.Links) != 1 || r.Links[0].Type != "tcx" || r.Links[0].Hook != "ingress" || r.Links[0].Iface != "eth0" ||
		r.Links[0].Netns != h.Name || r.Links[0].Program.Name != "st_pass" {
		t.Errorf("links %+v, want one tcx ingress link on eth0 in %s running st_pass", r.Links, h.Name)
	}
	if len(r.Filters) != 1 || r.Filters[0].Netns != h.Name || r.Filters[0].Iface != "eth0" || !strings.HasPrefix(r.Filters[0].Name, bpfx.FilterPrefix+self.ID+":st:") {
		t.Errorf("tc filters %+v, want kedge:%s:st:... on eth0 in %s", r.Filters, self.ID, h.Name)
	}
	if len(r.PinDirs) != 1 || r.PinDirs[0].Dir != pin || len(r.PinDirs[0].Objects) != 1 || r.PinDirs[0].Objects[0] != "prog" {
		t.Errorf("pin dirs %+v, want %s with prog", r.PinDirs, pin)
	}
	if len(r.Namespaces) != 2 {
		t.Errorf("namespaces %v, want the lab's two", r.Namespaces)
	}
	found := false
	for _, p := range r.Programs {
		found = found || p.Name == "st_pass"
	}
	if !found {
		t.Errorf("programs %+v lack st_pass", r.Programs)
	}
	code, stdout, _ = runCLI(t, "", "status")
	if code != exitOK || !strings.Contains(stdout, "tcx ingress on eth0 (netns "+h.Name+"), program") {
		t.Errorf("status: exit %d:\n%s", code, stdout)
	}
	t.Logf("kedge status:\n%s", stdout)
}

// ownRun returns the test's own run from status's list, which must hold no other run that
// the private namespaces could hide. Lab disks and disk-stall cgroups are host-wide (a file
// under /var/tmp, the blkio hierarchy): a raft lab test running at the same time in another
// package shows there as a run of unknown state holding only those, and status is right to
// list it.
func ownRun(t *testing.T, runs []*runView, self string) *runView {
	t.Helper()
	var own *runView
	for _, r := range runs {
		if r.Owner == self {
			own = r
			continue
		}
		hostWide := r.State == "unknown" && len(r.Links)+len(r.Programs)+len(r.Filters)+len(r.PinDirs)+len(r.Namespaces)+len(r.Status) == 0 && len(r.Other) > 0
		for _, o := range r.Other {
			hostWide = hostWide && (o.Kind == lab.KindDisk || o.Kind == lab.KindStallCgroup)
		}
		if !hostWide {
			t.Errorf("status lists run %s (%s: %s) with %+v; want only this test's run and host-wide lab disks or stall cgroups of others", r.Owner, r.State, r.Reason, *r)
		} else {
			t.Logf("another run's host-wide leftovers, listed as they should be: %s %+v", r.Owner, r.Other)
		}
	}
	if own == nil {
		t.Fatalf("status lists no run of this test (%s): %+v", self, runs)
	}
	return own
}
