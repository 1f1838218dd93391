package sg

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	isg "github.com/kedge-dev/kedge/internal/sg"
)

// TestLabMultiPacket: `kedge sg worker` processes on two lab hosts behind a bridge (MTU
// 1500) answer 256 x int64 (2 KiB): w1's four workers in the fewest datagrams that fit
// (--max-datagram 1452: 2 parts), w2's four in 5 parts of which each is lost with
// probability 0.2 (--part-loss). Every result is checked against the values each worker
// sent: the answered workers' whole vectors plus the slices of the parts that arrived from
// the workers in Result.Partial, for sum and max over IPv4 and IPv6. With need = w1's four
// the requests complete; with all they mostly time out, the lossy workers partial.
func TestLabMultiPacket(t *testing.T) {
	bpftest.RequireRoot(t)
	bin := bpftest.KedgeBinary(t)
	l, err := lab.Up(lab.Spec{Name: "sgmp", Fabric: lab.Bridge, Hosts: []string{"coord", "w1", "w2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	coord := l.Host("coord")
	const elems = 256
	for _, c := range []struct {
		name string
		v6   bool
		red  Reduction
	}{{"ipv4 sum", false, Sum}, {"ipv6 max", true, Max}} {
		t.Run(c.name, func(t *testing.T) {
			var workers []netip.AddrPort
			port := uint16(9300)
			if c.v6 {
				port = 9400
			}
			for i, h := range []*lab.Host{l.Host("w1"), l.Host("w2")} {
				addr := h.IPv4
				if c.v6 {
					addr = h.IPv6
				}
				extra := []string{"--elems", fmt.Sprint(elems), "--max-datagram", "1452"}
				if i == 1 {
					extra = []string{"--elems", fmt.Sprint(elems), "--parts", "5", "--part-loss", "0.2"}
				}
				startWorkers(t, bin, h, addr, port, 4, extra...)
				for k := range 4 {
					workers = append(workers, netip.AddrPortFrom(addr, port+uint16(k)))
				}
			}
			g, err := Open(Config{Interface: coord.Iface, Netns: coord.Path(), Workers: workers, Reduction: c.red,
				Type: Int64, Elems: elems, Timeout: time.Second, MultiPacket: true})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			partials := 0
			for k := range 24 {
				// w1's workers are lossless: with need 4 the request completes (the
				// timeout only bounds a starved machine); with need = all it mostly times
				// out, and the timeout is what each such request costs.
				opts := RequestOptions{Need: 4, Timeout: 2 * time.Second}
				if k%2 == 1 {
					opts.Need, opts.Timeout = len(workers), 600*time.Millisecond
				}
				res, err := g.ScatterWith(context.Background(), []byte("parts"), opts)
				if err != nil {
					t.Fatal(err)
				}
				if res.Count < 4 || opts.Need == 4 && res.Status != OK || res.Status == OK && res.Count < opts.Need {
					t.Fatalf("request %d: %s with %d answered %v, partial %+v", k, res.Status, res.Count, res.Answered, res.Partial)
				}
				partials += len(res.Partial)
				checkParts(t, c.red, elems, res)
			}
			st, err := g.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d workers partial over 24 requests; stats parts %d part_dups %d bad_parts %d", partials, st.Parts, st.PartDups, st.BadParts)
			if partials == 0 || st.Parts == 0 || st.BadParts+st.PartMismatch+st.Multipart+st.Malformed+st.Unregistered != 0 {
				t.Errorf("partial workers %d, stats %+v: want some partial lossy workers and no rejected parts", partials, st)
			}
		})
	}
}

// TestUncovered: a Min/Max aggregate with no worker answered in full keeps only the
// elements the arrived parts covered; the rest (the kernel's identity) reads 0.
func TestUncovered(t *testing.T) {
	v := []int64{1, 2, 1 << 62, 4, 5, 1 << 62, 1 << 62}
	uncovered(v, []PartialReply{{Worker: 0, NParts: 3, Parts: []int{0}}, {Worker: 1, NParts: 4, Parts: []int{2}}})
	// 7 elements: 3 parts of 3 (part 0: 0..2), 4 parts of 2 (part 2: 4..5).
	if want := []int64{1, 2, 1 << 62, 0, 5, 1 << 62, 0}; fmt.Sprint(v) != fmt.Sprint(want) {
		t.Fatalf("%v, want %v", v, want)
	}
}

// checkParts recomputes res.Values from what each worker sent: the answered workers'
// whole vectors and the arrived parts of the partial ones (max: an element nobody
// covered is 0).
func checkParts(t *testing.T, red Reduction, elems int, res Result) {
	t.Helper()
	want := make([]int64, elems)
	seen := make([]bool, elems)
	add := func(w, j int) {
		x := isg.ValueFor(uint16(w), res.ID, j)
		switch {
		case red == Sum:
			want[j] += x
		case !seen[j] || x > want[j]:
			want[j] = x
		}
		seen[j] = true
	}
	for _, w := range res.Answered {
		for j := range elems {
			add(w, j)
		}
	}
	for _, p := range res.Partial {
		for _, part := range p.Parts {
			off, n, ok := PartSlice(elems, p.NParts, part)
			if !ok {
				t.Fatalf("request %#x: worker %d part %d of %d", res.ID, p.Worker, part, p.NParts)
			}
			for j := off; j < off+n; j++ {
				add(p.Worker, j)
			}
		}
	}
	for j := range elems {
		if res.Values[j] != want[j] {
			t.Fatalf("request %#x (%s, answered %v, partial %+v) element %d: %d, want %d", res.ID, res.Status, res.Answered, res.Partial, j, res.Values[j], want[j])
		}
	}
}
