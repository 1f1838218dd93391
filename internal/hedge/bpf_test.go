package hedge

// BPF_PROG_TEST_RUN unit tests of the hedger's programs (bpf/hedge/hedge.bpf.c): each case
// puts one packet through one program and checks the verdict, the packet that comes out,
// the skb mark, the change of every counter (per service and the global slot) and the
// whole scoreboard. Fixtures and the table runner are in bpf_fixtures_test.go.

import (
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

// pendingSince checks the splitter's entry for k: sent at the run's time, due one hedge
// delay later, addressed to replica 0, no hedge yet.
func pendingSince(f *fixture, k hedgeHreqKey, state uint32) func(testing.TB, bpftest.Result) {
	return func(tb testing.TB, r bpftest.Result) {
		tb.Helper()
		e, ok := f.entry(tb, k)
		if !ok {
			tb.Fatalf("no scoreboard entry %v", k)
		}
		want := hedgeHreq{SentNs: r.Now, DeadlineNs: r.Now + uint64(testDelay), State: state, OrigReplica: 0, HedgeReplica: replicaNone, Tried: 1}
		if e != want {
			tb.Errorf("entry %+v, want %+v", e, want)
		}
	}
}

// tokensAre checks svc's free budget tokens (milli) after a case.
func tokensAre(f *fixture, svc int, want int64, why string) func(testing.TB, bpftest.Result) {
	return func(tb testing.TB, _ bpftest.Result) {
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
	runCases(t, f, f.objs.HedgeSplit, []bpftest.Case{
		{Name: "ipv4 request is recorded and cloned", In: req4,
			Setup: func(tb testing.TB) { txBefore = f.dlTxPackets(tb) }, WantRet: unspec, WantCounters: recorded,
			Check: f.leaves(pending4, func(tb testing.TB, r bpftest.Result) {
				pendingSince(f, k4, reqPending)(tb, r)
				if n := f.dlTxPackets(tb) - txBefore; n != 1 {
					tb.Errorf("the delay-line veth sent %d packets, want the clone", n)
				}
				// The bucket was full (no deposit); the clone took its hedge's token.
				tokensAre(f, sV4, v4Burst*1000-1000, "full bucket, one token taken by the clone")(tb, r)
			})},
		{Name: "ipv6 request is recorded and cloned", In: req6, WantRet: unspec,
			WantCounters: bpftest.Counters{"v6.Requests": 1, "v6.Clones": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k6: reqPending}, pendingSince(f, k6, reqPending))},
		{Name: "request with a VLAN tag", In: frame{vlan: true}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: recorded, Check: f.leaves(pending4)},
		{Name: "request with IPv4 options",
			In:      frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1}}}.build(client4, svc4, idPayload(id, 32)),
			WantRet: unspec, WantCounters: recorded, Check: f.leaves(pending4)},
		{Name: "ipv6 atomic fragment (offset 0, M clear) is a whole datagram",
			In:      frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(0, false, 7)}}}.build(client6, svc6, idPayload(id, 32)),
			WantRet: unspec, WantCounters: bpftest.Counters{"v6.Requests": 1, "v6.Clones": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k6: reqPending})},
		{Name: "a repeated request id starts over (retransmission)", In: req4,
			Setup: func(tb testing.TB) { f.put(tb, k4, hedgeHreq{State: reqAnswered}) }, WantRet: unspec,
			WantCounters: recorded, Check: f.leaves(pending4, pendingSince(f, k4, reqPending))},

		// Not ours.
		{Name: "unknown service: untouched, not counted", In: datagram(client4, stranger, idPayload(id, 32)),
			WantRet: unspec},
		{Name: "service address, other port: untouched",
			In: datagram(client4, netip.AddrPortFrom(svc4.Addr(), 9997), idPayload(id, 32)), WantRet: unspec},
		{Name: "replica address is not a service: untouched", In: datagram(client4, rep4, idPayload(id, 32)),
			WantRet: unspec},
		{Name: "tcp to the service port: untouched",
			In:      pktbuild.New().IPv4(pktbuild.IPv4{Src: client4.Addr(), Dst: svc4.Addr()}).TCP(pktbuild.TCP{Src: client4.Port(), Dst: svc4.Port(), Flags: pktbuild.SYN}).Build(),
			WantRet: unspec},
		{Name: "icmp echo to the service address: untouched",
			In:      pktbuild.New().IPv4(pktbuild.IPv4{Src: client4.Addr(), Dst: svc4.Addr()}).ICMP(pktbuild.ICMP{Type: pktbuild.ICMPEchoRequest, ID: 1}).Build(),
			WantRet: unspec},
		{Name: "arp: untouched, not malformed",
			In: pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build(), WantRet: unspec},

		// The request id.
		{Name: "request shorter than the id field: short", In: datagram(client4, svc4, idPayload(id, 3)), WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.ShortRequests": 1}},
		{Name: "empty request: short", In: datagram(client4, svc4, nil), WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.ShortRequests": 1}},
		{Name: "request exactly the id field long: recorded", In: datagram(client4, svc4, idPayload(id, 4)),
			WantRet: unspec, WantCounters: recorded, Check: f.leaves(pending4)},
		{Name: "8-byte little-endian id at offset 2", In: datagram(client4, svcLE, lePayload(leID, 10)), WantRet: unspec,
			WantCounters: bpftest.Counters{"le8.Requests": 1, "le8.Clones": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{kLE: reqPending})},
		{Name: "8-byte id at offset 2, 9-byte request: short", In: datagram(client4, svcLE, lePayload(leID, 9)),
			WantRet: unspec, WantCounters: bpftest.Counters{"le8.ShortRequests": 1}},
		{Name: "udp payload cut short of its length field: short",
			In: pktbuild.Truncate(datagram(client4, svc4, idPayload(id, 32)), 14+20+8+2), WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.ShortRequests": 1}},

		// Malformed packets pass untouched and count in the global slot, whoever they are for.
		// (A frame cut inside the minimal IPv4 or IPv6 header never reaches the program
		// under test: TestTestRunRefusesTruncatedIPHeaders.)
		{Name: "ipv4 header cut inside its options: malformed",
			In:      pktbuild.Truncate(frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1}}}.build(client4, svc4, idPayload(id, 32)), 14+22),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "ipv4 version 5: malformed",
			In: frame{ip4: pktbuild.IPv4{Version: ptr(5)}}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "ipv4 ihl < 5: malformed",
			In: frame{ip4: pktbuild.IPv4{IHL: ptr(4)}}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "ipv4 total length below the header: malformed",
			In: frame{ip4: pktbuild.IPv4{TotLen: ptr(19)}}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "udp length < 8: malformed",
			In: frame{l4: pktbuild.UDP{Length: ptr(7)}}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "udp length beyond the ip payload: malformed",
			In: frame{l4: pktbuild.UDP{Length: ptr(200)}}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "truncated udp header: malformed", In: pktbuild.Truncate(req4, 14+20+4), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "ipv6 extension header cut short: malformed",
			In:      pktbuild.Truncate(frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}}.build(client6, svc6, idPayload(id, 32)), 14+40+1),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "ipv6 payload length shorter than its extension headers: malformed",
			In:      frame{ip6: pktbuild.IPv6{PayloadLen: ptr(4), Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}}.build(client6, svc6, idPayload(id, 32)),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "ipv6 udp header cut short: malformed", In: pktbuild.Truncate(req6, 14+40+4), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},
		{Name: "malformed packet to an unknown service: counted too",
			In: pktbuild.Truncate(datagram(client4, stranger, nil), 14+20+4), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Malformed": 1}},

		// Fragments pass untouched (the id may be in another fragment) and count globally.
		{Name: "ipv4 first fragment to a service: passed, counted",
			In: frame{ip4: pktbuild.IPv4{MF: true}}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Fragments": 1}},
		{Name: "ipv4 later fragment to a service: passed, counted",
			In: frame{ip4: pktbuild.IPv4{FragOffset: 185}}.build(client4, svc4, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Fragments": 1}},
		{Name: "ipv6 first fragment to a service: passed, counted",
			In:      frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(0, true, 7)}}}.build(client6, svc6, idPayload(id, 32)),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.Fragments": 1}},
		{Name: "ipv6 later fragment to a service: passed, counted",
			In:      frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.Fragment(185, false, 7)}}}.build(client6, svc6, idPayload(id, 32)),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.Fragments": 1}},
		{Name: "ipv4 first fragment to an unknown service: not counted",
			In: frame{ip4: pktbuild.IPv4{MF: true}}.build(client4, stranger, idPayload(id, 32)), WantRet: unspec},
		{Name: "ipv4 later fragment of anyone's datagram: counted (no ports to tell)",
			In: frame{ip4: pktbuild.IPv4{FragOffset: 185}}.build(client4, stranger, idPayload(id, 32)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.Fragments": 1}},

		// Hedges and the budget.
		{Name: "a hedge (skb mark = hedge mark) is not cloned again", In: req4, Skb: &skBuff{Mark: hedgeMark},
			WantRet: unspec},
		{Name: "another skb mark is a request like any", In: req4, Skb: &skBuff{Mark: 0x1}, WantRet: unspec,
			WantCounters: recorded, Check: f.leaves(pending4)},
		{Name: "no free token: recorded NOCLONE, not cloned", In: req4,
			Setup: func(tb testing.TB) { f.setTokens(tb, sV4, 0) }, WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.Requests": 1, "v4.BudgetExhausted": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqNoClone}, func(tb testing.TB, r bpftest.Result) {
				pendingSince(f, k4, reqNoClone)(tb, r)
				if got := f.state(tb, sV4).TokensMilli; got != v4Ratio*1000 {
					tb.Errorf("tokens %d milli, want %d (one request's deposit)", got, int(v4Ratio*1000))
				}
			})},
		{Name: "one deposit short of a token: the request's deposit makes it, the clone takes it", In: req4,
			Setup: func(tb testing.TB) { f.setTokens(tb, sV4, 1000-v4Ratio*1000) }, WantRet: unspec, WantCounters: recorded,
			Check: f.leaves(pending4, tokensAre(f, sV4, 0, "the deposit completed a token, the clone took it"))},
		{Name: "tokens for one clone only: taken, the next request finds none", In: req4,
			Setup: func(tb testing.TB) { f.setTokens(tb, sV4, 1000-v4Ratio*1000-1) }, WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.Requests": 1, "v4.BudgetExhausted": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqNoClone}, tokensAre(f, sV4, 999, "one milli-token short: nothing taken"))},
	})
}

// TestSplitCloneTargetMissing: bpf_clone_redirect to an ifindex that does not exist fails
// (-EINVAL); the request is still recorded, as NOCLONE, the failure is counted and the
// token the clone took goes back.
func TestSplitCloneTargetMissing(t *testing.T) {
	f := newFixture(t, fixtureOpts{missingDLIf: true})
	k := key(sV4, client4, 0x77)
	runCases(t, f, f.objs.HedgeSplit, []bpftest.Case{{Name: "clone error", In: datagram(client4, svc4, idPayload(0x77, 32)), WantRet: unspec,
		WantCounters: bpftest.Counters{"v4.Requests": 1, "v4.CloneErrors": 1},
		Check: f.leaves(map[hedgeHreqKey]uint32{k: reqNoClone}, func(tb testing.TB, r bpftest.Result) {
			pendingSince(f, k, reqNoClone)(tb, r)
			tokensAre(f, sV4, v4Burst*1000, "the failed clone's token given back")(tb, r)
		})}})
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
				t.Fatalf("the test runner ran it (verdict %s): make it a TestSplit malformed case", verdict(r.Ret))
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
		if r.Ret != unspec {
			t.Errorf("request %d: verdict %s", i, verdict(r.Ret))
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

	// The clones come out of the delay line (at the same fixed time: every survivor due,
	// none overdue): the survivors are hedged, the evicted ones dropped. (Their entries were
	// made due by a zero delay: rewriting them from user space would itself evict - an LRU
	// update takes a fresh node before it frees the old one.)
	survivors := f.board(t)
	tokens := f.state(t, sV4).TokensMilli
	before = after
	hedged := 0
	for i, in := range reqs {
		r, err := f.run(f.objs.HedgeRescue, in, 0)
		if err != nil {
			t.Fatal(err)
		}
		k := key(sV4, client4, uint64(0x500+i))
		_, survived := survivors[k]
		switch {
		case survived && r.Ret == redirect && r.Skb.Mark == hedgeMark:
			hedged++
		case !survived && r.Ret == shot:
		default:
			t.Errorf("clone %d (entry kept: %v): verdict %s, mark %#x", i, survived, verdict(r.Ret), r.Skb.Mark)
		}
	}
	after, err = f.counters()
	if err != nil {
		t.Fatal(err)
	}
	want := bpftest.Counters{"v4.HedgesSent": int64(hedged), "v4.ClonesOrphaned": int64(n - len(survivors))}
	if d := after.Sub(before).Diff(want); d != "" {
		t.Errorf("rescuer counter changes (got, want):\n%s", d)
	}
	if len(survivors) == 0 || hedged != len(survivors) {
		t.Errorf("%d hedged of %d surviving entries", hedged, len(survivors))
	}
	// Every clone took a token; the orphaned ones gave theirs back.
	if got, want := f.state(t, sV4).TokensMilli, tokens+int64(n-len(survivors))*1000; got != want {
		t.Errorf("budget %d milli-tokens after the rescuer, want %d (the orphaned clones' tokens back)", got, want)
	}
	t.Logf("%d requests, %d entries survived and hedged, %d clones orphaned", n, len(survivors), n-len(survivors))
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
	// due: an entry whose deadline has just passed at the run's time.
	due := func(k hedgeHreqKey) func(*fixture, uint64) error {
		return func(f *fixture, now uint64) error { return f.objs.Scoreboard.Put(k, dueEntry(now)) }
	}
	withState := func(k hedgeHreqKey, s uint32) func(testing.TB) {
		return func(tb testing.TB) { f.put(tb, k, hedgeHreq{State: s, HedgeReplica: replicaNone}) }
	}
	// hedgedTo checks the entry and the budget after a hedge to replica idx: the rescuer
	// takes no token (the clone took it at the splitter).
	hedgedTo := func(svc int, k hedgeHreqKey, idx uint8, tokens int64) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, r bpftest.Result) {
			tb.Helper()
			verifyChecksums(tb, r)
			e, _ := f.entry(tb, k)
			if e.HedgeReplica != idx || e.HedgedNs != r.Now {
				tb.Errorf("entry %+v: want hedge_replica %d, hedged_ns %d (the run's time)", e, idx, r.Now)
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
	refunded := tokensAre(f, sV4, v4Full+1000, "the dropped clone's token given back")
	hedge4 := bpftest.Counters{"v4.HedgesSent": 1}
	zp4 := zeroSumPayload(t, client4, rep4, p)
	zp6 := zeroSumPayload(t, client6, rep6, p)
	noSum := frame{l4: pktbuild.UDP{Checksum: ptr(0)}}
	opts := frame{ip4: pktbuild.IPv4{Options: []byte{1, 1, 1, 1, 1, 1, 1, 1}}}

	cases := []bpftest.Case{
		{Name: "clone of an answered request: dropped, entry deleted, token back", In: req4,
			Setup: withState(k4, reqAnswered), WantRet: shot, WantCounters: bpftest.Counters{"v4.ClonesAnswered": 1},
			Check: f.leaves(nil, refunded)},
		{Name: "clone with no entry (evicted or expired): dropped as orphaned, token back", In: req4, WantRet: shot,
			WantCounters: bpftest.Counters{"v4.ClonesOrphaned": 1}, Check: f.leaves(nil, refunded)},
		{Name: "clone not yet due: round the delay line again", In: req4,
			Setup: f.at(func(f *fixture, now uint64) error {
				return f.objs.Scoreboard.Put(k4, pending(now, now+uint64(time.Second)))
			}),
			WantRet: redirect, WantCounters: bpftest.Counters{"v4.Recirculations": 1, "dl.CarriedRecirculated": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, tokensAre(f, sV4, v4Full, "the clone keeps its token"))},
		{Name: "ipv4 due: destination rewritten to the other replica, marked, sent", In: req4, Setup: f.at(due(k4)),
			WantRet: redirect, WantOut: datagram(client4, rep4, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge4,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, hedgedTo(sV4, k4, 1, v4Full))},
		{Name: "ipv6 due: destination rewritten to the other replica, marked, sent", In: req6, Setup: f.at(due(k6)),
			WantRet: redirect, WantOut: datagram(client6, rep6, p), WantMark: bpftest.Mark(hedgeMark),
			WantCounters: bpftest.Counters{"v6.HedgesSent": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k6: reqHedged}, hedgedTo(sV6, k6, 1, 10000))},
		{ // Sent dueDelay ago: the far-overdue cutoff is a second away. The deadline is 0.9
			// of the early window ahead.
			Name: "due within half a period (cfg_early_ns): sent now", In: req4,
			Setup: f.at(func(f *fixture, now uint64) error {
				return f.objs.Scoreboard.Put(k4, pending(now-uint64(dueDelay), now+uint64(earlyAhead)))
			}),
			WantRet: redirect, WantOut: datagram(client4, rep4, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge4,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, hedgedTo(sV4, k4, 1, v4Full))},
		{Name: "ipv4 with options: rewritten past them", In: opts.build(client4, svc4, p), Setup: f.at(due(k4)),
			WantRet: redirect, WantOut: opts.build(client4, rep4, p), WantMark: bpftest.Mark(hedgeMark),
			WantCounters: hedge4, Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, hedgedTo(sV4, k4, 1, v4Full))},
		{Name: "vlan-tagged: rewritten past the tag", In: frame{vlan: true}.build(client4, svc4, p), Setup: f.at(due(k4)),
			WantRet: redirect, WantOut: frame{vlan: true}.build(client4, rep4, p), WantMark: bpftest.Mark(hedgeMark),
			WantCounters: hedge4, Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, hedgedTo(sV4, k4, 1, v4Full))},
		{Name: "ipv4 without udp checksum: stays without", In: noSum.build(client4, svc4, p), Setup: f.at(due(k4)),
			WantRet: redirect, WantOut: noSum.build(client4, rep4, p), WantMark: bpftest.Mark(hedgeMark),
			WantCounters: hedge4, Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, hedgedTo(sV4, k4, 1, v4Full))},
		{Name: "ipv4 rewrite whose udp checksum computes to 0: sent as 0xffff", In: datagram(client4, svc4, zp4),
			Setup: f.at(due(k4)), WantRet: redirect, WantOut: datagram(client4, rep4, zp4),
			WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge4,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, hedgedTo(sV4, k4, 1, v4Full))},
		{Name: "ipv6 rewrite whose udp checksum computes to 0: sent as 0xffff, never 0", In: datagram(client6, svc6, zp6),
			Setup: f.at(due(k6)), WantRet: redirect, WantOut: datagram(client6, rep6, zp6),
			WantMark: bpftest.Mark(hedgeMark), WantCounters: bpftest.Counters{"v6.HedgesSent": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k6: reqHedged}, hedgedTo(sV6, k6, 1, 10000))},
		{Name: "due, no free token: sent on the token the clone holds", In: req4,
			Setup: bpftest.Seq(func(tb testing.TB) { f.setTokens(tb, sV4, 999) }, f.at(due(k4))), WantRet: redirect,
			WantOut: datagram(client4, rep4, p), WantMark: bpftest.Mark(hedgeMark), WantCounters: hedge4,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, hedgedTo(sV4, k4, 1, 999))},
		{Name: "single-address service: hedged to its own address", In: datagram(client4, svcSolo, p),
			Setup: f.at(due(key(sSolo, client4, id))), WantRet: redirect, WantMark: bpftest.Mark(hedgeMark),
			WantCounters: bpftest.Counters{"solo.HedgesSent": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{key(sSolo, client4, id): reqHedged}, hedgedTo(sSolo, key(sSolo, client4, id), 0, 10000))},
		{Name: "two replicas, round robin at 0: first replica", In: datagram(client4, svcRR, p),
			Setup: f.at(due(key(sRR, client4, id))), WantRet: redirect, WantOut: datagram(client4, repRR1, p),
			WantMark: bpftest.Mark(hedgeMark), WantCounters: bpftest.Counters{"rr.HedgesSent": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{key(sRR, client4, id): reqHedged}, hedgedTo(sRR, key(sRR, client4, id), 1, 10000))},
		{Name: "two replicas, round robin at 1: second replica (other port)", In: datagram(client4, svcRR, p),
			Setup: bpftest.Seq(func(tb testing.TB) {
				st := f.state(tb, sRR)
				st.Rr = 1
				if err := f.objs.SvcStates.Put(uint32(sRR), st); err != nil {
					tb.Fatal(err)
				}
			}, f.at(due(key(sRR, client4, id)))),
			WantRet: redirect, WantOut: datagram(client4, repRR2, p), WantMark: bpftest.Mark(hedgeMark),
			WantCounters: bpftest.Counters{"rr.HedgesSent": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{key(sRR, client4, id): reqHedged}, hedgedTo(sRR, key(sRR, client4, id), 2, 10000))},
		{Name: "not a request of any service: dropped, counted", In: datagram(client4, stranger, p), WantRet: shot,
			WantCounters: bpftest.Counters{"global.RescueUnmatched": 1}},
		{Name: "malformed: dropped, counted", In: pktbuild.Truncate(req4, 14+20+4), WantRet: shot,
			WantCounters: bpftest.Counters{"global.Malformed": 1, "global.RescueUnmatched": 1}},
	}
	// Any state but PENDING means the clone has nothing left to do (a retransmission may
	// have replaced its entry); only ANSWERED entries are finished by it (the others still
	// wait for a response). Its token goes back either way.
	for _, s := range []uint32{reqNoClone, reqNoHedge, reqHedged, reqAnsweredHedge} {
		cases = append(cases, bpftest.Case{Name: "clone of a " + stateNames[s] + " request: dropped, entry kept, token back", In: req4,
			Setup: withState(k4, s), WantRet: shot, WantCounters: bpftest.Counters{"v4.ClonesAnswered": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: s}, refunded)})
	}
	runCases(t, f, f.objs.HedgeRescue, cases)
}

func TestResp(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x3003
	p := idPayload(id, 32)
	k4, k6 := key(sV4, client4, id), key(sV6, client6, id)
	// sentDue records k, at the run's time, as sent 5 ms ago with its deadline due in.
	sentDue := func(k hedgeHreqKey, s uint32, hedgeReplica uint8, due time.Duration) func(*fixture, uint64) error {
		return func(f *fixture, now uint64) error {
			e := pending(now-uint64(5*time.Millisecond), uint64(int64(now)+int64(due)))
			e.State, e.HedgeReplica = s, hedgeReplica
			return f.objs.Scoreboard.Put(k, e)
		}
	}
	// A deadline a second away.
	sent := func(k hedgeHreqKey, s uint32, hedgeReplica uint8) func(*fixture, uint64) error {
		return sentDue(k, s, hedgeReplica, time.Second)
	}
	// latency checks that one latency sample went into the service's current slot and
	// into the window total.
	latency := func(svc int) func(testing.TB, bpftest.Result) {
		return func(tb testing.TB, r bpftest.Result) {
			tb.Helper()
			verifyChecksums(tb, r)
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
	noLatency := func(tb testing.TB, _ bpftest.Result) {
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

	runCases(t, f, f.objs.HedgeResp, []bpftest.Case{
		{Name: "first response of a PENDING request: ANSWERED, latency recorded", In: datagram(svc4, client4, p),
			Setup: f.at(sent(k4, reqPending, replicaNone)), WantRet: unspec, WantCounters: first,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqAnswered}, latency(sV4))},
		{Name: "ipv6 first response of a PENDING request", In: datagram(svc6, client6, p),
			Setup: f.at(sent(k6, reqPending, replicaNone)), WantRet: unspec,
			WantCounters: bpftest.Counters{"v6.Responses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k6: reqAnswered}, latency(sV6))},
		{Name: "8-byte little-endian id matched", In: datagram(svcLE, client4, lePayload(leID, 16)),
			Setup: f.at(sent(kLE, reqPending, replicaNone)), WantRet: unspec,
			WantCounters: bpftest.Counters{"le8.Responses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{kLE: reqAnswered}, latency(sLE))},
		{Name: "hedged, the hedge's replica answers first: source rewritten to the service",
			In: datagram(rep4, client4, p), Setup: f.at(sent(k4, reqHedged, 1)), WantRet: unspec,
			WantOut: datagram(svc4, client4, p), WantCounters: won4,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}, latency(sV4))},
		{Name: "ipv6 hedged, the hedge's replica answers first: source rewritten", In: datagram(rep6, client6, p),
			Setup: f.at(sent(k6, reqHedged, 1)), WantRet: unspec, WantOut: datagram(svc6, client6, p), WantCounters: won6,
			Check: f.leaves(map[hedgeHreqKey]uint32{k6: reqAnsweredHedge}, latency(sV6))},
		{Name: "ipv4 rewrite whose udp checksum computes to 0: 0xffff", In: datagram(rep4, client4, zp4),
			Setup: f.at(sent(k4, reqHedged, 1)), WantRet: unspec, WantOut: datagram(svc4, client4, zp4), WantCounters: won4,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}, latency(sV4))},
		{Name: "ipv6 rewrite whose udp checksum computes to 0: 0xffff, never 0", In: datagram(rep6, client6, zp6),
			Setup: f.at(sent(k6, reqHedged, 1)), WantRet: unspec, WantOut: datagram(svc6, client6, zp6), WantCounters: won6,
			Check: f.leaves(map[hedgeHreqKey]uint32{k6: reqAnsweredHedge}, latency(sV6))},
		{Name: "hedged, the original answers first: not won, not rewritten", In: datagram(svc4, client4, p),
			Setup: f.at(sent(k4, reqHedged, 1)), WantRet: unspec, WantCounters: first,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqAnsweredHedge}, latency(sV4))},
		{Name: "the later response of a hedged request (from the original): dropped, entry deleted",
			In: datagram(svc4, client4, p), Setup: f.at(sent(k4, reqAnsweredHedge, 1)), WantRet: shot,
			WantCounters: bpftest.Counters{"v4.DuplicatesDropped": 1}, Check: f.leaves(nil, noLatency)},
		{Name: "the later response of a hedged request (from the hedge's replica): dropped",
			In: datagram(rep4, client4, p), Setup: f.at(sent(k4, reqAnsweredHedge, 1)), WantRet: shot,
			WantCounters: bpftest.Counters{"v4.DuplicatesDropped": 1}, Check: f.leaves(nil, noLatency)},
		{Name: "ipv6 later response of a hedged request: dropped", In: datagram(svc6, client6, p),
			Setup: f.at(sent(k6, reqAnsweredHedge, 1)), WantRet: shot,
			WantCounters: bpftest.Counters{"v6.DuplicatesDropped": 1}, Check: f.leaves(nil, noLatency)},
		{Name: "an unhedged request's second response (the application's duplicate): passed",
			In: datagram(svc4, client4, p), Setup: f.at(sent(k4, reqAnswered, replicaNone)), WantRet: unspec,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqAnswered}, noLatency)},
		{Name: "response of a NOCLONE request: completes it, entry removed", In: datagram(svc4, client4, p),
			Setup: f.at(sent(k4, reqNoClone, replicaNone)), WantRet: unspec, WantCounters: first,
			Check: f.leaves(nil, latency(sV4))},
		{Name: "response of a NOCLONE request after its deadline: completes it, counted as unhedged_late",
			In: datagram(svc4, client4, p), Setup: f.at(sentDue(k4, reqNoClone, replicaNone, -time.Millisecond)),
			WantRet: unspec, WantCounters: bpftest.Counters{"v4.Responses": 1, "v4.UnhedgedLate": 1},
			Check: f.leaves(nil, latency(sV4))},
		{Name: "response of a NOHEDGE request after its deadline: not unhedged_late (its clone had a token)",
			In: datagram(svc4, client4, p), Setup: f.at(sentDue(k4, reqNoHedge, replicaNone, -time.Millisecond)),
			WantRet: unspec, WantCounters: first, Check: f.leaves(nil, latency(sV4))},
		{Name: "response of a NOHEDGE request: completes it, entry removed", In: datagram(svc4, client4, p),
			Setup: f.at(sent(k4, reqNoHedge, replicaNone)), WantRet: unspec, WantCounters: first,
			Check: f.leaves(nil, latency(sV4))},
		{Name: "response for an unknown request: untouched, counted as unmatched", In: datagram(svc4, client4, p), WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.UnmatchedResponses": 1}, Check: f.leaves(nil, noLatency)},
		{Name: "response to another client port: untouched, counted as unmatched",
			In: datagram(svc4, netip.AddrPortFrom(client4.Addr(), 40001), p), Setup: f.at(sent(k4, reqPending, replicaNone)),
			WantRet: unspec, WantCounters: bpftest.Counters{"v4.UnmatchedResponses": 1}, Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},

		// Short and malformed responses pass untouched (the application may understand what
		// kedge cannot match) and leave the request open; short ones count per service,
		// malformed ones globally (no ports, so no service).
		{Name: "response shorter than the id: passed, counted, request stays open", In: datagram(svc4, client4, p[:3]),
			Setup: f.at(sent(k4, reqPending, replicaNone)), WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.ShortResponses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},
		{Name: "empty response: passed, counted", In: datagram(svc4, client4, nil),
			Setup: f.at(sent(k4, reqPending, replicaNone)), WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.ShortResponses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},
		{Name: "short response from the hedge's replica: passed, not rewritten, counted",
			In: datagram(rep4, client4, p[:2]), Setup: f.at(sent(k4, reqHedged, 1)), WantRet: unspec,
			WantCounters: bpftest.Counters{"v4.ShortResponses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqHedged}, noLatency)},
		{Name: "ipv6 short response: passed, counted", In: datagram(svc6, client6, p[:1]),
			Setup: f.at(sent(k6, reqPending, replicaNone)), WantRet: unspec,
			WantCounters: bpftest.Counters{"v6.ShortResponses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k6: reqPending}, noLatency)},
		{Name: "8-byte id at offset 2, 9-byte response: short", In: datagram(svcLE, client4, lePayload(leID, 9)),
			Setup: f.at(sent(kLE, reqPending, replicaNone)), WantRet: unspec,
			WantCounters: bpftest.Counters{"le8.ShortResponses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{kLE: reqPending}, noLatency)},
		{Name: "short datagram from a stranger: not a response, not counted", In: datagram(stranger, client4, p[:3]),
			WantRet: unspec, Check: f.leaves(nil, noLatency)},
		{Name: "malformed response (udp header cut): passed, counted globally",
			In: pktbuild.Truncate(datagram(svc4, client4, p), 14+20+4), Setup: f.at(sent(k4, reqPending, replicaNone)),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.MalformedResponses": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},
		{Name: "malformed response (udp length < 8): passed, counted globally",
			In:    frame{l4: pktbuild.UDP{Length: ptr(7)}}.build(svc4, client4, p),
			Setup: f.at(sent(k4, reqPending, replicaNone)), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.MalformedResponses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},
		{Name: "malformed response (ipv4 ihl < 5): passed, counted globally",
			In: frame{ip4: pktbuild.IPv4{IHL: ptr(4)}}.build(svc4, client4, p), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.MalformedResponses": 1}, Check: f.leaves(nil, noLatency)},
		{Name: "ipv6 malformed response (extension header cut): passed, counted globally",
			In:      pktbuild.Truncate(frame{ip6: pktbuild.IPv6{Ext: []pktbuild.Ext{pktbuild.HopByHop(1)}}}.build(svc6, client6, p), 14+40+1),
			WantRet: unspec, WantCounters: bpftest.Counters{"global.MalformedResponses": 1}, Check: f.leaves(nil, noLatency)},
		{Name: "malformed packet from anyone: counted too",
			In: pktbuild.Truncate(datagram(stranger, client4, p), 14+20+4), WantRet: unspec,
			WantCounters: bpftest.Counters{"global.MalformedResponses": 1}, Check: f.leaves(nil, noLatency)},
		{Name: "arp: not malformed",
			In: pktbuild.New().Ether(pktbuild.Ether{Type: 0x0806}).Payload(make([]byte, 28)).Build(), WantRet: unspec},

		{Name: "a tracked id from a stranger: untouched", In: datagram(stranger, client4, p),
			Setup: f.at(sent(k4, reqPending, replicaNone)), WantRet: unspec,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},
		{Name: "fragmented response: untouched, not counted",
			In: frame{ip4: pktbuild.IPv4{MF: true}}.build(svc4, client4, p), Setup: f.at(sent(k4, reqPending, replicaNone)),
			WantRet: unspec, Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},
		{Name: "later fragment of a response: untouched, not malformed",
			In:    frame{ip4: pktbuild.IPv4{FragOffset: 185}}.build(svc4, client4, p),
			Setup: f.at(sent(k4, reqPending, replicaNone)), WantRet: unspec,
			Check: f.leaves(map[hedgeHreqKey]uint32{k4: reqPending}, noLatency)},
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
			runCases(t, f, f.objs.HedgeSplit, []bpftest.Case{{Name: "request cloned with its deadline", In: req, Skb: &skBuff{Tstamp: rxTime}, WantRet: unspec,
				WantCounters: c.counters,
				Check: f.leaves(map[hedgeHreqKey]uint32{k: reqPending}, func(tb testing.TB, r bpftest.Result) {
					if r.Skb.Tstamp != rxTime {
						tb.Errorf("the request left with tstamp %d, want its own %d", r.Skb.Tstamp, rxTime)
					}
				})}})
		})
	}
}

// TestLatencyBucket checks stats.go's bucketOf (which user space uses to read lat_hist)
// against hist_bucket() in bpf/include/hedge.h as the kernel runs it: a response completes a
// request whose sent_ns lies a chosen latency before the run's (fixed) time, and the bucket
// that counted it must be bucketOf of that latency - at each bucket's edges too.
func TestLatencyBucket(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x5005
	in := datagram(svc4, client4, idPayload(id, 32))
	k := key(sV4, client4, id)
	var lats []uint64 // latencies in ns
	for _, us := range []uint64{0, 5, 15, 16, 17, 31, 32, 33} {
		lats = append(lats, us*1000)
	}
	// The edges of a spread of buckets, up to the last one (2^28 us, 268 s) and beyond: its
	// first microsecond, its last nanosecond.
	for _, b := range []int{20, 47, 48, 63, 64, 100, 150, 200, 250, 300, 350, 383, 384, 398, 399} {
		lo, hi := bucketBounds(b)
		lats = append(lats, lo*1000, hi*1000-1)
	}
	lats = append(lats, uint64(300*time.Second), f.now-1)
	for _, lat := range lats {
		f.reset(t)
		sent := f.now - lat
		f.put(t, k, pending(sent, sent+uint64(testDelay)))
		r, err := f.run(f.objs.HedgeResp, in, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.Ret != unspec {
			t.Fatalf("verdict %s", verdict(r.Ret))
		}
		got := nonZero(histAt(t, f.objs.LatHist, sV4*(histSlots+1)+histSlots))
		want := bucketOf(lat / 1000)
		if len(got) != 1 || got[want] != 1 {
			t.Errorf("latency %v: buckets %v, want one sample in bucket %d (bucketOf)", time.Duration(lat), got, want)
		}
	}
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
