package strictyaml

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

type inner struct {
	Address  string   `yaml:"address"`
	Replicas []string `yaml:"replicas"`
	Delay    shaped   `yaml:"delay"`
	Free     opaque   `yaml:"free"`
}

type base struct {
	Interface string `yaml:"interface"`
}

type top struct {
	base     `yaml:",inline"`
	Services []inner          `yaml:"services"`
	Labels   map[string]inner `yaml:"labels"`
	Count    int              `yaml:"count"`
}

// shaped has its own UnmarshalYAML and declares its mapping keys.
type shaped struct{ Quantile float64 }

func (s *shaped) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return nil
	}
	var raw shapedYAML
	if err := n.Decode(&raw); err != nil {
		return err
	}
	s.Quantile = raw.Quantile
	return nil
}

type shapedYAML struct {
	Quantile float64 `yaml:"quantile"`
	Min      string  `yaml:"min"`
}

func (shaped) YAMLShape() any { return shapedYAML{} }

// opaque has its own UnmarshalYAML and no shape: its keys are its own business.
type opaque struct{}

func (*opaque) UnmarshalYAML(*yaml.Node) error { return nil }

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name, doc, err string
	}{
		{"valid", "interface: eth0\nservices:\n  - address: a\n    delay: {quantile: 0.9}\n", ""},
		{"inline key", "interfce: eth0\n", `line 1: unknown key "interfce": did you mean "interface"?`},
		{"nested typo", "interface: eth0\nservices:\n  - adress: a\n", `line 3: services[0]: unknown key "adress": did you mean "address"?`},
		{"transposition", "services:\n  - address: a\n    replcias: [b]\n", `line 3: services[0]: unknown key "replcias": did you mean "replicas"?`},
		{"shaped", "services:\n  - delay: {quantile: 0.9, mn: 1ms}\n", `line 2: services[0].delay: unknown key "mn": did you mean "min"?`},
		{"shaped scalar", "services:\n  - delay: 10ms\n", ""},
		{"opaque", "services:\n  - free: {anything: 1}\n", ""},
		{"map values", "labels:\n  x: {adress: a}\n", `line 2: labels.x: unknown key "adress": did you mean "address"?`},
		{"far", "zzzzzz: 1\n", `line 1: unknown key "zzzzzz": valid keys here are count, interface, labels, services`},
		{"empty", "", ErrEmpty.Error()},
		{"comments only", "# nothing\n\n", ErrEmpty.Error()},
		{"null", "~\n", ErrEmpty.Error()},
		{"scalar for mapping", "services:\n  - 1.2.3.4\n", `line 2: services[0]: want a mapping of keys (address, delay, free, replicas), got "1.2.3.4"`},
		{"scalar for list", "services: x\n", `line 1: services: want a list, got "x" (write [x] for a list of one)`},
		{"list for scalar", "interface: [a]\n", `line 1: interface: want a string, got a list`},
		{"merge key", "x: &x {address: a}\nlabels: {y: {<<: *x, replicas: [b]}}\n", `line 1: unknown key "x": valid keys here are count, interface, labels, services`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v top
			err := Decode([]byte(tc.doc), &v)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				return
			}
			if err == nil || err.Error() != tc.err {
				t.Fatalf("Decode error:\n got %v\nwant %s", err, tc.err)
			}
		})
	}
	var v top
	if err := Decode([]byte(""), &v); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty: %v, want ErrEmpty", err)
	}
	if err := Decode([]byte("interface: eth0\nservices: [{address: a, delay: {quantile: 0.5}}]\n"), &v); err != nil ||
		v.Interface != "eth0" || v.Services[0].Delay.Quantile != 0.5 {
		t.Errorf("decoded %+v, %v", v, err)
	}
}

func TestNearest(t *testing.T) {
	keys := []string{"address", "replicas", "request_id", "delay", "budget", "max_hedges"}
	for in, want := range map[string]string{
		"adress": "address", "Address": "address", "replica": "replicas", "requestid": "request_id",
		"dealy": "delay", "max_hedge": "max_hedges", "completely_else": "", "x": "",
	} {
		if got := Nearest(in, keys); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", in, got, want)
		}
	}
	if !strings.Contains(keyList(typeOf[top]()), "interface") {
		t.Error("keyList misses inline keys")
	}
}

func typeOf[T any]() reflect.Type { return reflect.TypeFor[T]() }
