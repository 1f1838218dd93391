package sg

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestPollSpinConfig: Config.PollSpin's default, off and the bound Validate gives it.
func TestPollSpinConfig(t *testing.T) {
	for _, c := range []struct {
		in, want time.Duration
		wantErr  string
	}{
		{0, DefaultPollSpin, ""},
		{-1, -1, ""},
		{50 * time.Microsecond, 50 * time.Microsecond, ""},
		{MaxPollSpin, MaxPollSpin, ""},
		{MaxPollSpin + 1, 0, "poll spin 10.000001ms, want at most 10ms"},
	} {
		cfg := Config{Interface: "lo", Workers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9000")}, Elems: 4, PollSpin: c.in}
		err := cfg.Validate()
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("PollSpin %v: error %v, want one containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || cfg.PollSpin != c.want {
			t.Errorf("PollSpin %v: %v after Validate (error %v), want %v", c.in, cfg.PollSpin, err, c.want)
		}
	}
}
