package sg

// BPF_PROG_TEST_RUN fixtures for user reductions (bpf/include/sg_user.h): the example top-K
// (bpf/sg/user/topk.bpf.c, built by make generate) loaded into the gather path and run
// through sg_gather, with the policy for malformed, truncated, duplicate, stale and late
// replies; objects that must be refused.

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

const topkObject = "testdata/topk_bpfel.o"

// topK is what the example computes: the k largest of vs, largest first.
func topK(k int, vs ...[]int64) []int64 {
	var all []int64
	for _, v := range vs {
		all = append(all, v...)
	}
	slices.Sort(all)
	slices.Reverse(all)
	return all[:k]
}

func newUserFixture(t *testing.T, typ uint8, elems uint16) *fixture {
	t.Helper()
	f := newFixture(t, 1, coord4, w4, RedUser, typ, elems, 0)
	if err := f.o.LoadUserReduction(1, UserReduction{Object: topkObject}); err != nil {
		var le *bpfx.LoadError
		if errors.As(err, &le) {
			t.Log(le.Full())
		}
		t.Fatalf("load the top-K reduction: %v", err)
	}
	return f
}

func TestUserReductionTopK(t *testing.T) {
	f := newUserFixture(t, TypeI64, 4)
	id := uint64(3)<<10 | 66
	f.arm(t, 1, id, 3)
	v0, v1, v2 := []int64{5, -7, 40, 12}, []int64{-1, 41, 3, 12}, []int64{-100, 2, 39, 6}
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	r.Run(t, []bpftest.Case{
		{Name: "first reply reduced", In: reply(w4[0], coord4, 1, 0, id, vec64(v0...), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
		{Name: "duplicate dropped", In: reply(w4[0], coord4, 1, 0, id, vec64(100, 100, 100, 100), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Duplicates": 1}},
		{Name: "stale id dropped", In: reply(w4[1], coord4, 1, 1, id+1<<10, vec64(100, 100, 100, 100), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Stale": 1}},
		{Name: "worker error dropped", In: reply(w4[1], coord4, 1, 1, id, vec64(100, 100, 100, 100), func(h *Header) { h.Status = 2 }),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.WorkerErrors": 1}},
		{Name: "short vector passed", In: reply(w4[1], coord4, 1, 1, id, vec64(100, 100, 100), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.BadLength": 1}},
		{Name: "multi-packet passed", In: reply(w4[1], coord4, 1, 1, id, vec64(100, 100, 100, 100), func(h *Header) { h.NParts = 2 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Multipart": 1}},
		{Name: "unregistered source passed", In: reply(netip.AddrPortFrom(w4[1].Addr(), 1), coord4, 1, 1, id, vec64(100, 100, 100, 100), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "oversized payload length passed", In: reply(w4[1], coord4, 1, 1, id, vec64(100, 100, 100, 100), func(h *Header) { h.PayloadLen = 4000 }),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "frame truncated inside the vector passed", In: pktbuild.Truncate(reply(w4[1], coord4, 1, 1, id, vec64(100, 100, 100, 100), nil), 42+32+20),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"16.Malformed": 1}},
		{Name: "second reply reduced", In: reply(w4[1], coord4, 1, 1, id, vec64(v1...), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
	})
	f.noResult(t)
	r.Run(t, []bpftest.Case{{Name: "third reply completes", In: reply(w4[2], coord4, 1, 2, id, vec64(v2...), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}}})
	res := f.result(t)
	want := topK(4, v0, v1, v2)
	if res.ReqId != id || res.Status != StatusOK || res.Count != 3 || res.Bitmap[0] != 0b111 || !slices.Equal(res.Agg[:4], want) {
		t.Fatalf("result id %d status %d count %d bitmap %b top-4 %v, want %v", res.ReqId, res.Status, res.Count, res.Bitmap[0], res.Agg[:4], want)
	}
	r.Run(t, []bpftest.Case{{Name: "late reply dropped", In: reply(w4[2], coord4, 1, 2, id, vec64(v2...), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Late": 1}}})
	f.noResult(t)

	// The program run other than by the gather (nothing handed on) drops and counts.
	if len(f.o.user) != 1 {
		t.Fatalf("%d user programs loaded, want 1", len(f.o.user))
	}
	direct := bpftest.Runner{Prog: f.o.user[0], Counters: f.counters}
	direct.Run(t, []bpftest.Case{{Name: "run directly: dropped", In: reply(w4[0], coord4, 1, 0, id, vec64(v0...), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"16.UserErrors": 1}}})
}

// TestUserReductionInt32Refused: int32 vectors (sign-extended), a K the example refuses
// (counted, the worker not answered), and a group whose program is missing.
func TestUserReductionInt32Refused(t *testing.T) {
	f := newUserFixture(t, TypeI32, 3)
	id := uint64(5)<<10 | 67
	f.arm(t, 1, id, 2)
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	v0, v1 := []int64{-3, -9, -1}, []int64{-2, -8, -30}
	r.Run(t, []bpftest.Case{
		{Name: "first", In: reply(w4[0], coord4, 1, 0, id, vec32(v0...), nil), WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
		{Name: "second completes", In: reply(w4[1], coord4, 1, 1, id, vec32(v1...), nil), WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}},
	})
	res := f.result(t)
	if want := topK(3, v0, v1); res.Count != 2 || !slices.Equal(res.Agg[:3], want) {
		t.Fatalf("count %d top-3 %v, want %v", res.Count, res.Agg[:3], want)
	}

	// K = 9 is more than the example takes (TOPK_MAX 8): refused, the worker not answered.
	f.addGroup(t, 2, coord4, w4, RedUser, TypeI32, 9, 0)
	if err := f.o.LoadUserReduction(2, UserReduction{Object: topkObject, Program: "sg_topk"}); err != nil {
		t.Fatal(err)
	}
	id2 := uint64(5)<<10 | 130 // group 2's slots: [128, 192)
	f.arm(t, 2, id2, 1)
	big := make([]int64, 9)
	r.Run(t, []bpftest.Case{{Name: "K above the example's limit refused", In: reply(w4[0], coord4, 2, 0, id2, vec32(big...), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"2.UserRefused": 1}}})
	if s := f.slot(t, id2); s.Res.Count != 0 || s.Res.Bitmap[0] != 0 || s.State != SlotPending {
		t.Fatalf("refused reply answered: count %d bitmap %b state %d", s.Res.Count, s.Res.Bitmap[0], s.State)
	}

	// A group of reduction user with no program: dropped, counted.
	f.addGroup(t, 3, coord4, w4, RedUser, TypeI64, 2, 0)
	id3 := uint64(5)<<10 | 200
	f.arm(t, 3, id3, 1)
	r.Run(t, []bpftest.Case{{Name: "no program for the group", In: reply(w4[0], coord4, 3, 0, id3, vec64(1, 2), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"3.UserErrors": 1}}})
	f.noResult(t)
}

// TestUserReductionRejected: objects that are not user reductions of this kedge, or that
// the verifier rejects, are refused with an error that says why.
func TestUserReductionRejected(t *testing.T) {
	bpftest.RequireRoot(t)
	o, err := Load(LoadOptions{Tier: DetectTier()})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	dir := t.TempDir()
	whole, err := os.ReadFile(topkObject)
	if err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(dir, "truncated.o")
	if err := os.WriteFile(truncated, whole[:len(whole)/3], 0o644); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(dir, "sg.o") // kedge's own data plane (embedded: guests have no sg_bpfel.o)
	if err := os.WriteFile(own, _SgBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		u    UserReduction
		want []string
	}{
		{"no such file", UserReduction{Object: filepath.Join(dir, "missing.o")}, []string{"read user reduction", "no such file", "clang-19 -target bpf"}},
		{"truncated object", UserReduction{Object: truncated}, []string{"read user reduction", "clang-19 -target bpf"}},
		{"kedge's own object", UserReduction{Object: own}, []string{"no sg_user_abi", "SG_USER_REDUCTION"}},
		{"no such program", UserReduction{Object: topkObject, Program: "nope"}, []string{`no program "nope"`, "sg_topk"}},
		{"wrong program type", UserReduction{Object: "testdata/user_bad_bpfel.o", Program: "sg_not_xdp"}, []string{"is a SchedCLS program", "SG_USER_REDUCTION"}},
		{"verifier rejects it", UserReduction{Object: "testdata/user_bad_bpfel.o"}, []string{"load user reduction sg_unchecked: verifier rejected the program", "invalid access to packet", "-v for the full verifier log"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := o.LoadUserReduction(1, c.u)
			if err == nil {
				t.Fatal("loaded")
			}
			t.Log(err)
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			var le *bpfx.LoadError
			if c.name == "verifier rejects it" && (!errors.As(err, &le) || !strings.Contains(le.Full(), "invalid access to packet")) {
				t.Errorf("no *bpfx.LoadError with the full log: %v", err)
			}
		})
	}
	if len(o.user) != 0 {
		t.Fatalf("%d programs kept from refused objects", len(o.user))
	}
}
