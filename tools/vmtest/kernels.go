package main

import (
	"fmt"
	"strings"
)

// Kernel is one entry of the matrix: a Debian kernel package from one suite.
type Kernel struct {
	// Name is what -kernels selects and what prefixes the guest's output ("6.1").
	Name string
	// Suite is the Debian suite the package comes from.
	Suite string
	// Package is a Debian binary package: either a concrete image
	// ("linux-image-6.1.0-50-amd64") or a meta-package that depends on exactly one
	// ("linux-image-amd64"), resolved to the suite's current image at run time.
	Package string
}

// kernels is the single source of truth for the matrix; docs/kernels.md describes it.
// Meta-packages track Debian's point releases, so a suite's image moves forward
// without editing this table; the summary prints the exact package and version used.
var kernels = []Kernel{
	{Name: "5.10", Suite: "bullseye", Package: "linux-image-amd64"},
	{Name: "6.1", Suite: "bookworm", Package: "linux-image-amd64"},
	{Name: "6.12", Suite: "trixie", Package: "linux-image-amd64"},
}

// defaultKernel is run when neither -kernels nor -all is given: the newest entry.
var defaultKernel = kernels[len(kernels)-1].Name

// guestModules are loaded (with their dependencies, in order) in every guest. A module
// that a kernel builds in is skipped; one that it neither builds in nor ships fails the run.
// The guest has no real modprobe: a module the kernel tries to autoload shows up as a
// VMTEST-MODPROBE line and in the summary, and belongs in this list if a test needs it.
var guestModules = []string{
	"veth",
	"bridge",
	"ifb",
	"tun",
	"sch_ingress", // clsact
	"sch_netem",
	"sch_fq",
	"sch_tbf",
	"sch_htb",
	"sch_prio",
	"cls_bpf",
	"cls_matchall",
	"act_bpf",
	"act_gact",
	"act_mirred",
	// A netlink.Handle opened without a family list opens XFRM and NETFILTER sockets
	// too; a host autoloads these, the guest (no modprobe) needs them loaded.
	"xfrm_user",
	"nfnetlink",
}

// selectKernels returns the table entries named in the comma-separated list, in table order.
func selectKernels(list string, all bool) ([]Kernel, error) {
	if all {
		return kernels, nil
	}
	if strings.TrimSpace(list) == "" {
		list = defaultKernel
	}
	want := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if _, ok := lookupKernel(name); !ok {
			return nil, fmt.Errorf("unknown kernel %q (known: %s)", name, kernelNames())
		}
		want[name] = true
	}
	var out []Kernel
	for _, k := range kernels {
		if want[k.Name] {
			out = append(out, k)
		}
	}
	return out, nil
}

func lookupKernel(name string) (Kernel, bool) {
	for _, k := range kernels {
		if k.Name == name {
			return k, true
		}
	}
	return Kernel{}, false
}

func kernelNames() string {
	names := make([]string, len(kernels))
	for i, k := range kernels {
		names[i] = k.Name
	}
	return strings.Join(names, ", ")
}
