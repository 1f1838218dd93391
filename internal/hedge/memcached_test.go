package hedge

// The memcached-udp preset with real memcached processes (the lab's srv1 serves, srv2 is its
// replica) and memcached's own counters as the witness: while srv1 is paused (SIGSTOP), gets
// are hedged to srv2 and answered from there, sets wait for srv1 - no set ever reaches srv2.

import (
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// startMemcached runs memcached on h (lab.StartMemcached) until the test ends, and returns
// its process.
func startMemcached(t *testing.T, bin string, h *lab.Host) *os.Process {
	t.Helper()
	cmd, err := lab.StartMemcached(h, bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.StopProcess(cmd) })
	return cmd.Process
}

// memcachedStats reads memcached's counters on h (not through the hedger).
func memcachedStats(t *testing.T, h *lab.Host) map[string]uint64 {
	t.Helper()
	s, err := lab.MemcachedStats(h)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMemcachedPresetLab(t *testing.T) {
	l, bin := presetLab(t, "hmc", "memcached", "memcached")
	client, srv1, srv2 := l.Host("client"), l.Host("srv1"), l.Host("srv2")
	primary := startMemcached(t, bin, srv1)
	startMemcached(t, bin, srv2)
	h := startHedger(t, l, &Config{Interface: "eth0", Services: []ServiceConfig{{
		Name: "mc", Protocol: ProtocolMemcachedUDP, Address: srv1.IPv4.String(), Replicas: []string{srv2.IPv4.String()},
		Delay: DelaySpec{Fixed: 5 * time.Millisecond}, Budget: BudgetSpec{Mode: BudgetWindow, Ratio: 1, Burst: 100}}},
	}, budgetTestBackend())

	const keys = 10
	// The body (after the frame header) by request id.
	sendMsg, recv := presetConn(t, client, netip.AddrPortFrom(srv1.IPv4, 11211), 8, func(b []byte) string { return string(b[8:]) })
	send := func(cmd string) uint16 { return sendMsg(func(id uint16) []byte { return mcMsg(id, []byte(cmd)) }) }
	set := func(i int) string { return fmt.Sprintf("set k%d 0 0 2\r\nv%d\r\n", i%10, i%10) }
	get := func(i int) string { return fmt.Sprintf("get k%d\r\n", i) }

	// Both healthy: srv1 stores and answers.
	for i := range keys {
		send(set(i))
	}
	if got := recv(keys, 5*time.Second); len(got) != keys {
		t.Fatalf("sets with srv1 healthy: %d of %d answered: %v", len(got), keys, got)
	}

	// srv1 paused: gets are hedged to srv2 (which misses: END), sets wait for srv1.
	if err := lab.Pause(primary.Pid); err != nil {
		t.Fatal(err)
	}
	gets := map[uint16]bool{}
	for i := range keys {
		gets[send(get(i))] = true
	}
	got := recv(keys, 5*time.Second)
	for rid, body := range got {
		if !gets[rid] || body != "END\r\n" {
			t.Errorf("response %d %q while srv1 is paused: want the gets answered by srv2 (END)", rid, body)
		}
	}
	if len(got) != keys {
		t.Errorf("gets with srv1 paused: %d of %d answered (by hedges to srv2)", len(got), keys)
	}
	sets := map[uint16]bool{}
	for i := range keys {
		sets[send(set(keys+i))] = true
	}
	if early := recv(1, 200*time.Millisecond); len(early) != 0 {
		t.Errorf("sets answered while srv1 is paused: %v (a set went to srv2)", early)
	}
	if err := lab.Resume(primary.Pid); err != nil {
		t.Fatal(err)
	}
	// srv1 back: it stores the sets; its answers to the gets come second and are dropped.
	got = recv(keys+1, 2*time.Second)
	for rid, body := range got {
		if !sets[rid] || body != "STORED\r\n" {
			t.Errorf("response %d %q after srv1's pause: want only the sets' STORED (the gets' second responses dropped)", rid, body)
		}
	}
	if len(got) != keys {
		t.Errorf("sets after srv1's pause: %d of %d stored", len(got), keys)
	}

	s1, s2 := memcachedStats(t, srv1), memcachedStats(t, srv2)
	if s2["cmd_set"] != 0 || s2["cmd_get"] < keys {
		t.Errorf("srv2: cmd_set %d, cmd_get %d; want no set and the %d hedged gets", s2["cmd_set"], s2["cmd_get"], keys)
	}
	if s1["cmd_set"] != 2*keys || s1["cmd_get"] != keys {
		t.Errorf("srv1: cmd_set %d, cmd_get %d; want every request: %d and %d", s1["cmd_set"], s1["cmd_get"], 2*keys, keys)
	}
	snap, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	c := snap.Services[0].Counters
	if c["requests"] != 3*keys || c["not_hedgeable"] != 2*keys || c["hedges_sent"] < keys || c["duplicates_dropped"] < keys {
		t.Errorf("counters %v: want requests %d, not_hedgeable %d (the sets), hedges_sent and duplicates_dropped >= %d",
			c, 3*keys, 2*keys, keys)
	}
	t.Logf("srv1 cmd_set %d cmd_get %d; srv2 cmd_set %d cmd_get %d; kedge %v", s1["cmd_set"], s1["cmd_get"], s2["cmd_set"], s2["cmd_get"], c)
}
