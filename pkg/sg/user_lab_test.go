package sg

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	isg "github.com/kedge-dev/kedge/internal/sg"
)

// topkObject is the example user reduction (bpf/sg/user/topk.bpf.c), as make generate
// builds it.
const topkObject = "../../internal/sg/testdata/topk_bpfel.o"

// TestLabUserReduction: the example top-K user reduction over real `kedge sg worker`
// processes on two lab hosts, the workers of one answering their generated values and the
// other's a constant vector that interleaves with them: many goroutines' results through
// the API and the CLI's (`kedge sg scatter --reduction user -o json`, int32) are the K
// largest of what the answered workers sent; an object that is not a reduction is refused
// by the CLI with what to do.
func TestLabUserReduction(t *testing.T) {
	bpftest.RequireRoot(t)
	bin := bpftest.KedgeBinary(t)
	l, err := lab.Up(lab.Spec{Name: "sgu", Fabric: lab.Bridge, Hosts: []string{"coord", "w1", "w2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	coord, w1, w2 := l.Host("coord"), l.Host("w1"), l.Host("w2")
	port := uint16(9500)
	// Workers 0-2 on w1 answer isg.ValueFor (worker w: w*1000 + j + id mod 997), workers
	// 3-5 on w2 each a constant vector of its own that falls between and below those.
	constant := func(w, j int) int64 {
		base := []int64{1500, 2600, -7, 2001, 999, 3000, 1200, 2500}
		return base[j] + int64(w-3)*150
	}
	workers := func(t *testing.T, typ string, k int) []netip.AddrPort {
		port += 10
		args := []string{"--type", typ, "--elems", fmt.Sprint(k)}
		startWorkers(t, bin, w1, w1.IPv4, port, 3, args...)
		ws := []netip.AddrPort{}
		for i := range 3 {
			ws = append(ws, netip.AddrPortFrom(w1.IPv4, port+uint16(i)))
		}
		for i := range 3 {
			var vals []string
			for j := range k {
				vals = append(vals, fmt.Sprint(constant(3+i, j)))
			}
			startWorkers(t, bin, w2, w2.IPv4, port+uint16(i), 1, append(args, "--values="+strings.Join(vals, ","))...)
			ws = append(ws, netip.AddrPortFrom(w2.IPv4, port+uint16(i)))
		}
		return ws
	}
	// want is the top k of what the answered workers of res sent.
	want := func(res Result, k int) []int64 {
		var all []int64
		for _, w := range res.Answered {
			for j := range k {
				if w < 3 {
					all = append(all, isg.ValueFor(uint16(w), res.ID, j))
				} else {
					all = append(all, constant(w, j))
				}
			}
		}
		slices.Sort(all)
		slices.Reverse(all)
		return all[:k]
	}

	t.Run("int64 from many goroutines", func(t *testing.T) {
		const k = 8
		ws := workers(t, "int64", k)
		g, err := Open(Config{Interface: coord.Iface, Netns: coord.Path(), Workers: ws, Reduction: User,
			UserReduction: UserReduction{Object: topkObject}, Type: Int64, Elems: k, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		var wg sync.WaitGroup
		errs := make(chan error, 8*10)
		for range 8 {
			wg.Go(func() {
				for range 10 {
					res, err := g.Scatter(context.Background(), []byte("topk"))
					switch {
					case err != nil:
						errs <- err
					case res.Status != OK || res.Count != len(ws):
						errs <- fmt.Errorf("request %#x: %v, %d of %d answered", res.ID, res.Status, res.Count, len(ws))
					case !slices.Equal(res.Values, want(res, k)):
						errs <- fmt.Errorf("request %#x: top %d %v, want %v", res.ID, k, res.Values, want(res, k))
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.Completed != 80 || st.UserErrors != 0 || st.UserRefused != 0 {
			t.Fatalf("stats: completed %d, user errors %d, refused %d; want 80, 0, 0", st.Completed, st.UserErrors, st.UserRefused)
		}
	})

	t.Run("int32 through kedge sg scatter", func(t *testing.T) {
		const k = 5
		ws := workers(t, "int32", k)
		var list []string
		for _, w := range ws {
			list = append(list, w.String())
		}
		out, err := exec.Command(bin, "sg", "scatter", "--netns", coord.Path(), "-i", coord.Iface,
			"--workers", strings.Join(list, ","), "--timeout", "2s", "--count", "5", "-o", "json",
			"--reduction", "user", "--user-object", topkObject, "--type", "int32", "--elems", fmt.Sprint(k)).Output()
		if err != nil {
			t.Fatalf("kedge sg scatter: %v (%s)", err, out)
		}
		var rep struct{ Results []Result }
		if err := json.Unmarshal(out, &rep); err != nil || len(rep.Results) != 5 {
			t.Fatalf("kedge sg scatter -o json: %v, %d results\n%s", err, len(rep.Results), out)
		}
		for _, res := range rep.Results {
			if res.Status != OK || res.Count != len(ws) || !slices.Equal(res.Values, want(res, k)) {
				t.Errorf("request %#x: %v, %d answered, top %d %v, want %v", res.ID, res.Status, res.Count, k, res.Values, want(res, k))
			}
		}
	})

	t.Run("not a reduction", func(t *testing.T) {
		out, err := exec.Command(bin, "sg", "scatter", "--netns", coord.Path(), "-i", coord.Iface,
			"--workers", netip.AddrPortFrom(w1.IPv4, 9000).String(), "--reduction", "user",
			"--user-object", "../../internal/sg/sg_bpfel.o").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "no sg_user_abi") || !strings.Contains(string(out), "clang-19 -target bpf") {
			t.Fatalf("kedge sg scatter with kedge's own object as the reduction: %v\n%s", err, out)
		}
		out, err = exec.Command(bin, "sg", "scatter", "-i", "lo", "--workers", "127.0.0.1:9000", "--reduction", "user").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--user-object") {
			t.Fatalf("kedge sg scatter --reduction user without its object: %v\n%s", err, out)
		}
	})
}
