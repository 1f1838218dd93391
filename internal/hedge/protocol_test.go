package hedge

import (
	"reflect"
	"strings"
	"testing"
)

// TestProtocolPresets checks what each preset sets, that the defaults port is added only
// where none is given, and that a second Validate (the agent's, then Start's) changes nothing.
func TestProtocolPresets(t *testing.T) {
	presets := func(extraReplica string) string {
		return `
interface: eth0
services:
  - name: dns
    protocol: dns
    address: 198.18.0.12
    replicas: [198.18.0.13, "198.18.0.14:5353"` + extraReplica + `]
  - name: mc
    protocol: memcached-udp
    address: "[2001:db8::12]"
    replicas: ["[2001:db8::13]:11212"]
  - name: plain
    address: 198.18.0.20:9999
`
	}
	if _, err := loadYAML(t, presets(`, "[2001:db8::1]"`)); err == nil {
		t.Fatal("a v6 replica of a v4 service was accepted")
	}
	c, err := loadYAML(t, presets(""))
	if err != nil {
		t.Fatal(err)
	}
	dns, mc, plain := c.Services[0], c.Services[1], c.Services[2]
	if !reflect.DeepEqual(dns.replicas, aps("198.18.0.12:53", "198.18.0.13:53", "198.18.0.14:5353")) {
		t.Errorf("dns addresses %v", dns.replicas)
	}
	if !reflect.DeepEqual(mc.replicas, aps("[2001:db8::12]:11211", "[2001:db8::13]:11212")) {
		t.Errorf("memcached addresses %v", mc.replicas)
	}
	if want := (RequestIDSpec{Offset: 0, Length: 2, Order: "big"}); dns.RequestID != want || mc.RequestID != want {
		t.Errorf("request ids %v, %v: want %v", dns.RequestID, mc.RequestID, want)
	}
	if got := RulesString(dns.Hedgeable); got != "2:00/f8" {
		t.Errorf("dns rule %s", got)
	}
	if got := RulesString(mc.Hedgeable); got != `8:"get " | 8:"gets " | 8:8000 | 8:8009 | 8:800c | 8:800d` {
		t.Errorf("memcached rule %s", got)
	}
	if plain.Protocol != ProtocolGeneric || plain.Hedgeable != nil || plain.RequestID.Length != DefaultIDLength {
		t.Errorf("generic service %+v", plain)
	}
	again := *c
	again.Services = append([]ServiceConfig(nil), c.Services...)
	if err := again.Validate(); err != nil {
		t.Fatalf("second Validate: %v", err)
	}
	if !reflect.DeepEqual(again.Services, c.Services) {
		t.Errorf("second Validate changed the services:\n%+v\n%+v", again.Services, c.Services)
	}
	// The preset's rule is the service's own copy.
	if &dns.Hedgeable[0] == &Protocols[ProtocolDNS].Hedgeable[0] {
		t.Error("the dns service shares the preset's rule slice")
	}
}

// TestHedgeableConfig checks rules as written in the file and on the command line, and the
// refusals with what to write instead.
func TestHedgeableConfig(t *testing.T) {
	c, err := loadYAML(t, `
interface: eth0
services:
  - address: 198.18.0.12:9999
    hedgeable:
      - {offset: 8, text: "get "}
      - {offset: 2, value: "0x00", mask: "0xf8"}
      - {offset: 0, value: "0x80 0x0c"}
  - protocol: dns
    address: 198.18.0.13
    hedgeable: [{offset: 2, value: "00", mask: "78"}]
`)
	if err != nil {
		t.Fatal(err)
	}
	if got := RulesString(c.Services[0].Hedgeable); got != `8:"get " | 2:00/f8 | 0:800c` {
		t.Errorf("rules %s", got)
	}
	if got := RulesString(c.Services[1].Hedgeable); got != "2:00/78" {
		t.Errorf("a service's own rule replaces its preset's: %s", got)
	}
	for _, tc := range []struct{ flag, want string }{
		{"2:00/f8", "2:00/f8"}, {"8:text:get ", `8:"get "`}, {"8:0x80 0x00", "8:8000"},
	} {
		r, err := ParseHedgeRule(tc.flag)
		if err == nil {
			err = r.validate()
		}
		if err != nil || r.String() != tc.want {
			t.Errorf("--hedgeable %q: %v, %v; want %s", tc.flag, r, err, tc.want)
		}
	}

	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown protocol", "protocol: http", `protocol "http" unknown: use dns, memcached-udp, generic`},
		{"preset with its own id", "protocol: dns\n    request_id: {offset: 0, length: 4}",
			"protocol dns sets the request id (offset 0, 2 bytes, big-endian): remove request_id, or use protocol: generic"},
		{"generic without a port", "protocol: generic\n    address: 198.18.0.30", `address "198.18.0.30": want ip:port`},
		{"value outside its mask", `hedgeable: [{offset: 2, value: "0x01", mask: "0xf0"}]`, "has bits outside mask"},
		{"mask of another length", `hedgeable: [{offset: 2, value: "0x0100", mask: "0xff"}]`, "give one mask byte per value byte"},
		{"too long", `hedgeable: [{offset: 2, text: "123456789"}]`, "9 bytes: a rule compares 1..8 bytes"},
		{"text and value", `hedgeable: [{offset: 2, text: "a", value: "61"}]`, "value and text exclude each other"},
		{"not hex", `hedgeable: [{offset: 2, value: "zz"}]`, "not hex bytes"},
		{"no value", `hedgeable: [{offset: 2}]`, "no value: give value"},
		{"offset", `hedgeable: [{offset: 1401, value: "00"}]`, "offset 1401: use 0..1400"},
		{"nine alternatives", "hedgeable: [" + strings.Repeat(`{offset: 0, value: "00"}, `, 8) + `{offset: 0, value: "00"}]`,
			"9 hedgeable alternatives, at most 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := "interface: eth0\nservices:\n  - name: s\n    " + tc.yaml
			if !strings.Contains(tc.yaml, "address:") {
				y += "\n    address: 198.18.0.12:9999"
			}
			_, err := loadYAML(t, y+"\n")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
