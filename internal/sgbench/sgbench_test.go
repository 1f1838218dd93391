package sgbench

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRatios(t *testing.T) {
	rows := []Row{
		{Method: "kedge", Fanout: 16, Throughput: 300, P50US: 50},
		{Method: "naive", Fanout: 16, Throughput: 100, P50US: 40},
		{Method: "mmsg", Fanout: 16, Throughput: 200, P50US: 100},
		{Method: "kedge", Fanout: 4, Throughput: 0},
		{Method: "mmsg", Fanout: 4, Throughput: 10, P50US: 10},
	}
	r := ratios(rows)
	if len(r) != 2 || r[0].Fanout != 16 || r[0].BestThroughput != "mmsg" || r[0].ThroughputRatio != 1.5 ||
		r[0].BestP50 != "naive" || r[0].P50Ratio != 1.25 || r[1].ThroughputRatio != 0 {
		t.Fatalf("ratios %+v", r)
	}
}

func TestReadPerf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "perf")
	os.WriteFile(p, []byte("# started on x\n\n12345,,raw_syscalls:sys_enter,1000,100.00,,\n"), 0o644)
	if v := readPerf(p); v != 12345 {
		t.Fatalf("read %v", v)
	}
	if v := readPerf(filepath.Join(t.TempDir(), "missing")); v != -1 {
		t.Fatalf("missing file: %v", v)
	}
}
