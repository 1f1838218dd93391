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

// TestResendBudgetDefault: a config with re-sends and without a budget gets ratio 0.1 and a burst of eight
// requests' copies (DefaultResendBurst: 8 x workers, at least 16); one with a budget keeps
// it.
func TestResendBudgetDefault(t *testing.T) {
	for _, c := range []struct {
		workers int
		in      ResendBudget
		want    ResendBudget
	}{
		{1, ResendBudget{}, ResendBudget{Ratio: 0.1, Burst: 16}},
		{2, ResendBudget{}, ResendBudget{Ratio: 0.1, Burst: 16}},
		{64, ResendBudget{}, ResendBudget{Ratio: 0.1, Burst: 512}},
		{64, ResendBudget{Ratio: 0.2, Burst: 128}, ResendBudget{Ratio: 0.2, Burst: 128}},
	} {
		ws := make([]netip.AddrPort, c.workers)
		for i := range ws {
			ws[i] = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(9000+i))
		}
		cfg := Config{Interface: "lo", Workers: ws, Elems: 4, Resend: 10 * time.Millisecond, ResendBudget: c.in}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%d workers: %v", c.workers, err)
		}
		if cfg.ResendBudget != c.want {
			t.Errorf("%d workers, budget %+v: %+v after Validate, want %+v", c.workers, c.in, cfg.ResendBudget, c.want)
		}
	}
}
