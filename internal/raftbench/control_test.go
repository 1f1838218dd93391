package raftbench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink/nl"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
)

func TestMain(m *testing.M) {
	code := m.Run()
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}

// TestXDPPassConcurrent: the xdp-pass control is a user-space cluster with an XDP_PASS
// program in generic mode on every node's interface (freed when the cluster closes), and
// --tp-concurrent runs the writers of every mode at once: each run counts its own cluster's
// writes and node CPU, and leaves the machine's figures out.
func TestXDPPassConcurrent(t *testing.T) {
	bpftest.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := &Options{Binary: bpftest.KedgeBinary(t), Dir: t.TempDir(), Tick: 10 * time.Millisecond, Clients: 4,
		Modes: []string{ModeXDPPass, ModeOff}, ThroughputRounds: 1, ThroughputDuration: time.Second, Concurrent: true,
		Log: t.Logf}
	cs, closeAll, err := o.clusters(ctx, "rbx", 3, 10)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			closeAll()
		}
	}()
	var progs []ebpf.ProgramID
	for mode, c := range cs {
		for _, n := range c.Nodes {
			h, err := bpfx.NetlinkHandle(n.Host.Handle)
			if err != nil {
				t.Fatal(err)
			}
			l, err := h.LinkByName(n.Host.Iface)
			h.Close()
			if err != nil {
				t.Fatal(err)
			}
			x := l.Attrs().Xdp
			attached := x != nil && x.Attached
			if attached != (mode == ModeXDPPass) {
				t.Fatalf("offload %s, node %d: XDP attached %v", mode, n.ID, attached)
			}
			if attached {
				if x.AttachMode != nl.XDP_ATTACHED_SKB {
					t.Errorf("node %d: XDP attach mode %d, want generic (skb)", n.ID, x.AttachMode)
				}
				progs = append(progs, ebpf.ProgramID(x.ProgId))
			}
		}
	}
	runs, err := o.writeRuns(ctx, cs, 3, o.Modes, RouteLeader, o.ThroughputDuration)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.Writes == 0 || r.NodeCPUUs <= 0 || !r.Concurrent || r.MachineCPUUs != 0 || r.Errors != 0 {
			t.Errorf("offload %s: %d writes, %d errors, node CPU %.0f us/write, machine %.0f, concurrent %v: want writes, no errors, node CPU, no machine figure",
				r.Offload, r.Writes, r.Errors, r.NodeCPUUs, r.MachineCPUUs, r.Concurrent)
		}
	}
	closed = true
	if err := closeAll(); err != nil {
		t.Fatal(err)
	}
	for _, id := range progs {
		if p, err := ebpf.NewProgramFromID(id); err == nil {
			p.Close()
			t.Errorf("XDP_PASS program %d still loaded after the cluster closed", id)
		}
	}
}
