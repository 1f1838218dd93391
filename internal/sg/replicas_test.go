package sg

// BPF_PROG_TEST_RUN fixtures for shards with replicas (GroupFlagReplicas, bpf/sg/replica.h):
// which replica each copy goes to (round robin by request), the judgement that ejects a
// replica whose copy went unanswered and the back-off that doubles, a shard whose every
// replica is out, and replies from any replica of a shard answering for it.

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// Shards of group 1 in these fixtures: shard i's first replica is w4[i] (the workers map's
// entry), the further ones are these.
var shards4 = [][]netip.AddrPort{
	{w4[0]},
	{w4[1], netip.MustParseAddrPort("198.51.100.21:9101")},
	{w4[2], netip.MustParseAddrPort("198.51.100.22:9102"), netip.MustParseAddrPort("198.51.100.32:9202")},
}

// replicaMAC is the MAC the fixtures give replica r of shard i.
func replicaMAC(i, r int) [6]byte { return [6]byte{2, 0, 0, 0, byte(r), byte(0x10 + i)} }

// setReplicas makes group gid's workers shards with the given replicas (shards[i][0] must
// be worker i), judged after judge and ejected for base, doubling up to maxBackoff.
func (f *fixture) setReplicas(t testing.TB, gid uint32, shards [][]netip.AddrPort, judge, base, maxBackoff time.Duration) {
	t.Helper()
	var g GroupCfg
	if err := f.o.Groups.Lookup(gid, &g); err != nil {
		t.Fatal(err)
	}
	g.Flags |= GroupFlagReplicas
	g.ReplicaBase = 0
	g.JudgeNs, g.EjectBaseNs, g.EjectMaxNs = uint64(judge), uint64(base), uint64(maxBackoff)
	if err := f.o.Groups.Put(gid, &g); err != nil {
		t.Fatal(err)
	}
	for i, reps := range shards {
		sh := ShardRec{Nreplicas: uint32(len(reps))}
		for r, a := range reps {
			key := gid*WorkersMax + uint32(i)
			if r > 0 {
				key = ReplicaKey(uint32(i), r)
			}
			wc := WorkerCfg{Port: swap16(a.Port()), Mac: replicaMAC(i, r)}
			wc.Addr.In6U.U6Addr8 = mapped(a.Addr())
			if err := f.o.Workers.Put(key, &wc); err != nil {
				t.Fatal(err)
			}
			sh.Key[r] = key
		}
		if err := f.o.Replicas.Put(uint32(i), &sh); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fixture) shard(t testing.TB, i uint32) ShardRec {
	t.Helper()
	var sh ShardRec
	if err := f.o.Replicas.Lookup(i, &sh); err != nil {
		t.Fatal(err)
	}
	return sh
}

// copyDest is where a captured IPv4 copy goes: its address, port, MAC and worker index,
// after checking its checksums.
func copyDest(t *testing.T, frame []byte) (netip.AddrPort, [6]byte, uint16) {
	t.Helper()
	if err := pktbuild.VerifyChecksums(frame); err != nil {
		t.Errorf("copy: %v", err)
	}
	h, _, err := ParseHeader(frame[42:])
	if err != nil {
		t.Fatalf("copy: %v", err)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(frame[30:34])), binary.BigEndian.Uint16(frame[36:])), [6]byte(frame[:6]), h.Worker
}

// TestScatterReplicas: request seq (id = seq<<10 | slot) sends shard i's copy to replica
// (seq + i) mod n; each copy carries the shard's worker index, its replica's address, port
// and MAC, and valid checksums; the replica's unanswered time is noted.
func TestScatterReplicas(t *testing.T) {
	f, s, _ := scatterFixtureWith(t, coord4, w4, LoadOptions{ReplicaEntries: 3, FixClock: true})
	f.setReplicas(t, 1, shards4, 10*time.Millisecond, time.Second, 4*time.Second)
	now := bpftest.ClockStart
	for k, seq := range []uint64{5, 6, 7, 8} {
		id := seq<<10 | uint64(80+k)
		if err := f.o.Clock.Set(now); err != nil {
			t.Fatal(err)
		}
		var res bpftest.Result
		err := s.ns.Do(func() (err error) {
			res, err = bpftest.Run(f.o.Scatter, request(coord4, w4[0], 1, id, []byte("payload")))
			return err
		})
		if err != nil || res.Ret != bpftest.TCActShot {
			t.Fatalf("seq %d: verdict %d, %v", seq, int32(res.Ret), err)
		}
		got := s.capture(t, len(shards4))
		if len(got) != len(shards4) {
			t.Fatalf("seq %d: captured %d copies, want %d", seq, len(got), len(shards4))
		}
		for i, frame := range got {
			dst, mac, worker := copyDest(t, frame)
			r := int((seq + uint64(i)) % uint64(len(shards4[i])))
			if dst != shards4[i][r] || mac != replicaMAC(i, r) || int(worker) != i {
				t.Errorf("seq %d copy %d: to %v mac %x worker %d; want replica %d of shard %d (%v)", seq, i, dst, mac, worker, r, i, shards4[i][r])
			}
		}
	}
	// Nobody answered: each replica that got a copy notes the first one's time (a shard of
	// one replica is never judged: nothing to note).
	for i, reps := range shards4[1:] {
		sh := f.shard(t, uint32(i+1))
		for r := range reps {
			if sh.UnansweredNs[r] != now {
				t.Errorf("shard %d replica %d: unanswered since %d, want %d", i+1, r, sh.UnansweredNs[r], now)
			}
		}
	}
}

// TestReplicaJudgement: one shard of three replicas (a, b, c), judged after 10 ms, ejected
// for 1 s doubling up to 4 s. A replica whose copy is unanswered 10 ms later is ejected
// when it is next a candidate and the copy goes to the next replica; a reply clears a
// replica; a replica back from its back-off that leaves one more copy unanswered is out for
// twice as long; with all three out, the copy still goes to the round robin's pick.
func TestReplicaJudgement(t *testing.T) {
	a, b, c := w4[0], netip.MustParseAddrPort("198.51.100.21:9101"), netip.MustParseAddrPort("198.51.100.31:9201")
	shard := [][]netip.AddrPort{{a, b, c}}
	f, s, _ := scatterFixtureWith(t, coord4, w4[:1], LoadOptions{ReplicaEntries: 1, FixClock: true})
	f.setReplicas(t, 1, shard, 10*time.Millisecond, time.Second, 4*time.Second)
	const ms = uint64(time.Millisecond)
	t0 := bpftest.ClockStart
	slot := uint64(90)
	// send runs request seq at time at and returns the replica its copy went to.
	send := func(name string, seq, at uint64, want bpftest.Counters) netip.AddrPort {
		t.Helper()
		slot++
		id := seq<<10 | slot
		r := bpftest.Runner{Prog: f.o.Scatter, Counters: f.counters, Clock: f.o.Clock, Within: s.ns.Do}
		want["1.Requests"], want["1.Copies"] = 1, 1
		r.RunCase(t, bpftest.Case{Name: name, In: request(coord4, a, 1, id, []byte("payload")), Now: at,
			WantRet: bpftest.TCActShot, WantCounters: want})
		got := s.capture(t, 1)
		if len(got) != 1 {
			t.Fatalf("%s: captured %d copies", name, len(got))
		}
		dst, _, _ := copyDest(t, got[0])
		return dst
	}
	answer := func(name string, from netip.AddrPort, seq uint64) {
		t.Helper()
		id := seq<<10 | slot
		r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
		r.RunCase(t, bpftest.Case{Name: name, In: reply(from, coord4, 1, 0, id, vec64(1), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}})
		f.result(t)
	}
	expect := func(got, want netip.AddrPort, what string) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: copy went to %v, want %v", what, got, want)
		}
	}

	expect(send("seq 0 to a", 0, t0, bpftest.Counters{}), a, "seq 0")
	expect(send("seq 1 to b", 1, t0+1*ms, bpftest.Counters{}), b, "seq 1")
	answer("b answers seq 1", b, 1)
	if sh := f.shard(t, 0); sh.UnansweredNs[0] != t0 || sh.UnansweredNs[1] != 0 {
		t.Fatalf("after b's reply: unanswered %v, want [%d 0 ...]", sh.UnansweredNs, t0)
	}
	// seq 3 starts at a, unanswered for 9 ms: not yet judged.
	expect(send("seq 3 to a, 9 ms unanswered", 3, t0+9*ms, bpftest.Counters{}), a, "seq 3")
	// seq 6 starts at a again, now 10 ms: ejected for 1 s, and b gets the copy.
	expect(send("seq 6: a ejected, to b", 6, t0+10*ms, bpftest.Counters{"1.Ejections": 1}), b, "seq 6")
	sh := f.shard(t, 0)
	if sh.OutUntilNs[0] != t0+10*ms+1000*ms || sh.Level[0] != 1 || sh.UnansweredNs[0] != 0 {
		t.Fatalf("a after its ejection: out until %d level %d unanswered %d; want %d, 1, 0", sh.OutUntilNs[0], sh.Level[0], sh.UnansweredNs[0], t0+1010*ms)
	}
	answer("b answers seq 6", b, 6)
	// seq 9 starts at a (out): b.
	expect(send("seq 9: a out, to b", 9, t0+20*ms, bpftest.Counters{}), b, "seq 9")
	answer("b answers seq 9", b, 9)
	// seq 11 starts at c: never sent, in.
	expect(send("seq 11 to c", 11, t0+21*ms, bpftest.Counters{}), c, "seq 11")
	// Back from its back-off, a gets seq 12 and leaves it unanswered: out for 2 s.
	back := t0 + 1010*ms
	expect(send("seq 12 to a, back", 12, back, bpftest.Counters{}), a, "seq 12")
	expect(send("seq 15: a ejected again, c too; to b", 15, back+10*ms, bpftest.Counters{"1.Ejections": 1}), b, "seq 15")
	sh = f.shard(t, 0)
	if sh.OutUntilNs[0] != back+10*ms+2000*ms || sh.Level[0] != 2 {
		t.Fatalf("a after its second ejection: out until %d level %d; want %d, 2", sh.OutUntilNs[0], sh.Level[0], back+2010*ms)
	}
	// c's copy of seq 11 is still unanswered: judged at seq 17 (it starts at c), ejected,
	// and a is out: b.
	expect(send("seq 17: c ejected, a out; to b", 17, back+11*ms, bpftest.Counters{"1.Ejections": 1}), b, "seq 17")
	// b leaves seq 15 unanswered: 20 ms on, every replica is out and the copy goes to the
	// round robin's pick anyway (18 mod 3 = 0: a).
	expect(send("seq 18: b ejected, all out", 18, back+30*ms, bpftest.Counters{"1.Ejections": 1, "1.ShardOut": 1}), a, "seq 18")
	// A reply from a (to seq 12, still pending) shows it alive: its level is reset.
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	r.RunCase(t, bpftest.Case{Name: "a answers seq 12", In: reply(a, coord4, 1, 0, 12<<10|97, vec64(1), nil),
		WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}})
	f.result(t)
	if sh := f.shard(t, 0); sh.Level[0] != 0 || sh.UnansweredNs[0] != 0 || sh.Level[1] != 1 || sh.Level[2] != 1 {
		t.Fatalf("after a's reply: levels %v unanswered %v; want a cleared, b and c at level 1", sh.Level, sh.UnansweredNs)
	}
}

// TestGatherReplicas: a reply from any replica of a shard answers for it; one from another
// shard's replica, or from an address no shard has, naming the shard is unregistered.
func TestGatherReplicas(t *testing.T) {
	bpftest.RequireRoot(t)
	f := newFixtureWith(t, LoadOptions{Tier: DetectTier(), ReplicaEntries: 3}, 1, coord4, w4, RedSum, TypeI64, 1, 0)
	f.setReplicas(t, 1, shards4, 10*time.Millisecond, time.Second, 4*time.Second)
	id := uint64(3)<<10 | 65
	f.arm(t, 1, id, 3)
	stranger := netip.MustParseAddrPort("198.51.100.99:9000")
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters}
	r.Run(t, []bpftest.Case{
		{Name: "shard 1's second replica", In: reply(shards4[1][1], coord4, 1, 1, id, vec64(10), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
		{Name: "shard 1's first replica: a duplicate", In: reply(shards4[1][0], coord4, 1, 1, id, vec64(10), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Duplicates": 1}},
		{Name: "shard 2's replica naming shard 1", In: reply(shards4[2][2], coord4, 1, 1, id, vec64(10), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "no shard's address", In: reply(stranger, coord4, 1, 2, id, vec64(10), nil),
			WantRet: bpftest.XDPPass, WantCounters: bpftest.Counters{"1.Unregistered": 1}},
		{Name: "shard 2's third replica", In: reply(shards4[2][2], coord4, 1, 2, id, vec64(100), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1}},
		{Name: "shard 0, one replica", In: reply(shards4[0][0], coord4, 1, 0, id, vec64(1000), nil),
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}},
	})
	res := f.result(t)
	if res.Count != 3 || res.Bitmap[0] != 0b111 || res.Agg[0] != 1110 {
		t.Fatalf("result: count %d bitmap %b sum %d; want 3, 111, 1110", res.Count, res.Bitmap[0], res.Agg[0])
	}
}

// TestReplicaLatency: with ChoiceLatency the copy goes to the replica not ejected with the
// lowest estimated median reply time, one without an estimate first; every reply from a
// replica, late ones too, steps its estimate (a first sample sets it).
func TestReplicaLatency(t *testing.T) {
	a, b, c := w4[0], netip.MustParseAddrPort("198.51.100.21:9101"), netip.MustParseAddrPort("198.51.100.31:9201")
	f, s, _ := scatterFixtureWith(t, coord4, w4[:1], LoadOptions{ReplicaEntries: 1, FixClock: true})
	f.setReplicas(t, 1, [][]netip.AddrPort{{a, b, c}}, 0, time.Second, 4*time.Second) // judge 0: never ejects by itself
	var g GroupCfg
	if err := f.o.Groups.Lookup(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	g.ReplicaChoice = ChoiceLatency
	if err := f.o.Groups.Put(uint32(1), &g); err != nil {
		t.Fatal(err)
	}
	const ms = uint64(time.Millisecond)
	now := bpftest.ClockStart
	setShard := func(mod func(*ShardRec)) {
		t.Helper()
		sh := f.shard(t, 0)
		mod(&sh)
		if err := f.o.Replicas.Put(uint32(0), &sh); err != nil {
			t.Fatal(err)
		}
	}
	slot := uint64(100)
	send := func(seq uint64) netip.AddrPort {
		t.Helper()
		slot++
		r := bpftest.Runner{Prog: f.o.Scatter, Counters: f.counters, Clock: f.o.Clock, Within: s.ns.Do}
		r.RunCase(t, bpftest.Case{Name: fmt.Sprintf("seq %d", seq), In: request(coord4, a, 1, seq<<10|slot, []byte("payload")), Now: now,
			WantRet: bpftest.TCActShot, WantCounters: bpftest.Counters{"1.Requests": 1, "1.Copies": 1}})
		got := s.capture(t, 1)
		if len(got) != 1 {
			t.Fatalf("seq %d: captured %d copies", seq, len(got))
		}
		dst, _, _ := copyDest(t, got[0])
		return dst
	}
	setShard(func(sh *ShardRec) { sh.P50Ns = [4]uint64{5 * ms, 1 * ms, 0, 0} })
	for seq := range uint64(3) { // the round robin's start does not matter
		if got := send(seq); got != c {
			t.Fatalf("seq %d: to %v, want c (no estimate yet)", seq, got)
		}
	}
	setShard(func(sh *ShardRec) { sh.P50Ns[2] = 3 * ms })
	if got := send(3); got != b {
		t.Fatalf("to %v, want b (1 ms)", got)
	}
	setShard(func(sh *ShardRec) { sh.OutUntilNs[1] = now + ms })
	if got := send(4); got != c {
		t.Fatalf("b ejected: to %v, want c (3 ms)", got)
	}

	// Replies step the estimate of the replica they come from: request sent 2 ms before.
	id := uint64(9)<<10 | 120
	f.arm(t, 1, id, 1)
	sl := f.slot(t, id)
	sl.Res.StartNs = now - 2*ms
	if err := f.o.Slots.Put(uint32(id&SlotMask), &sl); err != nil {
		t.Fatal(err)
	}
	setShard(func(sh *ShardRec) { sh.P50Ns = [4]uint64{0, 1 * ms, 3 * ms, 0} })
	r := bpftest.Runner{Prog: f.o.Gather, Counters: f.counters, Clock: f.o.Clock}
	r.Run(t, []bpftest.Case{
		{Name: "b answers after 2 ms", In: reply(b, coord4, 1, 0, id, vec64(1), nil), Now: now,
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Replies": 1, "1.Completed": 1}},
		{Name: "c answers late, after 2 ms", In: reply(c, coord4, 1, 0, id, vec64(1), nil), Now: now,
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Late": 1}},
		{Name: "a answers late, its first sample", In: reply(a, coord4, 1, 0, id, vec64(1), nil), Now: now,
			WantRet: bpftest.XDPDrop, WantCounters: bpftest.Counters{"1.Late": 1}},
	})
	f.result(t)
	step := func(m uint64) uint64 { return m>>5 + 1 }
	want := [4]uint64{2 * ms, 1*ms + step(1*ms), 3*ms - step(3*ms), 0}
	if sh := f.shard(t, 0); sh.P50Ns != want {
		t.Fatalf("estimates %v, want %v (a set, b up a step, c down a step)", sh.P50Ns, want)
	}
}
