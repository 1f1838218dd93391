package hedge

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func loadYAML(t *testing.T, text string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hedge.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadConfig(path)
}

func aps(s ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddrPort(a)
	}
	return out
}

// TestLoadConfigValid checks the accepted shapes and the defaults Validate fills in.
func TestLoadConfigValid(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		check func(t *testing.T, c *Config)
	}{
		{
			name: "minimal fixed delay gets every default",
			yaml: `
interface: eth0
services:
  - address: 198.18.0.12:9999
    delay: 10ms
`,
			check: func(t *testing.T, c *Config) {
				want := DelayLineConfig{Backend: BackendAuto, Period: Duration(10 * time.Millisecond), RateMbit: 100, FillerBytes: 1514}
				if c.DelayLine != want {
					t.Errorf("delay line %+v, want %+v", c.DelayLine, want)
				}
				if c.ScoreboardSize != 65536 || c.TTL != Duration(5*time.Second) || c.Tick != Duration(3*time.Second) || c.Mark != 0x6b650000 {
					t.Errorf("defaults: scoreboard %d ttl %v tick %v mark %#x", c.ScoreboardSize, c.TTL, c.Tick, c.Mark)
				}
				s := c.Services[0]
				if s.Name != "svc0" || s.RequestID != (RequestIDSpec{Offset: 0, Length: 4, Order: "big"}) ||
					s.Budget != (BudgetSpec{Mode: BudgetWindow, Ratio: 0.05, Burst: 10, Window: Duration(10 * time.Second)}) || s.Delay != (DelaySpec{Fixed: 10 * time.Millisecond}) {
					t.Errorf("service defaults %+v", s)
				}
				if !reflect.DeepEqual(s.replicas, aps("198.18.0.12:9999")) {
					t.Errorf("replicas %v: a service without replicas hedges to its own address", s.replicas)
				}
			},
		},
		{
			name: "replica choice and hedges per request: defaults rr and 1; p50 and 3 with three other replicas; a single address takes any count",
			yaml: `
interface: eth0
services:
  - name: plain
    address: 198.18.0.12:9999
    replicas: [198.18.0.13:9999]
  - name: many
    address: 198.18.0.22:9999
    replicas: [198.18.0.23:9999, 198.18.0.24:9999, 198.18.0.25:9999]
    replica_choice: p50
    max_hedges: 3
  - name: solo
    address: 198.18.0.32:9999
    max_hedges: 4
`,
			check: func(t *testing.T, c *Config) {
				got := []string{}
				for _, s := range c.Services {
					got = append(got, fmt.Sprintf("%s %s %d", s.Name, s.ReplicaChoice, s.MaxHedges))
				}
				if want := []string{"plain rr 1", "many p50 3", "solo rr 4"}; !reflect.DeepEqual(got, want) {
					t.Errorf("got %v, want %v", got, want)
				}
			},
		},
		{
			name: "a service without delay takes DefaultDelay, as the --delay flag does",
			yaml: `
interface: eth0
services:
  - address: 198.18.0.12:9999
`,
			check: func(t *testing.T, c *Config) {
				if d := c.Services[0].Delay; d != (DelaySpec{Fixed: DefaultDelay}) || DefaultDelay != 10*time.Millisecond {
					t.Errorf("delay %+v, want the default %v", d, DefaultDelay)
				}
				if c.DelayLine.Period != Duration(DefaultDelay) {
					t.Errorf("delay-line period %v, want the default delay", time.Duration(c.DelayLine.Period))
				}
			},
		},
		{
			name: "quantile delay, IPv6, replicas, explicit everything",
			yaml: `
interface: veth1
delay_line: {backend: conveyor, period: 2ms, rate_mbit: 200, filler_bytes: 512}
scoreboard_size: 1024
ttl: 2s
tick: 200ms
mark: 0x1234
services:
  - name: kv
    address: "[2001:db8::c]:53"
    replicas: ["[2001:db8::d]:53", "[2001:db8::e]:5353"]
    request_id: {offset: 2, length: 8, order: little}
    delay: {quantile: 0.99, min: 1ms, max: 50ms, min_samples: 20}
    budget: {ratio: 0.1, burst: 5}
`,
			check: func(t *testing.T, c *Config) {
				want := DelayLineConfig{Backend: BackendConveyor, Period: Duration(2 * time.Millisecond), RateMbit: 200, FillerBytes: 512}
				if c.DelayLine != want || c.ScoreboardSize != 1024 || c.TTL != Duration(2*time.Second) || c.Tick != Duration(200*time.Millisecond) || c.Mark != 0x1234 {
					t.Errorf("config %+v", c)
				}
				s := c.Services[0]
				if s.Delay != (DelaySpec{Quantile: 0.99, Min: time.Millisecond, Max: 50 * time.Millisecond, MinSamples: 20}) {
					t.Errorf("delay %+v", s.Delay)
				}
				if s.RequestID != (RequestIDSpec{Offset: 2, Length: 8, Order: "little"}) || s.Budget != (BudgetSpec{Mode: BudgetWindow, Ratio: 0.1, Burst: 5, Window: Duration(10 * time.Second)}) {
					t.Errorf("service %+v", s)
				}
				if !reflect.DeepEqual(s.replicas, aps("[2001:db8::c]:53", "[2001:db8::d]:53", "[2001:db8::e]:5353")) {
					t.Errorf("replicas %v", s.replicas)
				}
				if got := s.Delay.String(); got != "p99 [1ms, 50ms]" {
					t.Errorf("delay string %q", got)
				}
			},
		},
		{
			name: "several services: period is the smallest delay, mapped addresses unmapped, own address not repeated",
			yaml: `
interface: eth0
services:
  - name: a
    address: "[::ffff:198.18.0.12]:9999"
    replicas: [198.18.0.12:9999, "[::ffff:198.18.0.13]:9999"]
    delay: 20ms
  - name: b
    address: 198.18.0.12:7000
    delay: {quantile: 0.95, min: 3ms, max: 30ms}
    budget: {ratio: 0, burst: 1}
`,
			check: func(t *testing.T, c *Config) {
				if c.DelayLine.Period != Duration(3*time.Millisecond) {
					t.Errorf("period %v, want the smallest delay (b's min, 3ms)", time.Duration(c.DelayLine.Period))
				}
				if !reflect.DeepEqual(c.Services[0].replicas, aps("198.18.0.12:9999", "198.18.0.13:9999")) {
					t.Errorf("a's replicas %v", c.Services[0].replicas)
				}
				b := c.Services[1]
				if b.Delay.MinSamples != 100 || b.Budget != (BudgetSpec{Mode: BudgetWindow, Ratio: 0, Burst: 1, Window: Duration(10 * time.Second)}) {
					t.Errorf("b: min_samples %d budget %+v (a zero ratio with a burst is kept)", b.Delay.MinSamples, b.Budget)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadYAML(t, tt.yaml)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
			// Validate again (hedge.Start does): same result.
			again := *c
			again.Services = append([]ServiceConfig(nil), c.Services...)
			if err := again.Validate(); err != nil || !reflect.DeepEqual(&again, c) {
				t.Errorf("second Validate: %v, changed %+v -> %+v", err, c, again)
			}
		})
	}
}

// TestLoadConfigErrors checks that every rejected config says what is wrong and what to do.
func TestLoadConfigErrors(t *testing.T) {
	svc := func(fields string) string {
		return "interface: eth0\nservices:\n  - name: s\n    address: 198.18.0.12:9999\n" + fields
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"no interface", "services: [{address: 198.18.0.12:9999, delay: 10ms}]", "interface is required: the client-side interface"},
		{"no services", "interface: eth0", "no services: declare at least one under 'services'"},
		{"unknown key", svc("    delay: 10ms\n    dealy: 5ms\n"), `line 6: services[0]: unknown key "dealy": did you mean "delay"?`},
		{"unknown top key", "interfce: eth0\nservices: [{address: 198.18.0.12:9999}]", `line 1: unknown key "interfce": did you mean "interface"?`},
		{"unknown delay key", svc("    delay: {quantile: 0.9, min: 1ms, mx: 9ms}\n"), `line 5: services[0].delay: unknown key "mx": did you mean "max"?`},
		{"unknown request_id key", svc("    request_id: {ofset: 2}\n"), `line 5: services[0].request_id: unknown key "ofset": did you mean "offset"?`},
		{"empty file", "", "is empty: declare an interface and its services"},
		{"comments only", "# nothing yet\n", "is empty: declare an interface and its services"},
		{"bad duration", "interface: eth0\nttl: forever\nservices: [{address: 198.18.0.12:9999, delay: 10ms}]", `"forever" is not a duration (use e.g. 10ms, 1.5s)`},
		{"bad delay scalar", svc("    delay: soon\n"), `delay "soon" is neither a duration (10ms) nor {quantile, min, max}`},
		{"unknown backend", "interface: eth0\ndelay_line: {backend: fq}\nservices: [{address: 198.18.0.12:9999, delay: 10ms}]", `delay_line.backend "fq" unknown: use auto, conveyor, netem or edt`},
		{"filler too small", "interface: eth0\ndelay_line: {filler_bytes: 10}\nservices: [{address: 198.18.0.12:9999, delay: 10ms}]", "delay_line.filler_bytes 10 out of range: use 128..3600"},
		{"filler too large to circulate", "interface: eth0\ndelay_line: {filler_bytes: 4500}\nservices: [{address: 198.18.0.12:9999, delay: 10ms}]", "delay_line.filler_bytes 4500 out of range: use 128..3600"},
		{"rate too high", "interface: eth0\ndelay_line: {rate_mbit: 20000}\nservices: [{address: 198.18.0.12:9999, delay: 10ms}]", "delay_line.rate_mbit 20000 out of range: use 1..10000"},
		{"period too short", "interface: eth0\ndelay_line: {period: 100us}\nservices: [{address: 198.18.0.12:9999, delay: 10ms}]", "delay_line.period 100µs out of range: use 200us..10s"},
		{"address without port", "interface: eth0\nservices: [{name: s, address: 198.18.0.12, delay: 10ms}]", `service "s": address "198.18.0.12": want ip:port`},
		{"bad replica", svc("    delay: 10ms\n    replicas: [srv2]\n"), `service "s": replica "srv2": want ip:port`},
		{"mixed families", svc("    delay: 10ms\n    replicas: [\"[2001:db8::d]:9999\"]\n"), "differ in IP family"},
		{"too many replicas", svc("    delay: 10ms\n    replicas: [198.18.0.1:1, 198.18.0.1:2, 198.18.0.1:3, 198.18.0.1:4, 198.18.0.1:5, 198.18.0.1:6, 198.18.0.1:7, 198.18.0.1:8]\n"), "9 replicas, at most 8"},
		{"shared address", "interface: eth0\nservices: [{name: a, address: 198.18.0.12:9999, delay: 10ms}, {name: b, address: \"[::ffff:198.18.0.12]:9999\", delay: 10ms}]", `services "a" and "b" share address 198.18.0.12:9999`},
		{"id too long", svc("    delay: 10ms\n    request_id: {length: 9}\n"), "request_id.length 9: use 1..8 bytes"},
		{"id offset negative", svc("    delay: 10ms\n    request_id: {offset: -1}\n"), "request_id.offset -1: use 0..1400"},
		{"id order", svc("    delay: 10ms\n    request_id: {order: middle}\n"), `request_id.order "middle": use big or little`},
		{"zero delay", svc("    delay: 0s\n"), "line 5: delay 0s out of range: use 200us..10s (omit it for 10ms)"},
		{"negative delay", svc("    delay: -5ms\n"), "delay -5ms out of range: use 200us..10s"},
		{"id length zero", svc("    request_id: {length: 0}\n"), "request_id.length 0: use 1..8 bytes (omit it for 4)"},
		{"delay too short", svc("    delay: 100us\n"), "delay 100µs out of range: use 200us..10s"},
		{"quantile of one", svc("    delay: {quantile: 1, min: 1ms, max: 5ms}\n"), "delay.quantile 1: use a fraction in (0, 1), e.g. 0.95"},
		{"quantile negative", svc("    delay: {quantile: -0.5, min: 1ms, max: 5ms}\n"), "delay.quantile -0.5: use a fraction in (0, 1)"},
		{"min above max", svc("    delay: {quantile: 0.9, min: 10ms, max: 5ms}\n"), "delay needs 200us <= min <= max <= 10s (got min 10ms, max 5ms)"},
		{"quantile without clamps", svc("    delay: {quantile: 0.9}\n"), "delay needs 200us <= min <= max <= 10s (got min 0s, max 0s)"},
		{"ratio above one", svc("    delay: 10ms\n    budget: {ratio: 1.5, burst: 1}\n"), "budget.ratio 1.5: use 0..1"},
		{"burst zero", svc("    delay: 10ms\n    budget: {ratio: 0.1}\n"), "budget.burst 0: use 1..100000"},
		{"unknown budget mode", svc("    budget: {mode: leaky}\n"), `budget.mode "leaky": use window or bucket`},
		{"window too short", svc("    budget: {mode: window, window: 100ms}\n"), "budget.window 100ms: use 1s..1h"},
		{"window with a bucket", svc("    budget: {mode: bucket, window: 5s}\n"), "budget.window is for mode window"},
		{"unknown replica choice", svc("    replica_choice: fastest\n"), `replica_choice "fastest": use rr (round robin) or p50`},
		{"max_hedges too many", svc("    max_hedges: 5\n"), "max_hedges 5: use 1..4"},
		{"max_hedges negative", svc("    max_hedges: -1\n"), "max_hedges -1: use 1..4"},
		{"more hedges than other replicas", svc("    replicas: [198.18.0.13:9999, 198.18.0.14:9999]\n    max_hedges: 3\n"),
			"max_hedges 3 but 2 other replica(s): each hedge goes to a different one; lower max_hedges to 2 or add replicas"},
		{"ttl below twice the delay", "interface: eth0\nttl: 1s\nservices: [{name: s, address: 198.18.0.12:9999, delay: 800ms}]", `ttl 1s is shorter than twice service "s"'s largest delay 800ms: raise ttl`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, tt.yaml)
			if err == nil {
				t.Fatalf("accepted:\n%s", tt.yaml)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tt.want)
			}
		})
	}
	t.Run("too many services", func(t *testing.T) {
		c := &Config{Interface: "eth0", Services: make([]ServiceConfig, svcMax+1)}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "65 services, at most 64") {
			t.Errorf("error %v", err)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		if _, err := LoadConfig(filepath.Join(t.TempDir(), "none.yaml")); err == nil || !strings.HasPrefix(err.Error(), "read config: ") {
			t.Errorf("error %v", err)
		}
	})
}
