package hedge

import (
	"errors"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestGCKeepsYoungEntries: the timer's scoreboard walk (timer.h, gc_one) deletes entries
// older than the TTL and nothing else. An entry written after the walk read its clock - a
// splitter on the other CPU while the walk runs - is younger than the walk's "now"; the
// unsigned age of such an entry wraps, and the walk used to delete it: a live request lost its
// entry (its response counted in unmatched_responses, its clone or stored cell orphaned and
// never hedged). The clock is fixed here, so the young entry is one with a send time after it.
func TestGCKeepsYoungEntries(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOpts{tick: 10 * time.Millisecond})
	if err := f.objs.KedgeClockNs.Set(f.now); err != nil {
		t.Fatalf("set the clock: %v", err)
	}
	ttl := uint64(time.Duration(f.h.Config.TTL))
	old, young := key(sV4, client4, 1), key(sV4, client4, 2)
	f.put(t, old, pending(f.now-ttl-uint64(time.Second), f.now-ttl))
	f.put(t, young, pending(f.now+uint64(time.Millisecond), f.now+uint64(11*time.Millisecond)))
	if err := f.h.arm(); err != nil {
		t.Fatalf("arm the timer: %v", err)
	}
	// The expired entry going is the sign that a walk ran; a few more periods after it.
	var e hedgeHreq
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f.objs.Scoreboard.Lookup(old, &e)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			t.Fatalf("read the expired entry: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the expired entry is still there after 5 s: the scoreboard walk did not run")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if err := f.objs.Scoreboard.Lookup(young, &e); err != nil {
		t.Fatalf("the entry sent after the walk's clock was deleted by the walk: %v", err)
	}
}
