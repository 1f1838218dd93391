package hedge

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Protocols a service can name (`protocol:`, `--protocol`): each sets where the request id
// is, which requests may be hedged and the default port. docs/hedging.md lists their rules
// with the protocols' references.
const (
	ProtocolGeneric      = "generic"
	ProtocolDNS          = "dns"
	ProtocolMemcachedUDP = "memcached-udp"
)

// Protocol is a preset.
type Protocol struct {
	Name string
	// Port is the port of an address or replica given without one.
	Port      uint16
	RequestID RequestIDSpec
	// Hedgeable is the preset's rule: the requests that are safe to send twice.
	Hedgeable []HedgeRule
	// Reference is where the rule comes from.
	Reference string
}

// Protocols are the presets, by name. generic is the explicit request-id spec with every
// request hedgeable (no rule).
var Protocols = map[string]Protocol{
	ProtocolGeneric: {Name: ProtocolGeneric},
	// RFC 1035 4.1.1: a 16-bit ID, then QR (1 bit, 0: query) and OPCODE (4 bits, 0: QUERY);
	// NOTIFY (4, RFC 1996) and UPDATE (5, RFC 2136) change state, and a response (QR 1) is
	// no request: hedged only when byte 2 & 0xf8 is 0.
	ProtocolDNS: {Name: ProtocolDNS, Port: 53,
		RequestID: RequestIDSpec{Offset: 0, Length: 2, Order: "big"},
		Hedgeable: []HedgeRule{{Offset: 2, Value: []byte{0x00}, Mask: []byte{0xf8}}},
		Reference: "RFC 1035 section 4.1.1 (header: ID, QR, OPCODE); RFC 1996 (NOTIFY), RFC 2136 (UPDATE)"},
	// memcached's protocol.txt, "UDP protocol": an 8-byte frame header (request id, sequence
	// number, datagram count, reserved; the response repeats the request id), then the
	// command. Only reads are repeated: the text protocol's get and gets, the binary
	// protocol's GET, GETQ, GETK and GETKQ (magic 0x80, opcodes 0x00, 0x09, 0x0c, 0x0d).
	ProtocolMemcachedUDP: {Name: ProtocolMemcachedUDP, Port: 11211,
		RequestID: RequestIDSpec{Offset: 0, Length: 2, Order: "big"},
		Hedgeable: []HedgeRule{
			{Offset: 8, Value: []byte("get ")},
			{Offset: 8, Value: []byte("gets ")},
			{Offset: 8, Value: []byte{0x80, 0x00}},
			{Offset: 8, Value: []byte{0x80, 0x09}},
			{Offset: 8, Value: []byte{0x80, 0x0c}},
			{Offset: 8, Value: []byte{0x80, 0x0d}},
		},
		Reference: "memcached protocol.txt (UDP protocol: frame header; commands get, gets) and protocol_binary.h (GET, GETQ, GETK, GETKQ)"},
}

// ProtocolNames lists the presets in the order the help shows them.
var ProtocolNames = []string{ProtocolDNS, ProtocolMemcachedUDP, ProtocolGeneric}

// Limits of the hedgeable rule (enum hedge_limits in bpf/include/hedge.h).
var (
	hedgeRulesMax  = int(hedgeHedgeLimitsHEDGE_RULES_MAX)
	hedgeRuleBytes = int(hedgeHedgeLimitsHEDGE_RULE_BYTES)
)

// maxRuleOffset is the largest offset of a rule (the request id's too): within a datagram.
const maxRuleOffset = 1400

// HedgeRule is one alternative of a service's hedgeable rule: a request is hedgeable when
// the bytes at Offset of its UDP payload, ANDed with Mask, equal Value (bpf/hedge/hedgeable.h).
// A nil Mask is all ones.
type HedgeRule struct {
	Offset int
	Value  []byte
	Mask   []byte
}

// hedgeRuleYAML is a rule as written: value and mask in hex ("0x80 0x00", "8000", "0x00"), or
// text ("get ").
type hedgeRuleYAML struct {
	Offset int    `yaml:"offset"`
	Value  string `yaml:"value"`
	Mask   string `yaml:"mask"`
	Text   string `yaml:"text"`
}

// YAMLShape gives strictyaml the keys of a rule's mapping.
func (HedgeRule) YAMLShape() any { return hedgeRuleYAML{} }

func (r *HedgeRule) UnmarshalYAML(n *yaml.Node) error {
	var raw hedgeRuleYAML
	if err := n.Decode(&raw); err != nil {
		return err
	}
	rule, err := parseRule(raw)
	if err != nil {
		return fmt.Errorf("line %d: hedgeable: %w", n.Line, err)
	}
	*r = rule
	return nil
}

func parseRule(raw hedgeRuleYAML) (HedgeRule, error) {
	r := HedgeRule{Offset: raw.Offset}
	switch {
	case raw.Text != "" && raw.Value != "":
		return r, fmt.Errorf("value and text exclude each other: give the bytes in hex (value) or as text")
	case raw.Text != "":
		r.Value = []byte(raw.Text)
	case raw.Value != "":
		v, err := parseHex(raw.Value)
		if err != nil {
			return r, fmt.Errorf("value %q: %w", raw.Value, err)
		}
		r.Value = v
	default:
		return r, fmt.Errorf("no value: give value (hex, e.g. 0x00) or text (e.g. \"get \")")
	}
	if raw.Mask != "" {
		m, err := parseHex(raw.Mask)
		if err != nil {
			return r, fmt.Errorf("mask %q: %w", raw.Mask, err)
		}
		r.Mask = m
	}
	return r, nil
}

// parseHex reads bytes written in hex, with or without 0x and spaces: "0x80 0x00", "8000".
func parseHex(s string) ([]byte, error) {
	var b strings.Builder
	for _, f := range strings.Fields(s) {
		b.WriteString(strings.TrimPrefix(strings.TrimPrefix(f, "0x"), "0X"))
	}
	out, err := hex.DecodeString(b.String())
	if err != nil || len(out) == 0 {
		return nil, fmt.Errorf("not hex bytes (write e.g. 0x80 0x00 or 8000)")
	}
	return out, nil
}

// ParseHedgeRule reads the --hedgeable flag's form: OFFSET:HEX[/MASK] ("2:00/f8") or
// OFFSET:text:TEXT ("8:text:get ").
func ParseHedgeRule(s string) (HedgeRule, error) {
	off, rest, ok := strings.Cut(s, ":")
	o, err := strconv.Atoi(off)
	if !ok || err != nil {
		return HedgeRule{}, fmt.Errorf("%q: want OFFSET:HEX[/MASK] (e.g. 2:00/f8) or OFFSET:text:TEXT (e.g. '8:text:get ')", s)
	}
	raw := hedgeRuleYAML{Offset: o}
	if t, isText := strings.CutPrefix(rest, "text:"); isText {
		raw.Text = t
	} else {
		raw.Value, raw.Mask, _ = strings.Cut(rest, "/")
	}
	r, err := parseRule(raw)
	if err != nil {
		return r, fmt.Errorf("%q: %w", s, err)
	}
	return r, nil
}

// validate checks the rule and fills its mask (all ones when not given).
func (r *HedgeRule) validate() error {
	if len(r.Value) == 0 || len(r.Value) > hedgeRuleBytes {
		return fmt.Errorf("%d bytes: a rule compares 1..%d bytes", len(r.Value), hedgeRuleBytes)
	}
	if r.Mask == nil {
		r.Mask = make([]byte, len(r.Value))
		for i := range r.Mask {
			r.Mask[i] = 0xff
		}
	}
	if len(r.Mask) != len(r.Value) {
		return fmt.Errorf("mask of %d bytes for a value of %d: give one mask byte per value byte", len(r.Mask), len(r.Value))
	}
	for i := range r.Value {
		if r.Value[i]&^r.Mask[i] != 0 {
			return fmt.Errorf("value %x has bits outside mask %x: it could never match", r.Value, r.Mask)
		}
	}
	if r.Offset < 0 || r.Offset > maxRuleOffset {
		return fmt.Errorf("offset %d: use 0..%d", r.Offset, maxRuleOffset)
	}
	return nil
}

// String renders a rule as `kedge hedge status` shows it: `8:"get "`, `2:00/f8`.
func (r HedgeRule) String() string {
	full := true
	for _, m := range r.Mask {
		full = full && m == 0xff
	}
	printable := full
	for _, c := range r.Value {
		printable = printable && c >= 0x20 && c < 0x7f
	}
	switch {
	case printable:
		return fmt.Sprintf("%d:%q", r.Offset, r.Value)
	case full:
		return fmt.Sprintf("%d:%x", r.Offset, r.Value)
	}
	return fmt.Sprintf("%d:%x/%x", r.Offset, r.Value, r.Mask)
}

// RulesString renders a rule's alternatives ("every request" without any).
func RulesString(rules []HedgeRule) string {
	if len(rules) == 0 {
		return "every request"
	}
	s := make([]string, len(rules))
	for i, r := range rules {
		s[i] = r.String()
	}
	return strings.Join(s, " | ")
}

// withDefaultPort adds the protocol's port to an address written without one.
func withDefaultPort(addr string, port uint16) string {
	if port == 0 || addr == "" {
		return addr
	}
	if _, _, err := splitHostPortLoose(addr); err == nil {
		return addr
	}
	host := strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
	if strings.Contains(host, ":") {
		return fmt.Sprintf("[%s]:%d", host, port)
	}
	return fmt.Sprintf("%s:%d", host, port)
}

// splitHostPortLoose tells an address with a port ("1.2.3.4:53", "[::1]:53") from one
// without ("1.2.3.4", "::1", "[::1]").
func splitHostPortLoose(addr string) (string, string, error) {
	if strings.HasPrefix(addr, "[") {
		i := strings.LastIndex(addr, "]:")
		if i < 0 {
			return "", "", fmt.Errorf("no port")
		}
		return addr[1:i], addr[i+2:], nil
	}
	if strings.Count(addr, ":") != 1 {
		return "", "", fmt.Errorf("no port")
	}
	h, p, _ := strings.Cut(addr, ":")
	return h, p, nil
}

// validateProtocol applies the service's protocol: its request id (a service that names a
// preset gives none of its own), its hedgeable rule (unless the service gives one) and its
// default port; then it checks the rule.
func (s *ServiceConfig) validateProtocol(where string) error {
	if s.Protocol == "" {
		s.Protocol = ProtocolGeneric
	}
	p, ok := Protocols[s.Protocol]
	if !ok {
		return fmt.Errorf("%s: protocol %q unknown: use %s", where, s.Protocol, strings.Join(ProtocolNames, ", "))
	}
	if p.Name != ProtocolGeneric {
		if s.RequestID != (RequestIDSpec{}) && s.RequestID != p.RequestID {
			return fmt.Errorf("%s: protocol %s sets the request id (%s): remove request_id, or use protocol: generic",
				where, p.Name, p.RequestID)
		}
		s.RequestID = p.RequestID
		s.Address = withDefaultPort(s.Address, p.Port)
		for i := range s.Replicas {
			s.Replicas[i] = withDefaultPort(s.Replicas[i], p.Port)
		}
		if s.Hedgeable == nil {
			s.Hedgeable = append([]HedgeRule(nil), p.Hedgeable...)
		}
	}
	if len(s.Hedgeable) > hedgeRulesMax {
		return fmt.Errorf("%s: %d hedgeable alternatives, at most %d", where, len(s.Hedgeable), hedgeRulesMax)
	}
	for i := range s.Hedgeable {
		if err := s.Hedgeable[i].validate(); err != nil {
			return fmt.Errorf("%s: hedgeable[%d]: %w", where, i, err)
		}
	}
	return nil
}
