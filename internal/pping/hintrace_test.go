package pping

import (
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// TestHintRace runs the packets that move a direction's state on two CPUs at the same
// instant, flow after flow: the first request of a direction (empty -> waiting to open, its
// hint slot up by one) on both CPUs, then the first reply to it (waiting -> open, the slot
// down by one) on both. Each move must be made once: a direction opened twice by its reply
// took two off its slot (which then reads one less than its directions hold, so a later
// pure reply of the slot is skipped without a sample; at zero the count wraps), one made
// to wait twice kept one too many. The two CPUs meet at a barrier before each packet and
// reach the state test within a few hundred ns of each other, so a flow's move collides
// seldom; over the trials enough do (FlowOpened above the trials counts the doubled
// opens) that, without the flow's lock around the moves, the test fails. A CPU that the
// scheduler gives to other work stalls the barrier, so the trials stop after raceBudget
// (fewer flows, the same checks).
const raceBudget = 20 * time.Second

func TestHintRace(t *testing.T) {
	bpftest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	const trials = 6000
	m := loadFixture(t, func(c *Config) { c.MaxFlows = trials })
	f := fam{}
	ts := func(tsval, tsecr uint32) []byte {
		return slices.Concat(pktbuild.OptNOP(), pktbuild.OptNOP(), pktbuild.OptTimestamp(tsval, tsecr))
	}
	type pkt struct {
		prog *ebpf.Program
		data []byte
	}
	var seq []pkt // request of flow i, reply of flow i, request of flow i+1, ...
	for i := range trials {
		port := uint16(10000 + i)
		seq = append(seq,
			pkt{m.objs.PpingEgress, f.ip(true).TCP(pktbuild.TCP{Src: port, Dst: portB, Flags: flagData, Options: ts(100, 50)}).Payload(make([]byte, 10)).Build()},
			pkt{m.objs.PpingIngress, f.ip(false).TCP(pktbuild.TCP{Src: portB, Dst: port, Flags: pktbuild.ACK, Options: ts(7000, 100)}).Build()})
	}

	var arrived, flows atomic.Int64
	var stop atomic.Bool
	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for cpu := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errs[cpu] = err
				arrived.Add(int64(2 * len(seq))) // release the other side's barrier
				return
			}
			for k, p := range seq {
				// Side 0 decides to stop before it arrives at a flow's request; the other
				// side reads the decision after that arrival, so both stop at that flow.
				if cpu == 0 && k%2 == 0 && time.Since(start) > raceBudget {
					stop.Store(true)
				}
				// Both sides arrive before either runs packet k.
				for arrived.Add(1); arrived.Load() < int64(2*(k+1)); {
				}
				if stop.Load() {
					return
				}
				if cpu == 0 && k%2 == 0 {
					flows.Add(1)
				}
				if _, err := bpftest.Run(p.prog, p.data); err != nil {
					errs[cpu] = err
					arrived.Add(int64(2 * len(seq)))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got, err := readCounters(m)()
	if err != nil {
		t.Fatal(err)
	}
	n := flows.Load()
	t.Logf("%d flows in %v", n, time.Since(start).Round(time.Millisecond))
	if opened := got["0.FlowOpened"]; opened != n {
		t.Errorf("%d directions opened by a reply, want %d (one per flow): %d opened twice", opened, n, opened-n)
	}
	checkHints(t, m)
}
