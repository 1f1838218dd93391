package hedge

// The dns preset with real dnsmasq replicas (the lab's srv1 serves, srv2 is its replica):
// while srv1 is paused (SIGSTOP) standard queries are hedged to srv2 and answered from there,
// an UPDATE waits for srv1; and a request-id spec that does not fit DNS (the generic 4 bytes,
// which take in the flags that differ in the response) is reported by Watch.

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// startDNSMasq runs dnsmasq on h (port 53 of h's address, answering kedge.test with
// 198.18.0.99, no cache, no upstream) until the test ends, and returns its process.
func startDNSMasq(t *testing.T, bin string, h *lab.Host) *os.Process {
	t.Helper()
	cmd := h.Command(bin, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--no-poll", "--bind-interfaces", "--listen-address="+h.IPv4.String(), "--port=53",
		"--address=/kedge.test/198.18.0.99", "--user=root", "--pid-file", "--cache-size=0")
	if err := h.Start(cmd); err != nil {
		t.Fatalf("start dnsmasq on %s: %v", h.HostName, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process
}

// dnsQuery is a standard query (RD set) for kedge.test A with id.
func dnsQuery(id uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	b = append(b, 5, 'k', 'e', 'd', 'g', 'e', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1)
	return b
}

func TestDNSPresetLab(t *testing.T) {
	l, bin := presetLab(t, "hdns", "dnsmasq", "dnsmasq-base")
	client, srv1, srv2 := l.Host("client"), l.Host("srv1"), l.Host("srv2")
	primary := startDNSMasq(t, bin, srv1)
	startDNSMasq(t, bin, srv2)
	// The answer count by response id.
	send, recv := presetConn(t, client, netip.AddrPortFrom(srv1.IPv4, 53), 12, func(b []byte) int { return int(binary.BigEndian.Uint16(b[6:])) })
	// dnsmasq takes a moment to bind (and the connected socket takes srv1's answers only).
	for deadline := time.Now().Add(10 * time.Second); ; {
		send(dnsQuery)
		if len(recv(1, 200*time.Millisecond)) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dnsmasq on srv1 does not answer")
		}
	}
	recv(100, 200*time.Millisecond) // drain

	svc := ServiceConfig{Name: "dns", Protocol: ProtocolDNS, Address: srv1.IPv4.String(), Replicas: []string{srv2.IPv4.String()},
		Delay: DelaySpec{Fixed: 5 * time.Millisecond}, Budget: BudgetSpec{Mode: BudgetWindow, Ratio: 1, Burst: 100}}
	h := startHedger(t, l, &Config{Interface: "eth0", Services: []ServiceConfig{svc}}, budgetTestBackend())

	// srv1 paused: queries are hedged to srv2, an UPDATE waits for srv1.
	const queries = 10
	if err := lab.Pause(primary.Pid); err != nil {
		t.Fatal(err)
	}
	asked := map[uint16]bool{}
	for range queries {
		asked[send(dnsQuery)] = true
	}
	got := recv(queries, 5*time.Second)
	for rid, answers := range got {
		if !asked[rid] || answers != 1 {
			t.Errorf("response %d with %d answers while srv1 is paused: want the queries answered by srv2", rid, answers)
		}
	}
	if len(got) != queries {
		t.Errorf("queries with srv1 paused: %d of %d answered (by hedges to srv2)", len(got), queries)
	}
	update := send(func(id uint16) []byte { return dnsMsg(id, 5<<3) })
	if early := recv(1, 200*time.Millisecond); len(early) != 0 {
		t.Errorf("responses while srv1 is paused: %v (the UPDATE went to srv2)", early)
	}
	if err := lab.Resume(primary.Pid); err != nil {
		t.Fatal(err)
	}
	got = recv(2, 2*time.Second)
	if _, ok := got[update]; !ok || len(got) != 1 {
		t.Errorf("after srv1's pause: responses %v, want only the UPDATE's (the queries' second responses dropped)", got)
	}
	snap, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	c := snap.Services[0].Counters
	if c["not_hedgeable"] != 1 || c["hedges_sent"] < queries || c["duplicates_dropped"] < queries {
		t.Errorf("counters %v: want not_hedgeable 1 (the UPDATE), hedges_sent and duplicates_dropped >= %d", c, queries)
	}
	if w := snap.Services[0].Warning; w != "" {
		t.Errorf("warning %q with the dns preset", w)
	}

	// The generic 4-byte id on DNS: no response matches its request; Watch says so.
	svc.Protocol, svc.RequestID, svc.Address, svc.Replicas = ProtocolGeneric, RequestIDSpec{Length: 4},
		netip.AddrPortFrom(srv1.IPv4, 53).String(), []string{netip.AddrPortFrom(srv2.IPv4, 53).String()}
	if err := h.Update(&Config{Interface: "eth0", Services: []ServiceConfig{svc}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		h.Watch(ctx, 300*time.Millisecond)
	}()
	defer func() { cancel(); <-watched }()
	var warning string
	for deadline := time.Now().Add(15 * time.Second); warning == "" && time.Now().Before(deadline); {
		for range 5 {
			send(dnsQuery)
		}
		recv(100, 50*time.Millisecond)
		snap, err := h.Stats()
		if err != nil {
			t.Fatal(err)
		}
		warning = snap.Services[0].Warning
	}
	if warning == "" {
		t.Fatal("no warning for a 4-byte request id on DNS")
	}
	t.Logf("warning: %s", warning)
}
