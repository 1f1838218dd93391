package hedge

// The presets on datagrams captured from real programs (their origin is in
// internal/hedge/testdata/captured/README.md): dig's query and dnsmasq's answer, PHP pecl
// memcache's UDP get and memcached's answer, memcslap's UDP set. A request the preset may
// repeat is recorded under the id the preset reads from it, and the server's real answer
// finds it there; the set passes, not hedgeable.

import (
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

func captured(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "captured", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPresetsOnCapturedPackets(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	answered := func(name, counters string, svc int, at netip.AddrPort) bpftest.Case {
		req, resp := captured(t, name+"-request.bin"), captured(t, name+"-response.bin")
		id := uint64(binary.BigEndian.Uint16(req))
		return bpftest.Case{Name: name + ": request recorded under its id, the real answer matches it",
			Steps: []bpftest.Case{
				{Name: "request", Prog: f.objs.HedgeSplit, In: datagram(client4, at, req), WantRet: unspec, WantSame: true},
				{Name: "answer", Prog: f.objs.HedgeResp, In: datagram(at, client4, resp), WantRet: unspec, WantSame: true},
			},
			WantCounters: bpftest.Counters{counters + ".Requests": 1, counters + ".Clones": 1, counters + ".Responses": 1},
			Check:        f.leaves(map[hedgeHreqKey]uint32{key(svc, client4, id): reqAnswered})}
	}
	runCases(t, f, f.objs.HedgeSplit, []bpftest.Case{
		answered("dns", "dns", sDNS, svcDNS),
		answered("memcached-get", "mc", sMC, svcMC),
		{Name: "memcached-set: not hedgeable, passed", In: datagram(client4, svcMC, captured(t, "memcached-set-request.bin")),
			WantRet: unspec, WantCounters: bpftest.Counters{"mc.Requests": 1, "mc.NotHedgeable": 1}},
	})
}
