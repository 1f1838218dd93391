package hedge

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/lab"
)

// chaosProc is a `kedge chaos serve -o json` process; its per-replica counters are read
// from its stdout when it exits.
type chaosProc struct {
	*kedgeProc
	probes uint64 // requests the test's own probes made it receive
}

// startChaos starts `kedge chaos serve` in h at addr with stall-pct pct (stall for those
// ids, 1 ms for the others) and waits until it answers.
func startChaos(t *testing.T, h *lab.Host, addr netip.AddrPort, pct int, stall time.Duration) *chaosProc {
	t.Helper()
	p := &chaosProc{kedgeProc: startKedgeStdout(t, h, "chaos", "serve", "--listen", addr.String(), "--stall-pct", fmt.Sprint(pct),
		"--stall", stall.String(), "--fast", "1ms", "--duration", "2m", "-o", "json")}
	p.probes = probeEcho(t, h, addr, 5*time.Second)
	return p
}

// stats ends the server (SIGTERM, by its pid) and returns its replica's counters.
func (p *chaosProc) stats(t *testing.T) chaos.Stats {
	t.Helper()
	if code := p.stop(t, syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Fatalf("chaos serve exited %d:\n%s", code, p.out.String())
	}
	var st []chaos.Stats
	if err := json.Unmarshal(p.stdout.Bytes(), &st); err != nil || len(st) != 1 {
		t.Fatalf("chaos serve -o json: %v (%d replicas)\nstdout: %s\nstderr: %s", err, len(st), p.stdout.String(), p.out.String())
	}
	return st[0]
}

// probeEcho waits until the UDP echo server at addr answers, probing from inside h (its own
// address: no hedger on the way) with ids that no chaos replica at 10% stalls, and returns
// how many probes the server received: every probe it received is answered, and the replies
// are counted until none has come for 300 ms (a probe sent before the server was bound got
// none, so it is not counted; one answered late still is).
func probeEcho(t *testing.T, h *lab.Host, addr netip.AddrPort, within time.Duration) uint64 {
	t.Helper()
	var conn *net.UDPConn
	if err := h.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(within)
	buf, req := make([]byte, 64), make([]byte, 8)
	var replies uint64
	for i := uint32(0); replies == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("no UDP echo from %s within %v", addr, within)
		}
		binary.BigEndian.PutUint32(req, 4_000_000_050+i%40) // id % 100 in 50..89
		_, _ = conn.Write(req)
		_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := conn.Read(buf); err == nil {
			replies++
		}
	}
	for {
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return replies
			}
			continue // ECONNREFUSED of a probe sent before the server was bound
		}
		replies++
	}
}

// TestMaxHedgesRealProcesses: three replicas as `kedge chaos serve` processes, srv1 (the
// service's address) and srv2 stalling the same 10% of ids for 300 ms, srv3 never; a hedger
// with max_hedges 2 and round robin, on the stored path and on the clone path. A stalled
// request's first hedge goes to srv2 or srv3; when it went to srv2 (stalled too), the
// second goes, one delay later, to srv3, the replica not yet tried: every stalled request is
// answered by srv3 well before the stall ends, no replica gets a request twice (the chaos
// servers' replay counters), the client sees one response per request, and the counters
// add up (hedges sent = hedges the replicas got; every queued hedge accounted for; the late
// responses of the stalled copies dropped).
func TestMaxHedgesRealProcesses(t *testing.T) {
	requireRoot(t)
	for _, path := range []string{pathStored, pathClone} {
		t.Run(path, func(t *testing.T) { testMaxHedges(t, path) })
	}
}

func testMaxHedges(t *testing.T, path string) {
	l, err := lab.Up(lab.Spec{Name: "hm", Fabric: lab.Bridge, Hosts: []string{"client", "srv1", "srv2", "srv3"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	const (
		pct   = 10
		stall = 300 * time.Millisecond
		delay = 10 * time.Millisecond
		n     = 60
		base  = 1000 // ids 1000..1009 of 1000..1059 stall at srv1 and srv2 (id % 100 < pct: each is its own replica 0)
	)
	at := func(h string) netip.AddrPort { return netip.AddrPortFrom(l.Host(h).IPv4, 9999) }
	srv1 := startChaos(t, l.Host("srv1"), at("srv1"), pct, stall)
	srv2 := startChaos(t, l.Host("srv2"), at("srv2"), pct, stall)
	srv3 := startChaos(t, l.Host("srv3"), at("srv3"), 0, stall)
	h := startHedger(t, l, &Config{
		Interface: "eth0",
		Services: []ServiceConfig{{Name: "mh", Address: at("srv1").String(),
			Replicas: []string{at("srv2").String(), at("srv3").String()},
			Delay:    DelaySpec{Fixed: delay}, MaxHedges: 2, ReplicaChoice: ReplicaRR,
			// Judgement off: srv2 stalls its hedges on purpose, and ejecting it would send
			// first hedges to srv3 instead of the second hedges this test counts.
			Ejection:   EjectionSpec{Off: true},
			Budget:     BudgetSpec{Ratio: 1, Burst: 100},
			StoreLimit: storeLimit(path)}},
	}, budgetTestBackend())

	res := runClient(t, l.Host("client"), at("srv1"), true, ids(n, base), time.Second)
	stalled, unrescued, wantStalled := 0, 0, 0
	for i := range n {
		if (base+i)%100 < pct {
			wantStalled++
		}
	}
	for i, d := range res.lat {
		if (base+i)%100 >= pct {
			continue
		}
		stalled++
		if d >= stall {
			unrescued++
			if !inGuest() {
				t.Errorf("id %d: %v - not rescued (the stall is %v)", base+i, d, stall)
			}
		}
	}
	if res.extra != 0 {
		t.Errorf("the client received %d extra datagrams; want exactly one response per request", res.extra)
	}
	// The stalled copies answer after the stall: wait for their responses to be dropped and
	// for every queued hedge to be popped.
	c := waitCounters(t, h, 5*time.Second, func(c map[string]uint64) bool {
		queued := c["requeued"] + n
		done := c["hedges_sent"] + c["overdue_dropped"] + c["stored_answered"] + c["clones_answered"] +
			c["stored_orphaned"] + c["clones_orphaned"]
		return c["duplicates_dropped"] == c["hedges_sent"] && done == queued
	})
	st1, st2, st3 := srv1.stats(t), srv2.stats(t), srv3.stats(t)
	got1, got2, got3 := st1.Requests-srv1.probes, st2.Requests-srv2.probes, st3.Requests-srv3.probes
	hedges := c["hedges_sent"]
	second := hedges - c["requeued"] // a hedge that is not a request's first one
	t.Logf("%s: counters %v", path, c)
	t.Logf("%s: %d stalled requests; srv1 got %d requests (%d stalls), srv2 %d (%d stalls), srv3 %d; replays %d/%d/%d; probes %d/%d/%d",
		path, stalled, got1, st1.Stalls, got2, st2.Stalls, got3, st1.Replays, st2.Replays, st3.Replays, srv1.probes, srv2.probes, srv3.probes)

	if stalled != wantStalled || len(res.lat) != n {
		t.Fatalf("%d answered, %d stalled; want %d and %d", len(res.lat), stalled, n, wantStalled)
	}
	// Every request went to srv1 once; every hedge to srv2 or srv3, none to a replica twice.
	if got1 != n || got2+got3 != hedges {
		t.Errorf("srv1 got %d requests (want %d), srv2 %d + srv3 %d hedges; want the %d hedges_sent", got1, n, got2, got3, hedges)
	}
	if st1.Replays+st2.Replays+st3.Replays != 0 {
		t.Errorf("replays %d/%d/%d: a replica got a copy of a request it had (each hedge goes to an untried replica)",
			st1.Replays, st2.Replays, st3.Replays)
	}
	// In an emulated (TCG) guest a hedge can come out later than the far-overdue cutoff and
	// is then dropped, counted (testRescue); on real CPUs every stall is rescued.
	if unrescued > 0 && uint64(unrescued) > c["overdue_dropped"] {
		t.Errorf("%d stalled requests not rescued but only %d dropped as overdue", unrescued, c["overdue_dropped"])
	}
	rescued := uint64(stalled - unrescued)
	// A rescued stalled request was answered by srv3 (srv1 and srv2 hold it for 300 ms),
	// and its last hedge won. The stalled ids come one after the other and round robin
	// alternates the first hedge's replica unless the request took a second hedge, so at
	// least half of them went to srv2 first and took a second hedge, to srv3.
	if got3 < rescued || c["hedges_won"] < rescued || c["hedges_won"] != c["responses_rewritten"] {
		t.Errorf("srv3 got %d hedges, hedges_won %d, responses_rewritten %d; want >= %d rescued requests each, won = rewritten",
			got3, c["hedges_won"], c["responses_rewritten"], rescued)
	}
	if second < rescued/2 || st2.Stalls < rescued/2 || second > c["requeued"] {
		t.Errorf("second hedges %d (srv2 stalled %d of its hedges), first hedges %d; want at least %d second hedges, each after a first",
			second, st2.Stalls, c["requeued"], rescued/2)
	}
	// Every hedged request was queued again once (max_hedges 2), and every queued hedge -
	// the n requests and the re-queued ones - was sent or dropped with a reason.
	want := map[string]uint64{"requests": n, "responses": n, "duplicates_dropped": hedges, "budget_exhausted": 0,
		"no_replica": 0, "requeue_full": 0, "hedge_rewrite_errors": 0, "redirect_errors": 0}
	answered, orphaned := "clones_answered", "clones_orphaned"
	if path == pathStored {
		want["stored"], want["clones"], want["tick_hedges"] = n, 0, hedges
		answered, orphaned = "stored_answered", "stored_orphaned"
		snap, err := h.Stats()
		if err != nil {
			t.Fatal(err)
		}
		// Hedges per tick: the requests come one at a time, so a tick has one or two due.
		ticks := snap.Global["pacer_ticks"]
		t.Logf("pacer_ticks %d, tick_hedges %d (%.2f hedges per tick), hedges_reinjected %d",
			ticks, c["tick_hedges"], float64(c["tick_hedges"])/float64(max(ticks, 1)), snap.Global["hedges_reinjected"])
		if ticks == 0 || c["tick_hedges"] > 64*ticks || snap.Global["tick_send_errors"] != 0 {
			t.Errorf("pacer_ticks %d, tick_send_errors %d for %d tick_hedges: want a tick per 64 hedges at least, no errors",
				ticks, snap.Global["tick_send_errors"], c["tick_hedges"])
		}
	} else {
		want["clones"], want["stored"], want["tick_hedges"] = n, 0, 0
	}
	// A queued further hedge finds its request answered, or - when every copy sent so far
	// has answered (a slow request of a loaded machine, hedged once) - its entry gone.
	if got, w := c[answered]+c[orphaned], n+c["requeued"]-hedges-c["overdue_dropped"]; got != w {
		t.Errorf("%s %d + %s %d = %d, want %d (every queued hedge not sent)", answered, c[answered], orphaned, c[orphaned], got, w)
	}
	if c[orphaned] > c["requeued"] {
		t.Errorf("%s %d, but only %d further hedges were queued", orphaned, c[orphaned], c["requeued"])
	}
	for name, w := range want {
		if c[name] != w {
			t.Errorf("%s = %d, want %d", name, c[name], w)
		}
	}
}
