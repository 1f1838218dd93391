package hedge

import (
	"fmt"
	"strings"
	"testing"
)

// TestStoreLimitConfig: yaml store_limit (per service) defaults to DefaultStoreLimit, 0
// keeps the clone path, and values the store cell cannot hold are refused with the range.
func TestStoreLimitConfig(t *testing.T) {
	for _, c := range []struct {
		yaml    string // the service's store_limit line, "" for none
		want    int
		wantErr string
	}{
		{"", DefaultStoreLimit, ""},
		{"store_limit: 0", 0, ""},
		{"store_limit: 100", 100, ""},
		{fmt.Sprintf("store_limit: %d", MaxStoreLimit), MaxStoreLimit, ""},
		{fmt.Sprintf("store_limit: %d", MaxStoreLimit+1), 0, fmt.Sprintf("store_limit %d out of range: use 0..%d bytes", MaxStoreLimit+1, MaxStoreLimit)},
		{"store_limit: -1", 0, "store_limit -1 out of range"},
		{"store_limit: lots", 0, "cannot unmarshal"},
	} {
		t.Run(c.yaml, func(t *testing.T) {
			cfg, err := loadYAML(t, "interface: eth0\nservices:\n  - address: 198.18.0.12:9999\n    "+c.yaml+"\n")
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Services[0].storeLimit(); got != c.want {
				t.Errorf("store limit %d, want %d", got, c.want)
			}
		})
	}
}
