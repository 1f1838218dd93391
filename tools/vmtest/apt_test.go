package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseSources(t *testing.T) {
	deb822 := `Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: bookworm
`
	got := parseDeb822Sources(deb822)
	want := []sourceEntry{
		{uri: "http://mirror.example/debian", suites: []string{"bookworm", "bookworm-updates"}},
		{uri: "http://mirror.example/debian-security", suites: []string{"bookworm-security"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("deb822: got %+v, want %+v", got, want)
	}

	oneLine := `# comment
deb http://a.example/debian bookworm main contrib
deb [arch=amd64 signed-by=/k.gpg] http://b.example/debian bullseye main # trailing
deb-src http://c.example/debian bookworm main
`
	got = parseOneLineSources(oneLine)
	want = []sourceEntry{
		{uri: "http://a.example/debian", suites: []string{"bookworm"}},
		{uri: "http://b.example/debian", suites: []string{"bullseye"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("one-line: got %+v, want %+v", got, want)
	}
}

func TestResolveFields(t *testing.T) {
	show := []byte(`Package: linux-image-amd64
Source: linux-signed-amd64 (6.1.176+1)
Version: 6.1.176-1
Depends: linux-image-6.1.0-50-amd64 (= 6.1.176-1)
Description: Linux for 64-bit PCs (meta-package)
 This package depends on the latest Linux kernel.

Package: linux-image-amd64
Version: 6.1.170-1
`)
	f := parseControl(show)
	if f["Version"] != "6.1.176-1" {
		t.Errorf("version %q: the first stanza is the candidate", f["Version"])
	}
	dep, err := imageDependency(f["Depends"])
	if err != nil || dep != "linux-image-6.1.0-50-amd64" {
		t.Errorf("imageDependency = %q, %v", dep, err)
	}
	if _, err := imageDependency("linux-image-6.1.0-50-amd64 (= 1), linux-image-6.1.0-51-amd64 (= 2)"); err == nil {
		t.Error("two image dependencies must be an error")
	}
}

// The private config must keep every path of apt's state and config out of /etc/apt and
// /var (where the host's apt lives).
func TestAptConfigIsPrivate(t *testing.T) {
	a := &aptSuite{suite: "trixie", dir: "/cache/apt/trixie"}
	conf := a.config("Acquire::http::Proxy \"http://proxy.example:3128\";\n")
	for _, line := range strings.Split(strings.TrimSpace(conf), "\n") {
		if strings.Contains(line, "/etc/") || strings.Contains(line, "/var/") {
			t.Errorf("config line points at host state: %s", line)
		}
	}
	for _, want := range []string{`Dir::Etc::Parts "/cache/apt/trixie/parts.d";`, `Dir::State::status "/dev/null";`, "Acquire::http::Proxy"} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %s:\n%s", want, conf)
		}
	}
}
