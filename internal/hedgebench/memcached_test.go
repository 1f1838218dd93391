package hedgebench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// TestMemcachedShort runs the memcached scenario small, with srv1 stopped often enough that
// every run meets pauses: both arms ran, the clients' gets went over UDP, kedge hedged gets
// to srv2 and nothing else (memcached's own cmd_set on srv2 stays 0 while UDP and TCP sets
// flow to srv1), and the figures exist.
func TestMemcachedShort(t *testing.T) {
	bpftest.RequireRoot(t)
	for _, bin := range []string{"php", "memcached", "memcslap"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (scripts/deps.sh installs php-cli php-memcache memcached libmemcached-tools)", bin)
		}
	}
	if exec.Command("php", "-r", "exit(class_exists('MemcachePool') ? 0 : 3);").Run() != nil {
		t.Skip("php has no memcache extension (scripts/deps.sh installs php-memcache)")
	}
	o := MemcachedOptions{Clients: 2, Ops: 3000, Warmup: 50, Rounds: 1, Keys: 100,
		Pauses: PauseSpec{Seed: 7, Coverage: 0.2, Min: 20 * time.Millisecond, Max: 40 * time.Millisecond},
		Script: filepath.Join("..", "..", "clients", "mcload.php"), OutDir: t.TempDir()}
	res, err := RunMemcached(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 || len(res.Arms) != 2 {
		t.Fatalf("%d runs, %d arms: want one run of each arm", len(res.Runs), len(res.Arms))
	}
	for _, r := range res.Runs {
		if r.Gets+r.Sets != o.Clients*o.Ops || r.Sets == 0 || r.OpsPerSec <= 0 || r.P50US <= 0 {
			t.Errorf("run %s: %d gets, %d sets, %.0f ops/s, P50 %.0f us: want %d operations with sets among them",
				r.Arm, r.Gets, r.Sets, r.OpsPerSec, r.P50US, o.Clients*o.Ops)
		}
		if r.GetMisses != 0 {
			t.Errorf("run %s: %d gets returned no value (every key is stored on both replicas)", r.Arm, r.GetMisses)
		}
		if r.Pauses.Pauses == 0 {
			t.Errorf("run %s: srv1 was never stopped", r.Arm)
		}
		// Every get (warm-up included) is one datagram from the client, hedges one more.
		if gets := uint64(o.Clients*(o.Ops+o.Warmup) - r.SetsAll); r.ClientUDPOut < gets {
			t.Errorf("run %s: %d UDP datagrams sent for about %d gets: the client fell back to TCP", r.Arm, r.ClientUDPOut, gets)
		}
		if r.Srv2["cmd_set"] != 0 {
			t.Errorf("run %s: srv2 counted %d sets: a set was duplicated", r.Arm, r.Srv2["cmd_set"])
		}
		if want := uint64(r.SetsAll + r.UDPSets); r.Srv1["cmd_set"] != want {
			t.Errorf("run %s: srv1 counted %d sets, the clients sent %d", r.Arm, r.Srv1["cmd_set"], want)
		}
		switch r.Arm {
		case ArmMCUnhedged:
			if r.Srv2["cmd_get"] != 0 || r.Counters != nil {
				t.Errorf("unhedged run: srv2 served %d gets, counters %v", r.Srv2["cmd_get"], r.Counters)
			}
		case ArmMCKedge:
			c := r.Counters
			if c["hedges_sent"] == 0 || r.Srv2["cmd_get"] == 0 {
				t.Errorf("kedge run: %d hedges, srv2 served %d gets: want gets hedged to srv2 during srv1's stops", c["hedges_sent"], r.Srv2["cmd_get"])
			}
			// memcslap's values reach 5 KB: a set is a request not hedgeable or a fragmented
			// datagram, passed untouched.
			if seen := c["not_hedgeable"] + r.Global["fragments"]; r.UDPSets > 0 && seen < uint64(r.UDPSets) {
				t.Errorf("kedge run: not_hedgeable %d + fragments %d below the %d UDP sets; counters %v %v",
					c["not_hedgeable"], r.Global["fragments"], r.UDPSets, c, r.Global)
			}
		}
	}
	for _, f := range []string{"result.json", "cdf.png", "tail.svg"} {
		if _, err := os.Stat(filepath.Join(o.OutDir, f)); err != nil {
			t.Error(err)
		}
	}
	var b strings.Builder
	if err := WriteMemcachedReport(&b, res); err != nil || !strings.Contains(b.String(), "| memcached + kedge | 1 |") || strings.Contains(b.String(), "DUPLICATED") {
		t.Errorf("report %v:\n%s", err, b.String())
	}
}
