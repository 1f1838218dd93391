package hedge

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestUpdate changes a running hedger's services under traffic: a service added is hedged,
// a changed one keeps its slot and counters, a removed one is no longer seen, the untouched
// one is never rewritten (its counters only grow and its requests are all answered), and a
// hedger-wide change or a lack of free slots is refused with ErrRestart, changing nothing.
func TestUpdate(t *testing.T) {
	requireRoot(t)
	l := hedgeLab(t, "hu")
	srv1, srv2, client := l.Host("srv1"), l.Host("srv2"), l.Host("client")
	stallIf := func(id uint32) bool { return id%10 == 0 }
	const stall = 300 * time.Millisecond
	for _, port := range []int{9001, 9002, 9003} {
		startServer(t, srv1, srv1.IPv4, port, stallIf, stall)
		startServer(t, srv2, srv2.IPv4, port, nil, 0)
	}
	svc := func(name string, port int, delay time.Duration) ServiceConfig {
		return ServiceConfig{
			Name: name, Address: netip.AddrPortFrom(srv1.IPv4, uint16(port)).String(),
			Replicas: []string{netip.AddrPortFrom(srv2.IPv4, uint16(port)).String()},
			Delay:    DelaySpec{Fixed: delay}, Budget: BudgetSpec{Ratio: 1, Burst: 100},
		}
	}
	conf := func(ttl time.Duration, svcs ...ServiceConfig) *Config {
		return &Config{Interface: "eth0", TTL: Duration(ttl), Services: svcs}
	}
	h, err := Start(conf(time.Second, svc("a", 9001, 10*time.Millisecond)),
		Options{Netns: client.Handle, ServiceSlots: 3, Log: testLogger(t)})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	counters := func(name string) map[string]uint64 {
		t.Helper()
		snap, err := h.Stats()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range snap.Services {
			if s.Name == name {
				return s.Counters
			}
		}
		return nil
	}
	addr := func(port int) netip.AddrPort { return netip.AddrPortFrom(srv1.IPv4, uint16(port)) }
	attached := slices.Clone(h.attached)

	// Service a's traffic runs throughout; every request must be answered exactly once.
	done := make(chan clientResult)
	go func() {
		var r clientResult
		defer func() { done <- r }() // also when runClient fails (t.Fatalf ends this goroutine)
		r = runClient(t, client, addr(9001), true, ids(1000, 1000), 2*time.Second)
	}()

	// Add b: hedged from the next request on.
	if err := h.Update(conf(time.Second, svc("a", 9001, 10*time.Millisecond), svc("b", 9002, 10*time.Millisecond))); err != nil {
		t.Fatalf("add b: %v", err)
	}
	runClient(t, client, addr(9002), false, ids(40, 1), 2*time.Second)
	b := counters("b")
	if b["requests"] != 40 || b["hedges_sent"] < 4 {
		t.Errorf("b after add: requests %d hedges_sent %d, want 40 and >= 4 (the stalled ones)", b["requests"], b["hedges_sent"])
	}

	// Change b's delay: same slot, counters kept.
	if err := h.Update(conf(time.Second, svc("a", 9001, 10*time.Millisecond), svc("b", 9002, 20*time.Millisecond))); err != nil {
		t.Fatalf("change b: %v", err)
	}
	snap, _ := h.Stats()
	if got := snap.Services[1].DelayNow; got != 20*time.Millisecond {
		t.Errorf("b's delay now %v, want 20ms", got)
	}
	runClient(t, client, addr(9002), false, ids(20, 100), 2*time.Second)
	if got := counters("b")["requests"]; got != 60 {
		t.Errorf("b after change: requests %d, want 60 (counters kept)", got)
	}

	// Refused: a hedger-wide change; nothing changes.
	if err := h.Update(conf(2*time.Second, svc("a", 9001, 10*time.Millisecond))); !errors.Is(err, ErrRestart) {
		t.Errorf("ttl change: %v, want ErrRestart", err)
	}
	if len(h.Config.Services) != 2 {
		t.Errorf("a refused update changed the services: %d", len(h.Config.Services))
	}

	res := <-done
	if len(res.lat) != 1000 || res.extra != 0 {
		t.Errorf("a: %d responses and %d extra datagrams during the updates, want 1000 and 0", len(res.lat), res.extra)
	}
	a := counters("a")
	if a["requests"] != 1000 || a["responses"] != 1000 || a["hedges_sent"] < 100 {
		t.Errorf("a: requests %d responses %d hedges_sent %d, want 1000, 1000, >= 100 (never reset)", a["requests"], a["responses"], a["hedges_sent"])
	}

	// Remove a, add c: c takes the never-used third slot; a fourth service finds only a's
	// slot, freed less than a TTL ago. The fourth is tried at once: the refusal holds only
	// within the TTL, which a loaded machine can spend on anything in between (a's stalled
	// request alone takes 300 ms); should even that take a TTL, there is nothing to check.
	removed := time.Now() // a's slot is freed after this
	if err := h.Update(conf(time.Second, svc("b", 9002, 20*time.Millisecond), svc("c", 9003, 10*time.Millisecond))); err != nil {
		t.Fatalf("remove a, add c: %v", err)
	}
	d := svc("d", 9004, 10*time.Millisecond)
	err = h.Update(conf(time.Second, svc("b", 9002, 20*time.Millisecond), svc("c", 9003, 10*time.Millisecond), d))
	switch within := time.Since(removed) < time.Second; {
	case within && !errors.Is(err, ErrRestart):
		t.Errorf("a fourth service in three slots: %v, want ErrRestart", err)
	case !within && err != nil && !errors.Is(err, ErrRestart):
		t.Errorf("a fourth service after a TTL: %v", err)
	case !within:
		t.Logf("the fourth service was tried %v after a's removal, past the TTL: its refusal not checked", time.Since(removed))
	}
	runClient(t, client, addr(9001), true, ids(10, 5000), 2*time.Second)
	if counters("a") != nil {
		t.Errorf("a still reported after its removal")
	}
	if got := counters("b")["requests"]; got != 60 {
		t.Errorf("b: requests %d, want 60 (untouched, a's traffic not counted)", got)
	}
	// After the TTL a's slot is free again, and starts from zero.
	time.Sleep(time.Second) // the TTL is a wall-clock rule; nothing to poll
	if err := h.Update(conf(time.Second, svc("b", 9002, 20*time.Millisecond), svc("c", 9003, 10*time.Millisecond), d)); err != nil {
		t.Fatalf("d after the TTL: %v", err)
	}
	if got := counters("d")["requests"]; got != 0 {
		t.Errorf("d in a's old slot starts at %d requests, want 0", got)
	}
	// a's address, last matched on the CPUs that ran a's traffic and so still in their
	// address caches (addr_cache), is not d's now that d holds a's slot: every update
	// raises lookup_gen.
	runClient(t, client, addr(9001), true, ids(10, 7000), 2*time.Second)
	if got := counters("d")["requests"]; got != 0 {
		t.Errorf("d counted %d requests to a's old address, want 0 (a stale address cache)", got)
	}
	runClient(t, client, addr(9003), false, ids(20, 1), 2*time.Second)
	if c := counters("c"); c["requests"] != 20 || c["hedges_sent"] < 2 {
		t.Errorf("c: requests %d hedges_sent %d, want 20 and >= 2", c["requests"], c["hedges_sent"])
	}
	if !slices.Equal(attached, h.attached) {
		t.Errorf("the attachments changed across updates")
	}
}
