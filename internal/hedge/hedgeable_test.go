package hedge

// BPF_PROG_TEST_RUN fixtures of the hedgeable rule (bpf/hedge/hedgeable.h): the presets' rules
// (DNS: standard queries only; memcached: get and gets, text and binary), a rule's edges
// (mask, the last byte of the payload, one byte short), and the response of a request that
// was not hedgeable passing untouched.

import (
	"encoding/binary"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// dnsMsg is a DNS message with id and the flags' first byte (QR, opcode, AA, TC, RD), one
// question for example.com A.
func dnsMsg(id uint16, flags byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, flags, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	b = append(b, 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1)
	return b
}

// mcMsg is a memcached UDP datagram: the 8-byte frame header (id, sequence 0, 1 datagram)
// and the command.
func mcMsg(id uint16, cmd []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0, 0, 0, 1, 0, 0)
	return append(b, cmd...)
}

func TestHedgeable(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const id = 0x4242
	hedged := func(svc int, name string) bpftest.Case {
		return bpftest.Case{WantRet: unspec, WantCounters: bpftest.Counters{name + ".Requests": 1, name + ".Clones": 1},
			Check: f.leaves(map[hedgeHreqKey]uint32{key(svc, client4, id): reqPending})}
	}
	passed := func(name string) bpftest.Case {
		return bpftest.Case{WantRet: unspec, WantCounters: bpftest.Counters{name + ".Requests": 1, name + ".NotHedgeable": 1}}
	}
	at := func(c bpftest.Case, name string, in []byte) bpftest.Case {
		c.Name, c.In = name, in
		return c
	}
	dns := func(flags byte) []byte { return datagram(client4, svcDNS, dnsMsg(id, flags)) }
	mc := func(cmd string) []byte { return datagram(client4, svcMC, mcMsg(id, []byte(cmd))) }
	rule := func(p []byte) []byte { return datagram(client4, svcRule, p) }
	runCases(t, f, f.objs.HedgeSplit, []bpftest.Case{
		at(hedged(sDNS, "dns"), "dns: standard query, recursion desired", dns(0x01)),
		at(hedged(sDNS, "dns"), "dns: standard query, no flags", dns(0x00)),
		at(hedged(sDNS, "dns"), "dns: standard query, AA TC RD set (the mask's low bits)", dns(0x07)),
		at(passed("dns"), "dns: UPDATE (opcode 5)", dns(5<<3)),
		at(passed("dns"), "dns: NOTIFY (opcode 4)", dns(4<<3|0x04)),
		at(passed("dns"), "dns: STATUS (opcode 2)", dns(2<<3)),
		at(passed("dns"), "dns: a response (QR) sent to the server", dns(0x81)),
		at(passed("dns"), "dns: two bytes, the id only", datagram(client4, svcDNS, []byte{0x42, 0x42})),

		at(hedged(sMC, "mc"), "memcached: get", mc("get foo\r\n")),
		at(hedged(sMC, "mc"), "memcached: gets of two keys", mc("gets foo bar\r\n")),
		at(hedged(sMC, "mc"), "memcached: binary GET", mc("\x80\x00\x00\x03")),
		at(hedged(sMC, "mc"), "memcached: binary GETKQ", mc("\x80\x0d\x00\x03")),
		at(passed("mc"), "memcached: set", mc("set foo 0 0 3\r\nbar\r\n")),
		at(passed("mc"), "memcached: delete", mc("delete foo\r\n")),
		at(passed("mc"), "memcached: incr", mc("incr n 1\r\n")),
		at(passed("mc"), "memcached: gat (get and touch) is not a get", mc("gat 0 foo\r\n")),
		at(passed("mc"), "memcached: getx (no space after get)", mc("getx foo\r\n")),
		at(passed("mc"), "memcached: binary SET", mc("\x80\x01\x00\x03")),
		at(passed("mc"), "memcached: response magic 0x81 with GET's opcode", mc("\x81\x00\x00\x03")),
		at(passed("mc"), "memcached: GET in upper case", mc("GET foo\r\n")),
		at(passed("mc"), "memcached: frame header and \"get\" only (short of the rule's 4 bytes)", mc("get")),

		at(hedged(sRule, "rule"), "rule: low nibble 5 under a set high nibble", rule([]byte{0, 0x42, 0x42, 0xf5})),
		at(passed("rule"), "rule: low nibble 6", rule([]byte{0, 0x42, 0x42, 0x06})),
		at(passed("rule"), "rule: payload ends before byte 3", rule([]byte{0, 0x42, 0x42})),
		at(hedged(sRule, "rule"), "rule: 8 bytes ending with the payload", rule([]byte("\x00\x42\x42\x00ABCDEFGH"))),
		at(passed("rule"), "rule: one byte short of 8", rule([]byte("\x00\x42\x42\x00ABCDEFG"))),
		at(passed("rule"), "rule: last byte differs", rule([]byte("\x00\x42\x42\x00ABCDEFGX"))),
	})
}

// TestNotHedgeableResponse: the response to a request that was not hedgeable passes
// untouched (nothing recorded: counted unmatched), and so does a stranger's.
func TestNotHedgeableResponse(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	runCases(t, f, f.objs.HedgeResp, []bpftest.Case{
		{Name: "memcached: the set's STORED from the service", In: datagram(svcMC, client4, mcMsg(7, []byte("STORED\r\n"))),
			WantRet: unspec, WantCounters: bpftest.Counters{"mc.UnmatchedResponses": 1}},
		{Name: "memcached: STORED from the replica (not rewritten)", In: datagram(repMC, client4, mcMsg(7, []byte("STORED\r\n"))),
			WantRet: unspec, WantCounters: bpftest.Counters{"mc.UnmatchedResponses": 1}},
		{Name: "dns: the UPDATE's answer", In: datagram(svcDNS, client4, dnsMsg(7, 0xa8)),
			WantRet: unspec, WantCounters: bpftest.Counters{"dns.UnmatchedResponses": 1}},
	})
}
