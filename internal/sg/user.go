package sg

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
)

// UserReduction names a reduction written by the user (bpf/include/sg_user.h): the BPF object
// clang built from it, and the program in it that SG_USER_REDUCTION made ("": the
// object's only XDP program).
type UserReduction struct {
	Object  string
	Program string
}

// UserABI is the version of bpf/include/sg_user.h (sg_user_abi) this kedge loads.
const UserABI = 1

// UserBuildHint says how a user reduction is built (docs/sg.md, "User reductions").
const UserBuildHint = "build it from a kedge checkout with: clang-19 -target bpf -O2 -g -mcpu=v3 -Wall -Werror " +
	"-I bpf/include -c FILE.bpf.c -o FILE.o (docs/sg.md, \"User reductions\")"

// userShared are the maps a user reduction shares with the gather (bpf/include/sg_maps.h):
// the object's own copies are replaced by o's.
func (o *Objects) userShared() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{"groups": o.Groups, "slots": o.Slots, "results": o.Results,
		"stats": o.Stats, "sg_user_call": o.userCall}
}

// LoadUserReduction loads the user reduction u and makes it group's: the gather then
// tail-calls it for every reply of the group whose GroupCfg.Reduce is RedUser. Call it
// before the group is enabled. An object that is not a user reduction, was built against
// another version of bpf/include/sg.h, or that the verifier rejects is refused with an
// error that says which (a *bpfx.LoadError for the verifier: its Full() is the whole log).
func (o *Objects) LoadUserReduction(group uint32, u UserReduction) error {
	if group >= GroupsMax {
		return fmt.Errorf("user reduction for group %d: at most %d groups", group, GroupsMax)
	}
	spec, err := ebpf.LoadCollectionSpec(u.Object)
	if err != nil {
		return fmt.Errorf("read user reduction %s: %w; %s", u.Object, err, UserBuildHint)
	}
	name, err := userProgram(spec, u)
	if err != nil {
		return err
	}
	for n := range spec.Programs {
		if n != name {
			delete(spec.Programs, n)
		}
	}
	var abi uint32
	if v := spec.Variables["sg_user_abi"]; v == nil || v.Get(&abi) != nil {
		return fmt.Errorf("user reduction %s: no sg_user_abi: not made with bpf/include/sg_user.h's SG_USER_REDUCTION; %s", u.Object, UserBuildHint)
	}
	if abi != UserABI {
		return fmt.Errorf("user reduction %s: built with version %d of bpf/include/sg_user.h, this kedge takes version %d: rebuild it against this kedge's bpf/include", u.Object, abi, UserABI)
	}
	repl := map[string]*ebpf.Map{}
	for n, m := range o.userShared() {
		ms := spec.Maps[n]
		if ms == nil {
			continue
		}
		if err := ms.Compatible(m); err != nil {
			return fmt.Errorf("user reduction %s: its map %s differs from this kedge's (%v): rebuild it against this kedge's bpf/include", u.Object, n, err)
		}
		repl[n] = m
	}
	coll, err := bpfx.NewCollection("user reduction "+name, spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		return err
	}
	prog := coll.DetachProgram(name)
	coll.Close()
	if prog == nil {
		return fmt.Errorf("user reduction %s: program %s not loaded", u.Object, name)
	}
	if err := o.userProgs.Put(group, prog); err != nil {
		prog.Close()
		return fmt.Errorf("user reduction %s: set it as group %d's: %w", u.Object, group, err)
	}
	o.user = append(o.user, prog)
	return nil
}

// userProgram picks u's program in spec and checks that it is one the gather can call.
func userProgram(spec *ebpf.CollectionSpec, u UserReduction) (string, error) {
	var xdp []string
	for n, p := range spec.Programs {
		if p.Type == ebpf.XDP {
			xdp = append(xdp, n)
		}
	}
	slices.Sort(xdp)
	name := u.Program
	switch {
	case name == "" && len(xdp) == 1:
		name = xdp[0]
	case name == "" && len(xdp) == 0:
		return "", fmt.Errorf("user reduction %s: no XDP program: make one with SG_USER_REDUCTION (bpf/include/sg_user.h)", u.Object)
	case name == "":
		return "", fmt.Errorf("user reduction %s: %d XDP programs (%s): name one", u.Object, len(xdp), strings.Join(xdp, ", "))
	}
	p := spec.Programs[name]
	switch {
	case p == nil:
		return "", fmt.Errorf("user reduction %s: no program %q (XDP programs: %s)", u.Object, name, strings.Join(xdp, ", "))
	case p.Type != ebpf.XDP:
		return "", fmt.Errorf("user reduction %s: program %s is a %v program; a user reduction is the XDP program SG_USER_REDUCTION makes (bpf/include/sg_user.h)", u.Object, name, p.Type)
	}
	return name, nil
}
