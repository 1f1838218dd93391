package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestResultRoundTrip(t *testing.T) {
	h := 3
	r := NewResult(context.Background(), "loopback", map[string]any{"n": 5, "delay_ms": 10.0})
	if r.Machine.NProc < 1 || r.Kernel == "" || r.Commit == "" {
		t.Errorf("machine/kernel/commit not filled: %+v %q %q", r.Machine, r.Kernel, r.Commit)
	}
	r.Series = []Series{{Name: "a", IDs: []uint32{1, 2}, LatenciesUS: []float64{2500.5, 1e6}, OK: []bool{true, false},
		Timeouts: 1, HedgesSent: &h, Backend: "same"}}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := r.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Scenario != "loopback" || len(got.Series) != 1 || *got.Series[0].HedgesSent != 3 ||
		got.Series[0].LatenciesUS[0] != 2500.5 || got.Series[0].OK[1] || !got.Timestamp.Equal(r.Timestamp) {
		t.Errorf("round trip changed the result: %+v", got)
	}
}

func TestReadFileRejects(t *testing.T) {
	tests := []struct {
		name, body, wantErr string
	}{
		{"not json", "{", "decode result"},
		{"other schema", `{"schema":"x/v0"}`, "schema"},
		{"ragged arrays", `{"schema":"kedge.bench/v1","series":[{"name":"a","ids":[1],"latencies_us":[],"ok":[]}]}`, "differ in length"},
		{"timeouts mismatch", `{"schema":"kedge.bench/v1","series":[{"name":"a","ids":[1],"latencies_us":[1],"ok":[false],"timeouts":0}]}`, "timeouts"},
		{"unnamed series", `{"schema":"kedge.bench/v1","series":[{"ids":[],"latencies_us":[],"ok":[]}]}`, "empty name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.json")
			if err := os.WriteFile(path, []byte(tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ReadFile = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestLoadAvg(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, body string
		want       []float64
	}{
		{"proc format", "0.52 1.10 2.00 2/345 6789\n", []float64{0.52, 1.10, 2.00}},
		{"short", "0.52 1.10\n", nil},
		{"garbage", "a b c\n", nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strconv.Itoa(i))
			if err := os.WriteFile(path, []byte(tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := loadAvg(path); !slices.Equal(got, tt.want) {
				t.Errorf("loadAvg = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	a := Result{Envelope: Envelope{Schema: SchemaVersion, Scenario: "s", Parameters: map[string]any{"n": 5000, "mode": "baseline"},
		LoadAvg: []float64{1, 5, 1}}, Series: []Series{{Name: "baseline"}}}
	b := Result{Envelope: Envelope{Schema: SchemaVersion, Scenario: "s", Parameters: map[string]any{"n": 5000, "mode": "apphedge", "delay_ms": 10},
		LoadAvg: []float64{2, 1, 1}}, Series: []Series{{Name: "app"}}}
	m, err := Merge(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Series) != 2 || m.Series[0].Name != "baseline" || m.Series[1].Name != "app" {
		t.Errorf("series %+v", m.Series)
	}
	want := map[string]any{"n": 5000, "baseline.mode": "baseline", "app.mode": "apphedge", "app.delay_ms": 10}
	if len(m.Parameters) != len(want) {
		t.Errorf("parameters %v, want %v", m.Parameters, want)
	}
	for k, v := range want {
		if m.Parameters[k] != v {
			t.Errorf("parameter %s = %v, want %v", k, m.Parameters[k], v)
		}
	}
	if !slices.Equal(m.LoadAvg, []float64{2, 5, 1}) {
		t.Errorf("merged load average %v, want the element-wise max [2 5 1]", m.LoadAvg)
	}
	if _, err := Merge(a, a); err == nil {
		t.Error("merging two series of one name: no error")
	}
	if _, err := Merge(); err == nil {
		t.Error("merging nothing: no error")
	}
}

func TestCPUModel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpuinfo")
	body := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Core(TM) i7-8550U CPU @ 1.80GHz\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := cpuModel(path), "Intel(R) Core(TM) i7-8550U CPU @ 1.80GHz"; got != want {
		t.Errorf("cpuModel = %q, want %q", got, want)
	}
	if got := cpuModel(filepath.Join(t.TempDir(), "none")); got != "" {
		t.Errorf("cpuModel of a missing file = %q", got)
	}
}

func TestWriteChartsAndReport(t *testing.T) {
	h := 100
	r := Result{Envelope: Envelope{Schema: SchemaVersion, Scenario: "test"}, Series: []Series{
		thesisLike("baseline", 5000, 2.5, 401, nil),
		thesisLike("app-hedged", 5000, 2.6, 12.7, &h),
	}}
	dir := t.TempDir()
	if err := WriteCharts(dir, r, 0.95, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cdf.png", "cdf.svg", "tail.png", "tail.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		switch filepath.Ext(f) {
		case ".png":
			if !bytes.HasPrefix(b, []byte("\x89PNG")) {
				t.Errorf("%s is not a PNG", f)
			}
		case ".svg":
			if !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("app-hedged")) {
				t.Errorf("%s is not an SVG with the legend", f)
			}
		}
	}
	var out strings.Builder
	err := WriteReport(&out, r, ReportOptions{Baseline: "baseline", HedgeDelay: 10 * time.Millisecond,
		IsStall: func(id uint32) bool { return id%100 < 2 }})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| app-hedged", "96.8%", "100 hedges sent", "hedge excess over 10ms + median on 100 stalled ids: P50 0.10 ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if err := WriteCDF(filepath.Join(dir, "x"), nil, ChartOptions{}); err == nil {
		t.Error("chart of no series: no error")
	}
}
