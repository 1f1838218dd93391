package offload

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
)

// Attaching in a lab namespace: the program goes on the interface that holds the raft
// address (generic XDP on a veth); a second follower on the same interface is refused (one
// XDP program per interface), and closing detaches.
func TestAttachInNamespace(t *testing.T) {
	bpftest.RequireRoot(t)
	if err := Probe(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	l, err := lab.Up(lab.Spec{Name: "rxat", Fabric: lab.Router, Hosts: []string{"h1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	h := l.Host("h1")
	opts := FollowerOptions{ClusterID: 1, Self: 1, RaftAddr: netip.AddrPortFrom(h.IPv4, 7000), Netns: h.Handle, AliveFor: time.Second}
	f, err := NewFollower(opts)
	if err != nil {
		t.Fatal(err)
	}
	if f.Interface() != h.Iface || f.Mode() != "xdp-generic" {
		t.Errorf("attached to %s in mode %s, want %s in xdp-generic (a veth)", f.Interface(), f.Mode(), h.Iface)
	}
	in, err := Inspect(h.Handle, h.Iface)
	if err != nil {
		t.Fatal(err)
	}
	opts.RaftAddr = netip.AddrPortFrom(h.IPv4, 7001)
	if g, err := NewFollower(opts); err == nil {
		g.Close()
		t.Error("a second follower program attached to the same interface")
	} else {
		t.Logf("second follower on %s: %v", h.Iface, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Inspect(h.Handle, h.Iface); err == nil {
		t.Errorf("program %d still attached after Close", in.ProgID)
	}
	opts.RaftAddr = netip.MustParseAddrPort("127.0.0.1:7000")
	if _, err := NewFollower(opts); err == nil {
		t.Error("a follower on loopback")
	}
}
