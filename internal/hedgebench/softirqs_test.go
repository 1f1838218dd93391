package hedgebench

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadSoftirqs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "softirqs")
	const text = "                    CPU0       CPU1\n" +
		"          HI:          1          2\n" +
		"      NET_RX:     100000     250000\n" +
		"     HRTIMER:          0          7\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readSoftirqsFrom(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"HI": 3, "NET_RX": 350000, "HRTIMER": 7}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %d, want %d", k, got[k], v)
		}
	}
	if err := os.WriteFile(path, []byte("      NET_RX:  12 x3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readSoftirqsFrom(path); err == nil {
		t.Error("a count that is no number was accepted")
	}
	if _, err := readSoftirqs(); err != nil {
		t.Errorf("this machine's /proc/softirqs: %v", err)
	}
}

// TestSelectArms: unhedged always runs first, the names given follow in their order,
// unknown and repeated names are refused.
func TestSelectArms(t *testing.T) {
	arms, err := selectArms([]string{ArmStoredNoCarry, ArmUnhedged, ArmIdleCarry})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range arms {
		names = append(names, a.name)
	}
	if len(names) != 3 || names[0] != ArmUnhedged || names[1] != ArmStoredNoCarry || names[2] != ArmIdleCarry {
		t.Errorf("arms %v, want unhedged, %s, %s", names, ArmStoredNoCarry, ArmIdleCarry)
	}
	if !arms[2].idle || arms[1].idle || arms[1].set == nil || arms[0].set != nil {
		t.Errorf("arms %+v: idle and kedge settings wrong", arms)
	}
	for _, bad := range [][]string{{"stored", "stored"}, {"nope"}} {
		if _, err := selectArms(bad); err == nil {
			t.Errorf("arms %v accepted", bad)
		}
	}
}
