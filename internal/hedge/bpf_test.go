package hedge

// BPF_PROG_TEST_RUN unit tests of the hedger's programs (bpf/hedge/hedge.bpf.c): each case
// puts one packet through one program and checks the verdict, the packet that comes out,
// the skb mark, the change of every counter (per service and the global slot) and the
// whole scoreboard. Fixtures and the table runner are in bpf_fixtures_test.go.

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"golang.org/x/sys/unix"
)

const (
	hedgeMark = DefaultMark // Config.Mark default: skb->mark of hedges
	unspec    = bpftest.TCActUnspec
	shot      = bpftest.TCActShot
	redirect  = bpftest.TCActRedirect
)

// TestSkBuffLayout: the context struct handed to BPF_PROG_TEST_RUN has the kernel's size
// (a shorter ctx_out fails the run with ENOSPC).
func TestSkBuffLayout(t *testing.T) {
	if err := checkKernel(); err != nil {
		t.Skipf("hedger: %v", err)
	}
	want, err := kernelSkBuffSize()
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	if got := binary.Size(skBuff{}); got != want {
		t.Fatalf("skBuff is %d bytes, struct __sk_buff %d: update it from vmlinux.h", got, want)
	}
}

// pendingSince checks the splitter's entry for k: sent during the run, due one hedge
// delay later, addressed to replica 0, no hedge yet.
func pendingSince(k hedgeHreqKey, state uint32) func(testing.TB, *fixture, runResult, uint64, uint64) {
	return func(tb testing.TB, f *fixture, _ runResult, t0, t1 uint64) {
		tb.Helper()
		e, ok := f.entry(tb, k)
		if !ok {
			tb.Fatalf("no scoreboard entry %v", k)
		}
		if e.SentNs < t0 || e.SentNs > t1 {
			tb.Errorf("sent_ns %d outside the run [%d, %d]", e.SentNs, t0, t1)
		}
		if d := time.Duration(e.DeadlineNs - e.SentNs); d != testDelay {
			tb.Errorf("deadline = sent + %v, want sent + %v", d, testDelay)
		}
		want := hedgeHreq{SentNs: e.SentNs, DeadlineNs: e.DeadlineNs, State: state, OrigReplica: 0, HedgeReplica: replicaNone, Tried: 1}
		if e != want {
			tb.Errorf("entry %+v, want %+v", e, want)
		}
	}
}

// tokensAre checks svc's free budget tokens (milli) after a case.
func tokensAre(svc int, want int64, why string) func(testing.TB, *fixture, runResult, uint64, uint64) {
	return func(tb testing.TB, f *fixture, _ runResult, _, _ uint64) {
		tb.Helper()
		if got := f.state(tb, svc).TokensMilli; got != want {
			tb.Errorf("budget %d milli-tokens, want %d (%s)", got, want, why)
		}
	}
}

func TestSplit(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x1001
	req4 := datagram(client4, svc4, idPayload(id, 32))
	req6 := datagram(client6, svc6, idPayload(id, 32))
	k4, k6 := key(sV4, client4, id), key(sV6, client6, id)
	recorded := bpftest.Counters{"v4.Requests": 1, "v4.Clones": 1}
	pending4 := map[hedgeHreqKey]uint32{k4: reqPending}
	const leID = 0x0102030405060708
	kLE := key(sLE, client4, leID)

	var txBefore uint64
	runCases(t, f, f.objs.HedgeSplit, []progCase{
		{name: "ipv4 request is recorded and cloned", in: req4, ret: unspec,
			setup:    func(tb testing.TB, f *fixture) { txBefore = f.dlTxPackets(tb) },
			counters: recorded, board: pending4,
			check: func(tb testing.TB, f *fixture, r runResult, t0, t1 uint64) {
				pendingSince(k4, reqPending)(tb, f, r, t0, t1)
				if n := f.dlTxPackets(tb) - txBefore; n != 1 {
					tb.Errorf("the delay-line veth sent %d packets, want the clone", n)
				}
				// The bucket was full (no deposit); the clone took its hedge's token.
				tokensAre(sV4, v4Burst*1000-1000, "full bucket, one token taken by the clone")(tb, f, r, t0, t1)
			}},
		{name: "ipv6 request is recorded and cloned", in: req6, ret: unspec,
			counters: bpftest.Counters{"v6.Requests": 1, "v6.Clones": 1},
			board:    map[hedgeHreqKey]uint32{k6: reqPending}, check: pendingSince(k6, reqPending)},
		{name: "request with a VLAN tag", in: frame{vlan: true}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: recorded, board: pending4},
		{name: "request with IPv4 options", in: frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1}}}.build(client4, svc4, idPayload(id, 32)),
			ret: unspec, counters: recorded, board: pending4},
		{name: "ipv6 atomic fragment (offset 0, M clear) is a whole datagram",
			in:  frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(0, false, 7)}}}.build(client6, svc6, idPayload(id, 32)),
			ret: unspec, counters: bpftest.Counters{"v6.Requests": 1, "v6.Clones": 1}, board: map[hedgeHreqKey]uint32{k6: reqPending}},
		{name: "a repeated request id starts over (retransmission)", in: req4, ret: unspec,
			setup:    func(tb testing.TB, f *fixture) { f.put(tb, k4, hedgeHreq{State: reqAnswered}) },
			counters: recorded, board: pending4, check: pendingSince(k4, reqPending)},

		// Not ours.
		{name: "unknown service: untouched, not counted", in: datagram(client4, stranger, idPayload(id, 32)), ret: unspec},
		{name: "service address, other port: untouched", in: datagram(client4, netip.AddrPortFrom(svc4.Addr(), 9997), idPayload(id, 32)), ret: unspec},
		{name: "replica address is not a service: untouched", in: datagram(client4, rep4, idPayload(id, 32)), ret: unspec},
		{name: "tcp to the service port: untouched",
			in:  pktbuild.New().IPv4(pktbuild.IPv4{Src: client4.Addr(), Dst: svc4.Addr()}).TCP(pktbuild.TCP{Src: client4.Port(), Dst: svc4.Port(), Flags: pktbuild.SYN}).Build(),
			ret: unspec},
		{name: "icmp echo to the service address: untouched",
			in:  pktbuild.New().IPv4(pktbuild.IPv4{Src: client4.Addr(), Dst: svc4.Addr()}).ICMP(pktbuild.ICMP{Type: pktbuild.ICMPEchoRequest, ID: 1}).Build(),
			ret: unspec},
		{name: "arp: untouched, not malformed", in: pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build(), ret: unspec},

		// The request id.
		{name: "request shorter than the id field: short", in: datagram(client4, svc4, idPayload(id, 3)), ret: unspec,
			counters: bpftest.Counters{"v4.ShortRequests": 1}},
		{name: "empty request: short", in: datagram(client4, svc4, nil), ret: unspec,
			counters: bpftest.Counters{"v4.ShortRequests": 1}},
		{name: "request exactly the id field long: recorded", in: datagram(client4, svc4, idPayload(id, 4)), ret: unspec,
			counters: recorded, board: pending4},
		{name: "8-byte little-endian id at offset 2", in: datagram(client4, svcLE, lePayload(leID, 10)), ret: unspec,
			counters: bpftest.Counters{"le8.Requests": 1, "le8.Clones": 1}, board: map[hedgeHreqKey]uint32{kLE: reqPending}},
		{name: "8-byte id at offset 2, 9-byte request: short", in: datagram(client4, svcLE, lePayload(leID, 9)), ret: unspec,
			counters: bpftest.Counters{"le8.ShortRequests": 1}},
		{name: "udp payload cut short of its length field: short",
			in: pktbuild.Truncate(datagram(client4, svc4, idPayload(id, 32)), 14+20+8+2), ret: unspec,
			counters: bpftest.Counters{"v4.ShortRequests": 1}},

		// Malformed packets pass untouched and count in the global slot, whoever they are for.
		// (A frame cut inside the minimal IPv4 or IPv6 header never reaches the program
		// under test: TestTestRunRefusesTruncatedIPHeaders.)
		{name: "ipv4 header cut inside its options: malformed",
			in: pktbuild.Truncate(frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1}}}.build(client4, svc4, idPayload(id, 32)), 14+22), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "ipv4 version 5: malformed", in: frame{ip4: pktbuild.IPv4{Version: ptr(5)}}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "ipv4 ihl < 5: malformed", in: frame{ip4: pktbuild.IPv4{IHL: ptr(4)}}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "ipv4 total length below the header: malformed", in: frame{ip4: pktbuild.IPv4{TotLen: ptr(19)}}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "udp length < 8: malformed", in: frame{l4: pktbuild.UDP{Length: ptr(7)}}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "udp length beyond the ip payload: malformed", in: frame{l4: pktbuild.UDP{Length: ptr(200)}}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "truncated udp header: malformed", in: pktbuild.Truncate(req4, 14+20+4), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "ipv6 extension header cut short: malformed",
			in: pktbuild.Truncate(frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}}.build(client6, svc6, idPayload(id, 32)), 14+40+1), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "ipv6 payload length shorter than its extension headers: malformed",
			in: frame{ip6: pktbuild.IPv6{PayloadLen: ptr(4), Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}}.build(client6, svc6, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "ipv6 udp header cut short: malformed", in: pktbuild.Truncate(req6, 14+40+4), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},
		{name: "malformed packet to an unknown service: counted too", in: pktbuild.Truncate(datagram(client4, stranger, nil), 14+20+4), ret: unspec,
			counters: bpftest.Counters{"global.Malformed": 1}},

		// Fragments pass untouched (the id may be in another fragment) and count globally.
		{name: "ipv4 first fragment to a service: passed, counted", in: frame{ip4: pktbuild.IPv4{MF: true}}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Fragments": 1}},
		{name: "ipv4 later fragment to a service: passed, counted", in: frame{ip4: pktbuild.IPv4{FragOffset: 185}}.build(client4, svc4, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Fragments": 1}},
		{name: "ipv6 first fragment to a service: passed, counted",
			in:  frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(0, true, 7)}}}.build(client6, svc6, idPayload(id, 32)),
			ret: unspec, counters: bpftest.Counters{"global.Fragments": 1}},
		{name: "ipv6 later fragment to a service: passed, counted",
			in:  frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(185, false, 7)}}}.build(client6, svc6, idPayload(id, 32)),
			ret: unspec, counters: bpftest.Counters{"global.Fragments": 1}},
		{name: "ipv4 first fragment to an unknown service: not counted", in: frame{ip4: pktbuild.IPv4{MF: true}}.build(client4, stranger, idPayload(id, 32)), ret: unspec},
		{name: "ipv4 later fragment of anyone's datagram: counted (no ports to tell)", in: frame{ip4: pktbuild.IPv4{FragOffset: 185}}.build(client4, stranger, idPayload(id, 32)), ret: unspec,
			counters: bpftest.Counters{"global.Fragments": 1}},

		// Hedges and the budget.
		{name: "a hedge (skb mark = hedge mark) is not cloned again", in: req4, mark: hedgeMark, ret: unspec},
		{name: "another skb mark is a request like any", in: req4, mark: 0x1, ret: unspec, counters: recorded, board: pending4},
		{name: "no free token: recorded NOCLONE, not cloned", in: req4, ret: unspec,
			setup:    func(tb testing.TB, f *fixture) { f.setTokens(tb, sV4, 0) },
			counters: bpftest.Counters{"v4.Requests": 1, "v4.BudgetExhausted": 1},
			board:    map[hedgeHreqKey]uint32{k4: reqNoClone},
			check: func(tb testing.TB, f *fixture, r runResult, t0, t1 uint64) {
				pendingSince(k4, reqNoClone)(tb, f, r, t0, t1)
				if got := f.state(tb, sV4).TokensMilli; got != v4Ratio*1000 {
					tb.Errorf("tokens %d milli, want %d (one request's deposit)", got, int(v4Ratio*1000))
				}
			}},
		{name: "one deposit short of a token: the request's deposit makes it, the clone takes it", in: req4, ret: unspec,
			setup:    func(tb testing.TB, f *fixture) { f.setTokens(tb, sV4, 1000-v4Ratio*1000) },
			counters: recorded, board: pending4, check: tokensAre(sV4, 0, "the deposit completed a token, the clone took it")},
		{name: "tokens for one clone only: taken, the next request finds none", in: req4, ret: unspec,
			setup:    func(tb testing.TB, f *fixture) { f.setTokens(tb, sV4, 1000-v4Ratio*1000-1) },
			counters: bpftest.Counters{"v4.Requests": 1, "v4.BudgetExhausted": 1}, board: map[hedgeHreqKey]uint32{k4: reqNoClone},
			check: tokensAre(sV4, 999, "one milli-token short: nothing taken")},
	})
}

// TestSplitCloneTargetMissing: bpf_clone_redirect to an ifindex that does not exist fails
// (-EINVAL); the request is still recorded, as NOCLONE, the failure is counted and the
// token the clone took goes back.
func TestSplitCloneTargetMissing(t *testing.T) {
	f := newFixture(t, fixtureOpts{missingDLIf: true})
	k := key(sV4, client4, 0x77)
	runCases(t, f, f.objs.HedgeSplit, []progCase{{
		name: "clone error", in: datagram(client4, svc4, idPayload(0x77, 32)), ret: unspec,
		counters: bpftest.Counters{"v4.Requests": 1, "v4.CloneErrors": 1},
		board:    map[hedgeHreqKey]uint32{k: reqNoClone},
		check: func(tb testing.TB, f *fixture, r runResult, t0, t1 uint64) {
			pendingSince(k, reqNoClone)(tb, f, r, t0, t1)
			tokensAre(sV4, v4Burst*1000, "the failed clone's token given back")(tb, f, r, t0, t1)
		},
	}})
}

// TestTestRunRefusesTruncatedIPHeaders pins a limit of the fixtures: on 6.18 the skb test
// runner refuses (EINVAL, before the program runs) a frame whose ethertype is IPv4 or IPv6
// and that is shorter than Ethernet plus the minimal IP header, so TestSplit cuts headers
// inside IPv4 options, IPv6 extension headers or UDP instead (the same parse.h checks reject
// them). When a kernel runs such frames, add them to TestSplit as malformed.
func TestTestRunRefusesTruncatedIPHeaders(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, c := range []struct {
		name string
		in   []byte
	}{
		{"ipv4 cut at 12 of 20 header bytes", pktbuild.Truncate(datagram(client4, svc4, idPayload(1, 32)), 14+12)},
		{"ipv6 cut at 30 of 40 header bytes", pktbuild.Truncate(datagram(client6, svc6, idPayload(1, 32)), 14+30)},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := f.run(f.objs.HedgeSplit, c.in, 0)
			if err == nil {
				t.Fatalf("the test runner ran it (verdict %s): make it a TestSplit malformed case", verdict(r.ret))
			}
			if !errors.Is(err, unix.EINVAL) {
				t.Fatalf("%v, want EINVAL", err)
			}
		})
	}
}

// TestSplitScoreboardFull: with room for two entries the LRU scoreboard evicts old
// requests; every new request still gets its entry (no scoreboard_errors), and the clone
// of an evicted request finds no entry at the rescuer and is dropped as orphaned - a full
// scoreboard never turns into hedging everything.
func TestSplitScoreboardFull(t *testing.T) {
	const size, n = 2, 12
	f := newFixture(t, fixtureOpts{scoreboard: size})
	if got := f.objs.Scoreboard.MaxEntries(); got != size {
		t.Fatalf("scoreboard has %d entries, want %d (Config.ScoreboardSize)", got, size)
	}
	cfg := f.svcCfg(t, sV4)
	cfg.DelayNs = 0 // every clone is due when it comes out
	if err := f.objs.SvcCfgs.Put(uint32(sV4), cfg); err != nil {
		t.Fatal(err)
	}
	f.setTokens(t, sV4, n*1000) // a token for every clone
	reqs := make([][]byte, n)
	before, err := f.counters()
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		id := uint32(0x500 + i)
		reqs[i] = datagram(client4, svc4, idPayload(id, 32))
		r, err := f.run(f.objs.HedgeSplit, reqs[i], 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.ret != unspec {
			t.Errorf("request %d: verdict %s", i, verdict(r.ret))
		}
		if e, ok := f.entry(t, key(sV4, client4, uint64(id))); !ok || e.State != reqPending {
			t.Errorf("request %d: newest entry %s, want PENDING", i, stateNames[e.State])
		}
		if b := f.board(t); len(b) > size {
			t.Errorf("request %d: %d scoreboard entries in a map of %d", i, len(b), size)
		}
	}
	after, err := f.counters()
	if err != nil {
		t.Fatal(err)
	}
	if d := after.Sub(before).Diff(bpftest.Counters{"v4.Requests": n, "v4.Clones": n}); d != "" {
		t.Errorf("splitter counter changes (got, want):\n%s", d)
	}

	// The clones come out of the delay line: the survivors are hedged, the evicted ones
	// dropped. (Their entries were made due by a zero delay: rewriting them from user space
	// would itself evict - an LRU update takes a fresh node before it frees the old one.)
	// A survivor whose clone the loaded machine rescued later than the far-overdue cutoff
	// (max(delay 0, four passes, 50 ms) after its send) is dropped as overdue instead: told
	// apart by the run's own clock readings.
	const cutoff = 50 * time.Millisecond
	survivors := f.board(t)
	sent := map[hedgeHreqKey]uint64{}
	for k := range survivors {
		e, _ := f.entry(t, k)
		sent[k] = e.SentNs
	}
	tokens := f.state(t, sV4).TokensMilli
	before = after
	hedged, overdue := 0, 0
	for i, in := range reqs {
		r, err := f.run(f.objs.HedgeRescue, in, 0)
		if err != nil {
			t.Fatal(err)
		}
		k := key(sV4, client4, uint64(0x500+i))
		_, survived := survivors[k]
		lo, hi := time.Duration(r.t0-sent[k]), time.Duration(r.t1-sent[k])
		switch {
		case survived && r.ret == redirect && r.ctx.Mark == hedgeMark && lo <= cutoff:
			hedged++
		case survived && r.ret == shot && hi > cutoff:
			overdue++
		case !survived && r.ret == shot:
		default:
			t.Errorf("clone %d (entry kept: %v, rescued %v..%v after its send): verdict %s, mark %#x", i, survived, lo, hi, verdict(r.ret), r.ctx.Mark)
		}
	}
	after, err = f.counters()
	if err != nil {
		t.Fatal(err)
	}
	want := bpftest.Counters{"v4.HedgesSent": int64(hedged), "v4.OverdueDropped": int64(overdue), "v4.ClonesOrphaned": int64(n - len(survivors))}
	if d := after.Sub(before).Diff(want); d != "" {
		t.Errorf("rescuer counter changes (got, want):\n%s", d)
	}
	if len(survivors) == 0 || hedged+overdue != len(survivors) {
		t.Errorf("%d hedged + %d overdue of %d surviving entries", hedged, overdue, len(survivors))
	}
	// Every clone took a token; the orphaned and overdue ones gave theirs back.
	if got, want := f.state(t, sV4).TokensMilli, tokens+int64(n-len(survivors)+overdue)*1000; got != want {
		t.Errorf("budget %d milli-tokens after the rescuer, want %d (the orphaned and overdue clones' tokens back)", got, want)
	}
	t.Logf("%d requests, %d entries survived (%d hedged, %d overdue), %d clones orphaned", n, len(survivors), hedged, overdue, n-len(survivors))
}

// earlyAhead is how far ahead of the run a deadline lies that is not yet due but within the
// rescuer's early window (cfg_early_ns, testEarly).
const earlyAhead = testEarly * 9 / 10

func TestRescue(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x2002
	p := idPayload(id, 32)
	req4, req6 := datagram(client4, svc4, p), datagram(client6, svc6, p)
	k4, k6 := key(sV4, client4, id), key(sV6, client6, id)
	// due: an entry whose deadline has just passed, written right before the run (atRun).
	due := func(k hedgeHreqKey) func(*fixture, uint64) error {
		return func(f *fixture, now uint64) error { return f.objs.Scoreboard.Put(k, dueEntry(now)) }
	}
	withState := func(k hedgeHreqKey, s uint32) func(testing.TB, *fixture) {
		return func(tb testing.TB, f *fixture) { f.put(tb, k, hedgeHreq{State: s, HedgeReplica: replicaNone}) }
	}
	// hedgedTo checks the entry and the budget after a hedge to replica idx: the rescuer
	// takes no token (the clone took it at the splitter).
	hedgedTo := func(svc int, k hedgeHreqKey, idx uint8, tokens int64) func(testing.TB, *fixture, runResult, uint64, uint64) {
		return func(tb testing.TB, f *fixture, r runResult, t0, t1 uint64) {
			tb.Helper()
			verifyChecksums(tb, f, r, t0, t1)
			e, _ := f.entry(tb, k)
			if e.HedgeReplica != idx || e.HedgedNs < t0 || e.HedgedNs > t1 {
				tb.Errorf("entry %+v: want hedge_replica %d, hedged_ns in [%d, %d]", e, idx, t0, t1)
			}
			if got := f.state(tb, svc).TokensMilli; got != tokens {
				tb.Errorf("budget %d milli-tokens after the hedge, want %d", got, tokens)
			}
			late, early := histAt(tb, f.objs.DlPrecision, svc*2), histAt(tb, f.objs.DlPrecision, svc*2+1)
			if n := total(late) + total(early); n != 1 {
				tb.Errorf("%d delay-line precision samples, want 1", n)
			}
		}
	}
	v4Full := int64(v4Burst * 1000) // fillMaps starts the bucket full
	refunded := tokensAre(sV4, v4Full+1000, "the dropped clone's token given back")
	hedge4 := bpftest.Counters{"v4.HedgesSent": 1}
	zp4 := zeroSumPayload(t, client4, rep4, p)
	zp6 := zeroSumPayload(t, client6, rep6, p)
	noSum := frame{l4: pktbuild.UDP{Checksum: ptr(0)}}
	opts := frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1, 1, 1, 1, 1}}}

	cases := []progCase{
		{name: "clone of an answered request: dropped, entry deleted, token back", in: req4, setup: withState(k4, reqAnswered), ret: shot,
			counters: bpftest.Counters{"v4.ClonesAnswered": 1}, check: refunded},
		{name: "clone with no entry (evicted or expired): dropped as orphaned, token back", in: req4, ret: shot,
			counters: bpftest.Counters{"v4.ClonesOrphaned": 1}, check: refunded},
		{name: "clone not yet due: round the delay line again", in: req4, ret: redirect,
			atRun: func(f *fixture, now uint64) error {
				return f.objs.Scoreboard.Put(k4, pending(now, now+uint64(time.Second)))
			},
			counters: bpftest.Counters{"v4.Recirculations": 1, "dl.CarriedRecirculated": 1}, board: map[hedgeHreqKey]uint32{k4: reqPending},
			check: tokensAre(sV4, v4Full, "the clone keeps its token")},
		{name: "ipv4 due: destination rewritten to the other replica, marked, sent", in: req4, atRun: due(k4),
			ret: redirect, out: datagram(client4, rep4, p), outMark: ptr[uint32](hedgeMark),
			counters: hedge4, board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(sV4, k4, 1, v4Full)},
		{name: "ipv6 due: destination rewritten to the other replica, marked, sent", in: req6, atRun: due(k6),
			ret: redirect, out: datagram(client6, rep6, p), outMark: ptr[uint32](hedgeMark),
			counters: bpftest.Counters{"v6.HedgesSent": 1}, board: map[hedgeHreqKey]uint32{k6: reqHedged}, check: hedgedTo(sV6, k6, 1, 10000)},
		{name: "due within half a period (cfg_early_ns): sent now", in: req4, ret: redirect,
			// Sent dueDelay ago: the far-overdue cutoff is a second away. The deadline is 0.9
			// of the early window ahead, and the run must end before it (within): an emulated
			// guest took 0.5-0.8 ms from writing the entry to the run's end.
			atRun: func(f *fixture, now uint64) error {
				return f.objs.Scoreboard.Put(k4, pending(now-uint64(dueDelay), now+uint64(earlyAhead)))
			},
			within: earlyAhead,
			out:    datagram(client4, rep4, p), outMark: ptr[uint32](hedgeMark),
			counters: hedge4, board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(sV4, k4, 1, v4Full)},
		{name: "ipv4 with options: rewritten past them", in: opts.build(client4, svc4, p), atRun: due(k4),
			ret: redirect, out: opts.build(client4, rep4, p), outMark: ptr[uint32](hedgeMark),
			counters: hedge4, board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(sV4, k4, 1, v4Full)},
		{name: "vlan-tagged: rewritten past the tag", in: frame{vlan: true}.build(client4, svc4, p), atRun: due(k4),
			ret: redirect, out: frame{vlan: true}.build(client4, rep4, p), outMark: ptr[uint32](hedgeMark),
			counters: hedge4, board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(sV4, k4, 1, v4Full)},
		{name: "ipv4 without udp checksum: stays without", in: noSum.build(client4, svc4, p), atRun: due(k4),
			ret: redirect, out: noSum.build(client4, rep4, p), outMark: ptr[uint32](hedgeMark),
			counters: hedge4, board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(sV4, k4, 1, v4Full)},
		{name: "ipv4 rewrite whose udp checksum computes to 0: sent as 0xffff", in: datagram(client4, svc4, zp4), atRun: due(k4),
			ret: redirect, out: datagram(client4, rep4, zp4), outMark: ptr[uint32](hedgeMark),
			counters: hedge4, board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(sV4, k4, 1, v4Full)},
		{name: "ipv6 rewrite whose udp checksum computes to 0: sent as 0xffff, never 0", in: datagram(client6, svc6, zp6), atRun: due(k6),
			ret: redirect, out: datagram(client6, rep6, zp6), outMark: ptr[uint32](hedgeMark),
			counters: bpftest.Counters{"v6.HedgesSent": 1}, board: map[hedgeHreqKey]uint32{k6: reqHedged}, check: hedgedTo(sV6, k6, 1, 10000)},
		{name: "due, no free token: sent on the token the clone holds", in: req4,
			setup: func(tb testing.TB, f *fixture) { f.setTokens(tb, sV4, 999) }, atRun: due(k4),
			ret: redirect, out: datagram(client4, rep4, p), outMark: ptr[uint32](hedgeMark),
			counters: hedge4, board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: hedgedTo(sV4, k4, 1, 999)},
		{name: "single-address service: hedged to its own address", in: datagram(client4, svcSolo, p), atRun: due(key(sSolo, client4, id)),
			ret: redirect, outMark: ptr[uint32](hedgeMark),
			counters: bpftest.Counters{"solo.HedgesSent": 1}, board: map[hedgeHreqKey]uint32{key(sSolo, client4, id): reqHedged},
			check: hedgedTo(sSolo, key(sSolo, client4, id), 0, 10000)},
		{name: "two replicas, round robin at 0: first replica", in: datagram(client4, svcRR, p), atRun: due(key(sRR, client4, id)),
			ret: redirect, out: datagram(client4, repRR1, p), outMark: ptr[uint32](hedgeMark),
			counters: bpftest.Counters{"rr.HedgesSent": 1}, board: map[hedgeHreqKey]uint32{key(sRR, client4, id): reqHedged},
			check: hedgedTo(sRR, key(sRR, client4, id), 1, 10000)},
		{name: "two replicas, round robin at 1: second replica (other port)", in: datagram(client4, svcRR, p),
			atRun: due(key(sRR, client4, id)),
			setup: func(tb testing.TB, f *fixture) {
				st := f.state(tb, sRR)
				st.Rr = 1
				if err := f.objs.SvcStates.Put(uint32(sRR), st); err != nil {
					tb.Fatal(err)
				}
			},
			ret: redirect, out: datagram(client4, repRR2, p), outMark: ptr[uint32](hedgeMark),
			counters: bpftest.Counters{"rr.HedgesSent": 1}, board: map[hedgeHreqKey]uint32{key(sRR, client4, id): reqHedged},
			check: hedgedTo(sRR, key(sRR, client4, id), 2, 10000)},
		{name: "not a request of any service: dropped, counted", in: datagram(client4, stranger, p), ret: shot,
			counters: bpftest.Counters{"global.RescueUnmatched": 1}},
		{name: "malformed: dropped, counted", in: pktbuild.Truncate(req4, 14+20+4), ret: shot,
			counters: bpftest.Counters{"global.Malformed": 1, "global.RescueUnmatched": 1}},
	}
	// Any state but PENDING means the clone has nothing left to do (a retransmission may
	// have replaced its entry); only ANSWERED entries are finished by it (the others still
	// wait for a response). Its token goes back either way.
	for _, s := range []uint32{reqNoClone, reqNoHedge, reqHedged, reqAnsweredHedge} {
		cases = append(cases, progCase{name: "clone of a " + stateNames[s] + " request: dropped, entry kept, token back",
			in: req4, setup: withState(k4, s), ret: shot,
			counters: bpftest.Counters{"v4.ClonesAnswered": 1}, board: map[hedgeHreqKey]uint32{k4: s}, check: refunded})
	}
	runCases(t, f, f.objs.HedgeRescue, cases)
}

func TestResp(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x3003
	p := idPayload(id, 32)
	k4, k6 := key(sV4, client4, id), key(sV6, client6, id)
	// sentDue records k, right before the run (atRun), as sent 5 ms ago with its deadline
	// due in.
	sentDue := func(k hedgeHreqKey, s uint32, hedgeReplica uint8, due time.Duration) func(*fixture, uint64) error {
		return func(f *fixture, now uint64) error {
			e := pending(now-uint64(5*time.Millisecond), uint64(int64(now)+int64(due)))
			e.State, e.HedgeReplica = s, hedgeReplica
			return f.objs.Scoreboard.Put(k, e)
		}
	}
	// A deadline a second away (a run later than atRunWithin is repeated).
	sent := func(k hedgeHreqKey, s uint32, hedgeReplica uint8) func(*fixture, uint64) error {
		return sentDue(k, s, hedgeReplica, time.Second)
	}
	// latency checks that one latency sample went into the service's current slot and
	// into the window total.
	latency := func(svc int) func(testing.TB, *fixture, runResult, uint64, uint64) {
		return func(tb testing.TB, f *fixture, r runResult, t0, t1 uint64) {
			tb.Helper()
			verifyChecksums(tb, f, r, t0, t1)
			slot := f.state(tb, svc).Slot
			cur := histAt(tb, f.objs.LatHist, svc*(histSlots+1)+int(slot))
			tot := histAt(tb, f.objs.LatHist, svc*(histSlots+1)+histSlots)
			if total(cur) != 1 || total(tot) != 1 {
				tb.Errorf("latency samples: %d in slot %d, %d in the window total; want 1 and 1", total(cur), slot, total(tot))
			}
			if w := f.state(tb, svc).WindowCount; w != 1 {
				tb.Errorf("window_count %d, want 1", w)
			}
		}
	}
	noLatency := func(tb testing.TB, f *fixture, _ runResult, _, _ uint64) {
		tb.Helper()
		for svc := range f.h.Config.Services {
			if n := total(histAt(tb, f.objs.LatHist, svc*(histSlots+1)+histSlots)); n != 0 {
				tb.Errorf("service %d: %d latency samples, want none", svc, n)
			}
		}
	}
	first := bpftest.Counters{"v4.Responses": 1}
	won4 := bpftest.Counters{"v4.Responses": 1, "v4.HedgesWon": 1, "v4.ResponsesRewritten": 1}
	won6 := bpftest.Counters{"v6.Responses": 1, "v6.HedgesWon": 1, "v6.ResponsesRewritten": 1}
	zp6 := zeroSumPayload(t, svc6, client6, p)
	zp4 := zeroSumPayload(t, svc4, client4, p)
	const leID = 0x1122334455667788
	kLE := key(sLE, client4, leID)

	runCases(t, f, f.objs.HedgeResp, []progCase{
		{name: "first response of a PENDING request: ANSWERED, latency recorded", in: datagram(svc4, client4, p),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec,
			counters: first, board: map[hedgeHreqKey]uint32{k4: reqAnswered}, check: latency(sV4)},
		{name: "ipv6 first response of a PENDING request", in: datagram(svc6, client6, p),
			atRun: sent(k6, reqPending, replicaNone), ret: unspec,
			counters: bpftest.Counters{"v6.Responses": 1}, board: map[hedgeHreqKey]uint32{k6: reqAnswered}, check: latency(sV6)},
		{name: "8-byte little-endian id matched", in: datagram(svcLE, client4, lePayload(leID, 16)),
			atRun: sent(kLE, reqPending, replicaNone), ret: unspec,
			counters: bpftest.Counters{"le8.Responses": 1}, board: map[hedgeHreqKey]uint32{kLE: reqAnswered}, check: latency(sLE)},
		{name: "hedged, the hedge's replica answers first: source rewritten to the service", in: datagram(rep4, client4, p),
			atRun: sent(k4, reqHedged, 1), ret: unspec, out: datagram(svc4, client4, p),
			counters: won4, board: map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}, check: latency(sV4)},
		{name: "ipv6 hedged, the hedge's replica answers first: source rewritten", in: datagram(rep6, client6, p),
			atRun: sent(k6, reqHedged, 1), ret: unspec, out: datagram(svc6, client6, p),
			counters: won6, board: map[hedgeHreqKey]uint32{k6: reqAnsweredHedge}, check: latency(sV6)},
		{name: "ipv4 rewrite whose udp checksum computes to 0: 0xffff", in: datagram(rep4, client4, zp4),
			atRun: sent(k4, reqHedged, 1), ret: unspec, out: datagram(svc4, client4, zp4),
			counters: won4, board: map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}, check: latency(sV4)},
		{name: "ipv6 rewrite whose udp checksum computes to 0: 0xffff, never 0", in: datagram(rep6, client6, zp6),
			atRun: sent(k6, reqHedged, 1), ret: unspec, out: datagram(svc6, client6, zp6),
			counters: won6, board: map[hedgeHreqKey]uint32{k6: reqAnsweredHedge}, check: latency(sV6)},
		{name: "hedged, the original answers first: not won, not rewritten", in: datagram(svc4, client4, p),
			atRun: sent(k4, reqHedged, 1), ret: unspec,
			counters: first, board: map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}, check: latency(sV4)},
		{name: "the later response of a hedged request (from the original): dropped, entry deleted", in: datagram(svc4, client4, p),
			atRun: sent(k4, reqAnsweredHedge, 1), ret: shot,
			counters: bpftest.Counters{"v4.DuplicatesDropped": 1}, check: noLatency},
		{name: "the later response of a hedged request (from the hedge's replica): dropped", in: datagram(rep4, client4, p),
			atRun: sent(k4, reqAnsweredHedge, 1), ret: shot,
			counters: bpftest.Counters{"v4.DuplicatesDropped": 1}, check: noLatency},
		{name: "ipv6 later response of a hedged request: dropped", in: datagram(svc6, client6, p),
			atRun: sent(k6, reqAnsweredHedge, 1), ret: shot,
			counters: bpftest.Counters{"v6.DuplicatesDropped": 1}, check: noLatency},
		{name: "an unhedged request's second response (the application's duplicate): passed", in: datagram(svc4, client4, p),
			atRun: sent(k4, reqAnswered, replicaNone), ret: unspec,
			board: map[hedgeHreqKey]uint32{k4: reqAnswered}, check: noLatency},
		{name: "response of a NOCLONE request: completes it, entry removed", in: datagram(svc4, client4, p),
			atRun: sent(k4, reqNoClone, replicaNone), ret: unspec, counters: first, check: latency(sV4)},
		{name: "response of a NOCLONE request after its deadline: completes it, counted as unhedged_late", in: datagram(svc4, client4, p),
			atRun: sentDue(k4, reqNoClone, replicaNone, -time.Millisecond), ret: unspec,
			counters: bpftest.Counters{"v4.Responses": 1, "v4.UnhedgedLate": 1}, check: latency(sV4)},
		{name: "response of a NOHEDGE request after its deadline: not unhedged_late (its clone had a token)", in: datagram(svc4, client4, p),
			atRun: sentDue(k4, reqNoHedge, replicaNone, -time.Millisecond), ret: unspec, counters: first, check: latency(sV4)},
		{name: "response of a NOHEDGE request: completes it, entry removed", in: datagram(svc4, client4, p),
			atRun: sent(k4, reqNoHedge, replicaNone), ret: unspec, counters: first, check: latency(sV4)},
		{name: "response for an unknown request: untouched", in: datagram(svc4, client4, p), ret: unspec, check: noLatency},
		{name: "response to another client port: untouched", in: datagram(svc4, netip.AddrPortFrom(client4.Addr(), 40001), p),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},

		// Short and malformed responses pass untouched (the application may understand what
		// kedge cannot match) and leave the request open; short ones count per service,
		// malformed ones globally (no ports, so no service).
		{name: "response shorter than the id: passed, counted, request stays open", in: datagram(svc4, client4, p[:3]),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, counters: bpftest.Counters{"v4.ShortResponses": 1},
			board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},
		{name: "empty response: passed, counted", in: datagram(svc4, client4, nil),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, counters: bpftest.Counters{"v4.ShortResponses": 1},
			board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},
		{name: "short response from the hedge's replica: passed, not rewritten, counted", in: datagram(rep4, client4, p[:2]),
			atRun: sent(k4, reqHedged, 1), ret: unspec, counters: bpftest.Counters{"v4.ShortResponses": 1},
			board: map[hedgeHreqKey]uint32{k4: reqHedged}, check: noLatency},
		{name: "ipv6 short response: passed, counted", in: datagram(svc6, client6, p[:1]),
			atRun: sent(k6, reqPending, replicaNone), ret: unspec, counters: bpftest.Counters{"v6.ShortResponses": 1},
			board: map[hedgeHreqKey]uint32{k6: reqPending}, check: noLatency},
		{name: "8-byte id at offset 2, 9-byte response: short", in: datagram(svcLE, client4, lePayload(leID, 9)),
			atRun: sent(kLE, reqPending, replicaNone), ret: unspec, counters: bpftest.Counters{"le8.ShortResponses": 1},
			board: map[hedgeHreqKey]uint32{kLE: reqPending}, check: noLatency},
		{name: "short datagram from a stranger: not a response, not counted", in: datagram(stranger, client4, p[:3]), ret: unspec, check: noLatency},
		{name: "malformed response (udp header cut): passed, counted globally", in: pktbuild.Truncate(datagram(svc4, client4, p), 14+20+4),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, counters: bpftest.Counters{"global.MalformedResponses": 1},
			board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},
		{name: "malformed response (udp length < 8): passed, counted globally", in: frame{l4: pktbuild.UDP{Length: ptr(7)}}.build(svc4, client4, p),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, counters: bpftest.Counters{"global.MalformedResponses": 1},
			board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},
		{name: "malformed response (ipv4 ihl < 5): passed, counted globally", in: frame{ip4: pktbuild.IPv4{IHL: ptr(4)}}.build(svc4, client4, p),
			ret: unspec, counters: bpftest.Counters{"global.MalformedResponses": 1}, check: noLatency},
		{name: "ipv6 malformed response (extension header cut): passed, counted globally",
			in:  pktbuild.Truncate(frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}}.build(svc6, client6, p), 14+40+1),
			ret: unspec, counters: bpftest.Counters{"global.MalformedResponses": 1}, check: noLatency},
		{name: "malformed packet from anyone: counted too", in: pktbuild.Truncate(datagram(stranger, client4, p), 14+20+4),
			ret: unspec, counters: bpftest.Counters{"global.MalformedResponses": 1}, check: noLatency},
		{name: "arp: not malformed", in: pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build(), ret: unspec},

		{name: "a tracked id from a stranger: untouched", in: datagram(stranger, client4, p),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},
		{name: "fragmented response: untouched, not counted", in: frame{ip4: pktbuild.IPv4{MF: true}}.build(svc4, client4, p),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},
		{name: "later fragment of a response: untouched, not malformed", in: frame{ip4: pktbuild.IPv4{FragOffset: 185}}.build(svc4, client4, p),
			atRun: sent(k4, reqPending, replicaNone), ret: unspec, board: map[hedgeHreqKey]uint32{k4: reqPending}, check: noLatency},
	})
}

// TestCarryDeadline: the delay line's own programs have their fixtures in internal/pacer;
// here what the hedger gives them: on edt the splitter's clone carries its deadline as its
// delivery time (pacer_carry, counted as dl.EdtSet), while the request itself leaves with
// the time it came with.
func TestCarryDeadline(t *testing.T) {
	const id, rxTime = 0x4004, 12345
	req := datagram(client4, svc4, idPayload(id, 32))
	k := key(sV4, client4, id)
	for _, c := range []struct {
		backend  string
		counters bpftest.Counters
	}{
		{BackendConveyor, bpftest.Counters{"v4.Requests": 1, "v4.Clones": 1}},
		{BackendEDT, bpftest.Counters{"v4.Requests": 1, "v4.Clones": 1, "dl.EdtSet": 1}},
	} {
		t.Run(c.backend, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{backend: c.backend})
			runCases(t, f, f.objs.HedgeSplit, []progCase{{
				name: "request cloned with its deadline", in: req, tstamp: rxTime, ret: unspec,
				counters: c.counters, board: map[hedgeHreqKey]uint32{k: reqPending},
				check: func(tb testing.TB, _ *fixture, r runResult, _, _ uint64) {
					if r.ctx.Tstamp != rxTime {
						tb.Errorf("the request left with tstamp %d, want its own %d", r.ctx.Tstamp, rxTime)
					}
				}}})
		})
	}
}

// TestLatencyBucket checks stats.go's bucketOf (which user space uses to read lat_hist)
// against hist_bucket() in bpf/include/hedge.h as the kernel runs it: a response completes a
// request whose sent_ns lies a chosen latency in the past, and the bucket that counted it
// must be bucketOf of that latency. The latency is only known to lie within the test run
// (a few microseconds wide), so where that range spans two buckets either is accepted.
func TestLatencyBucket(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x5005
	in := datagram(svc4, client4, idPayload(id, 32))
	k := key(sV4, client4, id)
	uptime := monoNow(t)
	var lats []uint64 // latencies in ns
	for _, us := range []uint64{0, 5, 15, 16, 17, 31, 32, 33} {
		lats = append(lats, us*1000)
	}
	// A quarter into a spread of buckets, up to the last one (2^28 us, 268 s) and beyond.
	for _, b := range []int{20, 47, 48, 63, 64, 100, 150, 200, 250, 300, 350, 383, 384, 398, 399} {
		lo, hi := bucketBounds(b)
		lats = append(lats, (lo+(hi-lo)/4)*1000)
	}
	lats = append(lats, uint64(300*time.Second), uptime-1)
	exact, long := 0, 0
	for _, lat := range lats {
		if lat >= uptime {
			t.Logf("latency %v: skipped, longer than the system has been up", time.Duration(lat))
			continue
		}
		f.reset(t)
		sent := monoNow(t) - lat
		f.put(t, k, pending(sent, sent+uint64(testDelay)))
		r, err := f.run(f.objs.HedgeResp, in, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.ret != unspec {
			t.Fatalf("verdict %s", verdict(r.ret))
		}
		t0, t1 := r.t0, r.t1
		got := nonZero(histAt(t, f.objs.LatHist, sV4*(histSlots+1)+histSlots))
		lo, hi := bucketOf((t0-sent)/1000), bucketOf((t1-sent)/1000)
		if len(got) != 1 {
			t.Errorf("latency %v: buckets %v, want one sample", time.Duration(lat), got)
			continue
		}
		for b := range got {
			if b < lo || b > hi {
				t.Errorf("latency in [%v, %v]: kernel bucket %d, bucketOf says %d..%d", time.Duration(t0-sent), time.Duration(t1-sent), b, lo, hi)
			}
		}
		if lo == hi {
			exact++
		}
		if lat >= uint64(4*time.Millisecond) {
			long++
		}
	}
	// Buckets from 4 ms on are at least 256 us wide and the latencies sit a quarter in: only
	// a test run slower than 64 us leaves them unpinned.
	if exact < long/2 {
		t.Errorf("only %d of %d latencies fell in one bucket (%d of them >= 4ms): the test runs took too long to pin buckets", exact, len(lats), long)
	}
	t.Logf("%d of %d latencies pinned to one bucket", exact, len(lats))
}

// ---- benchmarks: the programs' own cost per packet, as the kernel measures it ----

// benchRepeat runs prog b.N times in one BPF_PROG_TEST_RUN (same skb every time) and
// reports the kernel's ns per run. For paths that leave the maps as they found them; the
// path is confirmed by the verdict and, if named, a counter that must grow by b.N or more
// (the kernel may repeat a run that a signal interrupted).
func benchRepeat(b *testing.B, f *fixture, prog *ebpf.Program, in []byte, want uint32, counter string) {
	var ret uint32
	var per time.Duration
	delta, err := bpftest.Delta(f.counters, func() error {
		b.ResetTimer()
		return f.ns.Do(func() (err error) {
			ret, per, err = prog.Benchmark(in, b.N, nil)
			return err
		})
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if ret != want {
		b.Fatalf("verdict %s, want %s", verdict(ret), verdict(want))
	}
	if counter != "" && delta[counter] < int64(b.N) {
		b.Fatalf("%s grew by %d in %d runs: not the path under test", counter, delta[counter], b.N)
	}
	b.ReportMetric(float64(per.Nanoseconds()), "ns/op")
}

// benchEach runs prog once per iteration after setup (untimed) restored the state the
// path needs, and reports the kernel's mean ns per run; counter must grow by exactly b.N.
func benchEach(b *testing.B, f *fixture, prog *ebpf.Program, in []byte, want uint32, counter string, setup func() error) {
	var sum time.Duration
	var wrong uint32
	delta, err := bpftest.Delta(f.counters, func() error {
		b.ResetTimer()
		return f.ns.Do(func() error {
			for i := 0; i < b.N; i++ {
				if err := setup(); err != nil {
					return err
				}
				ret, d, err := prog.Benchmark(in, 1, nil)
				if err != nil {
					return err
				}
				if ret != want {
					wrong = ret
				}
				sum += d
			}
			return nil
		})
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if wrong != 0 {
		b.Fatalf("verdict %s, want %s", verdict(wrong), verdict(want))
	}
	if delta[counter] != int64(b.N) {
		b.Fatalf("%s grew by %d in %d runs: not the path under test", counter, delta[counter], b.N)
	}
	b.ReportMetric(float64(sum.Nanoseconds())/float64(b.N), "ns/op")
}

// BenchmarkSplit: the splitter on the client's egress path. request: a service request,
// recorded and cloned into a real veth (the clone's transmission included); record-only:
// recorded but not cloned (budget empty, no deposits); other: not a service's traffic.
func BenchmarkSplit(b *testing.B) {
	f := newFixture(b, fixtureOpts{})
	noBudget := func(b *testing.B) {
		cfg := f.svcCfg(b, sV4)
		cfg.BudgetRatioMilli = 0
		if err := f.objs.SvcCfgs.Put(uint32(sV4), cfg); err != nil {
			b.Fatal(err)
		}
		f.setTokens(b, sV4, 0)
	}
	// Every clone takes a token: a deposit of a whole token per request keeps the bucket
	// from running dry over b.N runs (v6's ratio is 1 already).
	tokenPerRequest := func(b *testing.B) {
		cfg := f.svcCfg(b, sV4)
		cfg.BudgetRatioMilli = 1000
		if err := f.objs.SvcCfgs.Put(uint32(sV4), cfg); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name    string
		in      []byte
		setup   func(*testing.B)
		counter string
	}{
		{"request/ipv4", datagram(client4, svc4, idPayload(1, 64)), tokenPerRequest, "v4.Clones"},
		{"request/ipv6", datagram(client6, svc6, idPayload(1, 64)), nil, "v6.Clones"},
		{"record-only/ipv4", datagram(client4, svc4, idPayload(1, 64)), noBudget, "v4.BudgetExhausted"},
		{"other/ipv4", datagram(client4, stranger, idPayload(1, 64)), nil, ""},
		{"other/tcp", pktbuild.New().IPv4(pktbuild.IPv4{}).TCP(pktbuild.TCP{Src: 1, Dst: 2, Flags: pktbuild.ACK}).Payload(make([]byte, 64)).Build(), nil, ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			f.reset(b)
			if c.setup != nil {
				c.setup(b)
			}
			benchRepeat(b, f, f.objs.HedgeSplit, c.in, unspec, c.counter)
		})
	}
}

// BenchmarkResp: the response path on the client's ingress. first: completes a PENDING
// request (latency recorded); hedge-won: rewrites the hedge replica's response;
// duplicate: drops the later response; untracked: a response with no entry; other: not a
// service's traffic.
func BenchmarkResp(b *testing.B) {
	f := newFixture(b, fixtureOpts{})
	const id = 9
	k := key(sV4, client4, id)
	p := idPayload(id, 64)
	put := func(state uint32, hedgeReplica uint8) func() error {
		return func() error {
			e := pending(1, 2)
			e.State, e.HedgeReplica = state, hedgeReplica
			return f.objs.Scoreboard.Put(k, e)
		}
	}
	b.Run("first", func(b *testing.B) {
		f.reset(b)
		benchEach(b, f, f.objs.HedgeResp, datagram(svc4, client4, p), unspec, "v4.Responses", put(reqPending, replicaNone))
	})
	b.Run("hedge-won", func(b *testing.B) {
		f.reset(b)
		benchEach(b, f, f.objs.HedgeResp, datagram(rep4, client4, p), unspec, "v4.ResponsesRewritten", put(reqHedged, 1))
	})
	b.Run("duplicate", func(b *testing.B) {
		f.reset(b)
		benchEach(b, f, f.objs.HedgeResp, datagram(svc4, client4, p), shot, "v4.DuplicatesDropped", put(reqAnsweredHedge, 1))
	})
	b.Run("untracked", func(b *testing.B) {
		f.reset(b)
		benchRepeat(b, f, f.objs.HedgeResp, datagram(svc4, client4, p), unspec, "")
	})
	b.Run("other", func(b *testing.B) {
		f.reset(b)
		benchRepeat(b, f, f.objs.HedgeResp, datagram(stranger, client4, p), unspec, "")
	})
}
