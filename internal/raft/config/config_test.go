package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const base = `cluster_id: 42
id: 1
data_dir: /tmp/x
peers:
  - {id: 1, raft: "127.0.0.1:7001", client: "127.0.0.1:8001"}
`

const keyHex = "00112233445566778899aabbccddeeff"

func TestClusterKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("key", keyHex+"\n", 0o600)
	open := write("open", keyHex, 0o644)
	short := write("short", "0011", 0o600)
	for _, c := range []struct {
		name, extra, err string
		key              bool
	}{
		{"none", "", "", false},
		{"inline", "cluster_key: " + keyHex + "\n", "", true},
		{"file", "cluster_key_file: " + good + "\n", "", true},
		{"both", "cluster_key: " + keyHex + "\ncluster_key_file: " + good + "\n", "both set", false},
		{"bad hex", "cluster_key: 00112233445566778899aabbccddeeXX\n", "32 hex digits", false},
		{"short file", "cluster_key_file: " + short + "\n", "32 hex digits", false},
		{"open file", "cluster_key_file: " + open + "\n", "chmod 600", false},
		{"missing file", "cluster_key_file: " + filepath.Join(dir, "nope") + "\n", "no such file", false},
	} {
		cfg, err := Parse([]byte(base+c.extra), 0, "")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.err)
			}
			if err != nil && strings.Contains(err.Error(), "aabbcc") {
				t.Errorf("%s: error shows the key: %v", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if (cfg.ClusterKey != nil) != c.key {
			t.Errorf("%s: key set = %v, want %v", c.name, cfg.ClusterKey != nil, c.key)
		}
		if c.key && (cfg.ClusterKey[0] != 0x00 || cfg.ClusterKey[15] != 0xff) {
			t.Errorf("%s: key bytes wrong", c.name)
		}
		if s := fmt.Sprintf("%+v %v", cfg, *cfg); strings.Contains(s, "aabbcc") || strings.Contains(s, "170 187") {
			t.Errorf("%s: printing the config shows the key: %s", c.name, s)
		}
	}
}
