package lab

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
)

// dupMark is the skb mark of a duplicate on its way back into its port (bpf/include/marks.h).
const dupMark = uint32(fabricKedgeMarkKEDGE_MARK_FABRIC_DUP)

// LinkFault is what the fault fabric does to the packets of one direction of one link
// (from host A into the fabric, addressed to host B). The zero value passes everything.
type LinkFault struct {
	Partition bool    `json:"partition,omitempty"` // drop every packet
	Loss      float64 `json:"loss,omitempty"`      // probability a packet is dropped
	Dup       float64 `json:"dup,omitempty"`       // probability a second copy is delivered
	// Delay holds packets this long (plus a uniform 0..Jitter) in the fabric's delay line.
	// DelayShare is the fraction of packets delayed (0 with a Delay means all): packets not
	// delayed overtake delayed ones, which is how reordering is made.
	Delay      time.Duration `json:"delay,omitempty"`
	Jitter     time.Duration `json:"jitter,omitempty"`
	DelayShare float64       `json:"delay_share,omitempty"`
}

// IsZero reports whether f passes everything unchanged.
func (f LinkFault) IsZero() bool { return f == LinkFault{} }

// Validate checks probabilities and durations.
func (f LinkFault) Validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"loss", f.Loss}, {"dup", f.Dup}, {"delay share", f.DelayShare}} {
		if p.v < 0 || p.v > 1 || math.IsNaN(p.v) {
			return fmt.Errorf("%s %v out of range: use a probability from 0 to 1", p.name, p.v)
		}
	}
	if f.Delay < 0 || f.Jitter < 0 {
		return errors.New("negative delay or jitter: use durations >= 0")
	}
	if f.Delay > maxDelay || f.Jitter > maxDelay {
		return fmt.Errorf("delay %v + jitter %v too long: at most %v each", f.Delay, f.Jitter, maxDelay)
	}
	if f.DelayShare > 0 && f.Delay == 0 && f.Jitter == 0 {
		return errors.New("delay share without a delay or jitter: give --delay or --jitter too")
	}
	return nil
}

func (f LinkFault) String() string {
	var parts []string
	if f.Partition {
		parts = append(parts, "partition")
	}
	if f.Loss > 0 {
		parts = append(parts, fmt.Sprintf("loss %.3g%%", f.Loss*100))
	}
	if f.Dup > 0 {
		parts = append(parts, fmt.Sprintf("dup %.3g%%", f.Dup*100))
	}
	if f.Delay > 0 || f.Jitter > 0 {
		s := fmt.Sprintf("delay %v", f.Delay)
		if f.Jitter > 0 {
			s += fmt.Sprintf("+0..%v", f.Jitter)
		}
		if f.DelayShare > 0 && f.DelayShare < 1 {
			s += fmt.Sprintf(" on %.3g%%", f.DelayShare*100)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// prob turns a probability into the program's threshold (a fraction of 2^32).
func prob(p float64) uint32 {
	if p <= 0 {
		return 0
	}
	if p >= 1 {
		return math.MaxUint32
	}
	return uint32(p * (1 << 32))
}

// Link names one direction between two hosts (by name).
type Link struct{ From, To string }

// FaultFabric injects faults in a lab's fabric namespace, at TC ingress of every
// fabric-side veth (bpf/lab/fabric.bpf.c): below the hosts' interfaces, so programs on a
// host's eth0 see what a faulty wire would give them. Delays go through a delay line in
// the fabric namespace (see DelayBackend). Close detaches everything; deleting the fabric
// namespace (lab Close) does too.
type FaultFabric struct {
	lab   *Lab
	objs  fabricObjects
	atts  []bpfx.Attachment
	delay *tunDelay

	mu    sync.Mutex
	rules map[Link]LinkFault
}

// DelayBackend names how delays are made: "tun" (a tun device in the fabric namespace whose
// reader in this process holds packets and re-injects them; router fabric only) or "none".
func (f *FaultFabric) DelayBackend() string {
	if f.delay != nil {
		return "tun"
	}
	return "none"
}

// Faults loads the fault program and attaches it to every fabric port of l. With a router
// fabric it also creates the delay line. Close (or the lab's Close) removes it all.
func (l *Lab) Faults() (_ *FaultFabric, err error) {
	f := &FaultFabric{lab: l, rules: map[Link]LinkFault{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Close())
		}
	}()
	fh, err := bpfx.NetlinkHandle(l.Fabric.Handle)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	// The delay line first: the program is loaded with its device's ifindex (fab_cfg).
	var delayIfindex uint32
	if l.Spec.Fabric == Router {
		if f.delay, err = newTunDelay(l, fh, f.linkOf, f.delayOf); err != nil {
			return nil, err
		}
		delayIfindex = uint32(f.delay.ifindex)
	}
	if err := loadFabricProgram(&f.objs, delayIfindex); err != nil {
		return nil, err
	}
	for _, h := range l.Hosts {
		port, err := fh.LinkByName(fmt.Sprintf("v%d", h.Index))
		if err != nil {
			return nil, fmt.Errorf("find fabric port of %s: %w", h.HostName, err)
		}
		ifx, idx := uint32(port.Attrs().Index), uint32(h.Index)
		if err := f.objs.FabPorts.Put(ifx, idx); err != nil {
			return nil, fmt.Errorf("fill fab_ports: %w", err)
		}
		for _, a := range []netip.Addr{h.IPv4, h.IPv6} {
			if !a.IsValid() {
				continue
			}
			if err := f.objs.FabHosts.Put(a.As16(), idx); err != nil {
				return nil, fmt.Errorf("fill fab_hosts: %w", err)
			}
		}
		att, err := bpfx.AttachTC(f.objs.FabricIngress, bpfx.TCTarget{
			Netns: l.Fabric.Handle, IfIndex: port.Attrs().Index, Dir: bpfx.Ingress, Name: "fabric"})
		if err != nil {
			return nil, fmt.Errorf("attach fault program to %s: %w", port.Attrs().Name, err)
		}
		f.atts = append(f.atts, att)
	}
	return f, nil
}

// loadFabricProgram loads the fault program (raising RLIMIT_MEMLOCK where the kernel
// still charges BPF memory to it, before 5.11) with its delay device (0: none).
func loadFabricProgram(objs *fabricObjects, delayIfindex uint32) error {
	spec, err := loadFabric()
	if err != nil {
		return fmt.Errorf("load fabric program spec: %w", err)
	}
	cfg := fabricFabConfig{DupMark: dupMark, DelayIfindex: delayIfindex}
	if err := spec.Variables[fabricVarFabCfg].Set(cfg); err != nil {
		return fmt.Errorf("set fabric config: %w", err)
	}
	return bpfx.LoadAndAssign("fault fabric", spec, objs, nil)
}

// Close detaches the program and stops the delay line (packets it holds are dropped).
func (f *FaultFabric) Close() error {
	var errs []error
	for _, a := range f.atts {
		errs = append(errs, a.Close())
	}
	f.atts = nil
	if f.delay != nil {
		errs = append(errs, f.delay.Close())
		f.delay = nil
	}
	errs = append(errs, f.objs.Close())
	return errors.Join(errs...)
}

func (f *FaultFabric) host(name string) (*Host, error) {
	h := f.lab.Host(name)
	if h == nil {
		return nil, fmt.Errorf("no host %q in lab %s: hosts are %s", name, f.lab.Spec.Name, strings.Join(f.lab.Spec.Hosts, ", "))
	}
	return h, nil
}

// Set replaces the fault of each given link direction (a zero LinkFault clears it).
func (f *FaultFabric) Set(fault LinkFault, links ...Link) error {
	if err := fault.Validate(); err != nil {
		return err
	}
	if (fault.Delay > 0 || fault.Jitter > 0) && f.delay == nil {
		return fmt.Errorf("delay needs the fabric's delay line: %w (use a router fabric)", ErrNoDelayLine)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ln := range links {
		src, err := f.host(ln.From)
		if err != nil {
			return err
		}
		dst, err := f.host(ln.To)
		if err != nil {
			return err
		}
		if src == dst {
			return fmt.Errorf("link %s -> %s: a host's packets to itself never reach the fabric", ln.From, ln.To)
		}
		if err := f.put(src.Index, dst.Index, fault); err != nil {
			return err
		}
		if fault.IsZero() {
			delete(f.rules, ln)
		} else {
			f.rules[ln] = fault
		}
	}
	return nil
}

// ErrNoDelayLine: the lab has no delay line (bridge fabric).
var ErrNoDelayLine = errors.New("no delay line")

func (f *FaultFabric) put(src, dst int, fault LinkFault) error {
	k := fabricFabLinkKey{Src: uint32(src), Dst: uint32(dst)}
	if fault.IsZero() {
		if err := f.objs.FabLinks.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear link %d->%d: %w", src, dst, err)
		}
		return nil
	}
	v := fabricFabFault{Loss: prob(fault.Loss), Dup: prob(fault.Dup)}
	if fault.Partition {
		v.Partition = 1
	}
	if fault.Delay > 0 || fault.Jitter > 0 {
		v.Delay = math.MaxUint32
		if fault.DelayShare > 0 {
			v.Delay = prob(fault.DelayShare)
		}
	}
	if err := f.objs.FabLinks.Put(k, v); err != nil {
		return fmt.Errorf("set link %d->%d: %w", src, dst, err)
	}
	return nil
}

// OneWay returns the links from each of from to each of to (a one-way cut when given to Set
// with Partition).
func OneWay(from, to []string) []Link {
	var ls []Link
	for _, a := range from {
		for _, b := range to {
			if a != b {
				ls = append(ls, Link{a, b})
			}
		}
	}
	return ls
}

// Split returns the links, both directions, between hosts in different groups: Set with a
// Partition fault makes each group an island. Hosts in no group are left alone.
func Split(groups ...[]string) []Link {
	var ls []Link
	for i, g := range groups {
		for j, o := range groups {
			if i != j {
				ls = append(ls, OneWay(g, o)...)
			}
		}
	}
	return ls
}

// NodeLinks returns every link to and from host name (per-node faults).
func (f *FaultFabric) NodeLinks(name string) []Link {
	var others []string
	for _, h := range f.lab.Spec.Hosts {
		if h != name {
			others = append(others, h)
		}
	}
	return append(OneWay([]string{name}, others), OneWay(others, []string{name})...)
}

// AllLinks returns every link of the lab, both directions.
func (f *FaultFabric) AllLinks() []Link { return OneWay(f.lab.Spec.Hosts, f.lab.Spec.Hosts) }

// Partition makes each group an island (a symmetric split); it adds to the other faults.
func (f *FaultFabric) Partition(groups ...[]string) error {
	return f.Set(LinkFault{Partition: true}, Split(groups...)...)
}

// Heal removes every fault.
func (f *FaultFabric) Heal() error {
	f.mu.Lock()
	links := make([]Link, 0, len(f.rules))
	for ln := range f.rules {
		links = append(links, ln)
	}
	f.mu.Unlock()
	return f.Set(LinkFault{}, links...)
}

// Rules returns the faults in force, sorted by link.
func (f *FaultFabric) Rules() []LinkRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]LinkRule, 0, len(f.rules))
	for ln, r := range f.rules {
		out = append(out, LinkRule{Link: ln, Fault: r})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Link, out[j].Link
		return a.From < b.From || a.From == b.From && a.To < b.To
	})
	return out
}

// LinkRule is one link's fault.
type LinkRule struct {
	Link  Link      `json:"link"`
	Fault LinkFault `json:"fault"`
}

// FabricStats are the fault program's counters summed over CPUs, plus the delay line's.
type FabricStats struct {
	Passed, NoRule, Partitioned, Lost, Duplicated, DupFailed, DupCopy uint64
	Delayed, DelayOff, DelayFailed, NotIP, Malformed, NoHost          uint64
	// The delay line: packets re-injected, dropped because it was full, dropped on write.
	DelayReleased, DelayOverflow, DelayWriteErr uint64
}

// Stats reads the counters.
func (f *FaultFabric) Stats() (FabricStats, error) {
	c, err := bpfx.SumPerCPU[fabricFabStats](f.objs.FabCounters, uint32(0))
	if err != nil {
		return FabricStats{}, err
	}
	s := FabricStats{
		Passed: c.Passed, NoRule: c.NoRule, Partitioned: c.Partitioned, Lost: c.Lost,
		Duplicated: c.Duplicated, DupFailed: c.DupFailed, DupCopy: c.DupCopy,
		Delayed: c.Delayed, DelayOff: c.DelayOff, DelayFailed: c.DelayFailed,
		NotIP: c.NotIp, Malformed: c.Malformed, NoHost: c.NoHost,
	}
	if f.delay != nil {
		s.DelayReleased, s.DelayOverflow, s.DelayWriteErr = f.delay.counts()
	}
	return s, nil
}

// linkOf maps a packet's addresses to host indices (for the delay line).
func (f *FaultFabric) linkOf(src, dst netip.Addr) (Link, bool) {
	var ln Link
	for _, h := range f.lab.Hosts {
		if h.IPv4 == src || h.IPv6 == src {
			ln.From = h.HostName
		}
		if h.IPv4 == dst || h.IPv6 == dst {
			ln.To = h.HostName
		}
	}
	return ln, ln.From != "" && ln.To != ""
}

func (f *FaultFabric) delayOf(ln Link) (time.Duration, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.rules[ln]
	return r.Delay, r.Jitter
}
