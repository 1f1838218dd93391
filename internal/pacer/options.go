package pacer

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/kedge-dev/kedge/internal/probe"
	"github.com/kedge-dev/kedge/pkg/kedge"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Backends.
const (
	BackendAuto     = "auto"
	BackendEDT      = "edt"
	BackendNetem    = "netem"
	BackendConveyor = "conveyor"
)

// Backends lists the backend names Options.Backend accepts.
var Backends = []string{BackendAuto, BackendEDT, BackendNetem, BackendConveyor}

var backendIDs = map[string]pacerPacerBackend{
	BackendConveyor: pacerPacerBackendPACER_CONVEYOR,
	BackendNetem:    pacerPacerBackendPACER_NETEM,
	BackendEDT:      pacerPacerBackendPACER_EDT,
}

// BackendID returns enum pacer_backend for a backend name (auto and unknown names: conveyor).
func BackendID(name string) uint32 { return uint32(backendIDs[name]) }

// Options configure a pacer. Zero values take the defaults written beside each field.
type Options struct {
	// Netns is the consumer's namespace (its tick program runs there); -1 means the
	// caller's namespace.
	Netns netns.NsHandle
	// Name names the pacer namespace: netnsx.OwnedName(Name) (default "pacer").
	Name string
	// IfName is the pacer's veth in the consumer namespace (default "kedge-pc0"); tick
	// requests go through its twin IfName+"t".
	IfName string
	// Backend is auto, edt, netem or conveyor (default auto: the first of edt, netem,
	// conveyor that this kernel runs).
	Backend string
	// Period is one pass on netem and, with Carry, the conveyor's filler queue
	// (default 10ms; 200us..10s).
	Period time.Duration
	// Resolution is one pass of a tick on the conveyor without Carry: the tick frame is
	// padded so that its transmission time at RateMbit is Resolution (default 100us).
	Resolution time.Duration
	// RateMbit and FillerBytes shape the conveyor's tbf (defaults 100 and 1514).
	RateMbit    int
	FillerBytes int
	// Carry: the consumer carries packets (pacer_carry). The conveyor then keeps a filler
	// queue of Period circulating all the time.
	Carry bool
	// LostAfter: an armed tick this long overdue is presumed lost and re-armed by the
	// next request or by the watchdog (default max(4*Period, 100ms)).
	LostAfter time.Duration
	// Log receives the pacer's start and calibration messages (default slog.Default()).
	Log *slog.Logger
}

func (o *Options) setDefaults() error {
	if o.Name == "" {
		o.Name = "pacer"
	}
	if o.IfName == "" {
		o.IfName = "kedge-pc0"
	}
	if o.Backend == "" {
		o.Backend = BackendAuto
	}
	if _, ok := backendIDs[o.Backend]; !ok && o.Backend != BackendAuto {
		return fmt.Errorf("pacer backend %q unknown: use %s", o.Backend, strings.Join(Backends, ", "))
	}
	if o.Period == 0 {
		o.Period = 10 * time.Millisecond
	}
	if o.Period < 200*time.Microsecond || o.Period > 10*time.Second {
		return fmt.Errorf("pacer period %v out of range: use 200us..10s", o.Period)
	}
	if o.Resolution == 0 {
		o.Resolution = 100 * time.Microsecond
	}
	if o.Resolution < 10*time.Microsecond || o.Resolution > o.Period {
		return fmt.Errorf("pacer resolution %v out of range: use 10us..period (%v)", o.Resolution, o.Period)
	}
	if o.RateMbit == 0 {
		o.RateMbit = 100
	}
	if o.RateMbit < 1 || o.RateMbit > 10000 {
		return fmt.Errorf("pacer rate %d Mbit/s out of range: use 1..10000", o.RateMbit)
	}
	if o.FillerBytes == 0 {
		o.FillerBytes = 1514
	}
	// A filler must hold a tick frame: due ticks ride filler passes (pacer_piggyback).
	if o.FillerBytes < tickMinBytes || o.FillerBytes > maxFrame {
		return fmt.Errorf("pacer filler_bytes %d out of range: use %d..%d", o.FillerBytes, tickMinBytes, maxFrame)
	}
	if o.LostAfter == 0 {
		o.LostAfter = max(4*o.Period, 100*time.Millisecond)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return nil
}

// backendOrder returns the backends to try for want: itself, or for auto edt (when the
// kernel has bpf_skb_set_tstamp), netem, conveyor.
func backendOrder(want string) []string {
	if want != BackendAuto {
		return []string{want}
	}
	var out []string
	if haveSetTstamp() == nil {
		out = append(out, BackendEDT)
	}
	return append(out, BackendNetem, BackendConveyor)
}

func haveSetTstamp() error {
	return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnSkbSetTstamp)
}

// MinKernelMajor, MinKernelMinor: the pacer needs BPF atomics with fetch and
// compare-and-swap (Linux 5.12). A consumer may need more (bpf_loop: 5.17).
const MinKernelMajor, MinKernelMinor = 5, 12

// CheckKernel returns a *kedge.FeatureError on kernels older than MinKernel.
func CheckKernel() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if ok, parsed := probe.KernelAtLeast(rel, MinKernelMajor, MinKernelMinor); parsed && !ok {
		return &kedge.FeatureError{Feature: "the pacer (BPF atomic compare-and-swap)",
			MinKernel: fmt.Sprintf("%d.%d", MinKernelMajor, MinKernelMinor), Hint: "see 'kedge probe'",
			Err: fmt.Errorf("kernel %s", rel)}
	}
	return nil
}
