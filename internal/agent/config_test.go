package agent

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestPackagedConfig: the default config shipped by the package and the image validates and
// declares nothing, and so do its commented examples once uncommented.
func TestPackagedConfig(t *testing.T) {
	if bpftest.InGuest() {
		t.Skip("reads the repository's deploy/kedge.yaml, which matrix guests do not have (runs on the host)")
	}
	b, err := os.ReadFile("../../deploy/kedge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("deploy/kedge.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Hedge)+len(c.Pping) != 0 || c.Listen != DefaultListen {
		t.Errorf("packaged config: %d hedgers, %d monitors, listen %s; want nothing declared on %s", len(c.Hedge), len(c.Pping), c.Listen, DefaultListen)
	}
	// Uncomment the examples: "hedge: []" and "#  - ..." lines become the lists.
	text := strings.NewReplacer("hedge: []", "hedge:", "pping: []", "pping:").Replace(string(b))
	text = regexp.MustCompile(`(?m)^#(  .*)$`).ReplaceAllString(text, "$1")
	c, err = Parse("examples", []byte(text))
	if err != nil {
		t.Fatalf("the packaged config's examples: %v\n%s", err, text)
	}
	if len(c.Hedge) != 1 || len(c.Hedge[0].Services) != 1 || len(c.Pping) != 1 {
		t.Errorf("examples: %d hedgers, %d monitors", len(c.Hedge), len(c.Pping))
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"empty", "", "the file is empty"},
		{"typo", "hedge:\n  - interface: eth0\n    servics: []\n", `line 3: hedge[0]: unknown key "servics": did you mean "services"?`},
		{"listen", "listen: 9464\n", `listen "9464": want HOST:PORT`},
		{"level", "log: {level: loud}\n", `log.level "loud": use debug, info, warn or error`},
		{"format", "log: {format: xml}\n", `log.format "xml": use text or json`},
		{"retry", "retry: 1ms\n", "retry 1ms: use 100ms..1h"},
		{"same interface", "hedge:\n  - {interface: eth0, services: [{address: 10.0.0.1:53}]}\n  - {interface: eth0, services: [{address: 10.0.0.2:53}]}\n", "hedge[0] is on the same interface"},
		{"hedge invalid", "hedge:\n  - {interface: eth0, services: [{address: nowhere}]}\n", `address "nowhere": want ip:port`},
		{"slots", "hedge:\n  - {interface: eth0, service_slots: 65, services: [{address: 10.0.0.1:53}]}\n", "service_slots 65: use 0 (default) or up to 64"},
		{"duplicate names", "hedge:\n  - {interface: eth0, services: [{name: a, address: 10.0.0.1:53}, {name: a, address: 10.0.0.2:53}]}\n", `two services named "a"`},
		{"pping interface", "pping:\n  - {aggregate: 1s}\n", "pping[0]: interface is required"},
		{"pping service", "pping:\n  - {interface: eth0, udp_services: [\"53\"]}\n", "udp_services: parse service"},
		{"pping aggregate", "pping:\n  - {interface: eth0, aggregate: 10ms}\n", "aggregate 10ms: use 100ms or more"},
		{"pping same", "pping:\n  - {interface: eth0}\n  - {interface: eth0}\n", "pping[0] is on the same interface"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("kedge.yaml", []byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalid) {
				t.Errorf("Parse: %v\nwant an ErrInvalid containing %q", err, tc.want)
			}
		})
	}
	// Namespaces tell interfaces of the same name apart.
	if _, err := Parse("ok", []byte("pping:\n  - {interface: eth0}\n  - {interface: eth0, netns: blue}\n")); err != nil {
		t.Errorf("two namespaces' eth0: %v", err)
	}
}
