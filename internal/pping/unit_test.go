package pping

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// TestHistogramLayout pins the layout pping.h gives hist.h (internal/hist tests the
// arithmetic, the aggregation fixture the kernel's bucket of a sample).
func TestHistogramLayout(t *testing.T) {
	if err := HistLayout.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns   uint64
		want int
	}{{0, 0}, {31, 0}, {32, 1}, {255, 7}, {256, 8}, {511, 15}, {512, 16}, {1<<36 - 1, HistBins - 2}, {1 << 36, HistBins - 1}, {math.MaxUint64, HistBins - 1}} {
		if got := HistLayout.Bucket(tc.ns); got != tc.want {
			t.Errorf("bucket of %d ns = %d, want %d", tc.ns, got, tc.want)
		}
	}
	// The octave edges (Prometheus' buckets) are bucket edges.
	for e := histMinShift; e <= histMaxShift; e++ {
		if b := HistLayout.Bucket(1 << e); HistLayout.Lower(b) != 1<<e {
			t.Errorf("2^%d ns is not a bucket edge", e)
		}
	}
	// 20 us falls in a bucket at most 2.5 us wide: fine enough for veth RTTs.
	if b := HistLayout.Bucket(20_000); HistLayout.Upper(b)-HistLayout.Lower(b) > 2500 {
		t.Errorf("bucket of 20 us is [%d, %d)", HistLayout.Lower(b), HistLayout.Upper(b))
	}
}

func TestHistogramQuantile(t *testing.T) {
	var h Histogram
	add := func(ns uint64, n uint64) {
		h.Bins[HistLayout.Bucket(ns)] += n
		h.Count += n
		h.Sum += ns * n
		if h.Min == 0 || ns < h.Min {
			h.Min = ns
		}
		h.Max = max(h.Max, ns)
	}
	add(10_000, 90)    // 10 us
	add(1_000_000, 10) // 1 ms
	for _, tc := range []struct {
		q      float64
		lo, hi time.Duration
	}{{0.5, 9 * time.Microsecond, 11 * time.Microsecond}, {0.95, 900 * time.Microsecond, 1100 * time.Microsecond}, {1, time.Millisecond, time.Millisecond}} {
		if got := h.Quantile(tc.q); got < tc.lo || got > tc.hi {
			t.Errorf("quantile %.2f = %v, want in [%v, %v]", tc.q, got, tc.lo, tc.hi)
		}
	}
	if got, want := h.Mean(), time.Duration((90*10_000+10*1_000_000)/100); got != want {
		t.Errorf("mean %v, want %v", got, want)
	}
}

func TestParseService(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Service
		err  string
	}{
		{"9999:0:4", Service{Port: 9999, Len: 4}, ""},
		{"53:2:2:le", Service{Port: 53, Offset: 2, Len: 2, LittleEndian: true}, ""},
		{"53:2:2:be", Service{Port: 53, Offset: 2, Len: 2}, ""},
		{"53:0:9", Service{}, "1..8 bytes"},
		{"0:0:4", Service{}, "port must not be 0"},
		{"53:0", Service{}, "PORT:OFFSET:LEN"},
		{"53:0:4:xx", Service{}, "le or be"},
		{"70000:0:4", Service{}, "out of range"},
	} {
		got, err := ParseService(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseService(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseService(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		err  string
	}{
		{"default", func(*Config) {}, ""},
		{"nothing tracked", func(c *Config) { c.TCP, c.ICMP, c.DNS, c.QUIC, c.KernelRTT = false, false, false, false, false }, "nothing to track"},
		{"service only", func(c *Config) {
			c.TCP, c.ICMP, c.DNS, c.QUIC, c.KernelRTT = false, false, false, false, false
			c.Services = []Service{{Port: 1, Len: 1}}
		}, ""},
		{"QUIC only", func(c *Config) { c.TCP, c.ICMP, c.DNS, c.KernelRTT = false, false, false, false }, ""},
		{"QUIC without ports", func(c *Config) { c.QUICPorts = nil }, "QUIC needs 1 to 8 ports"},
		{"QUIC ports", func(c *Config) { c.QUICPorts = []uint16{1, 2, 3, 4, 5, 6, 7, 8, 9} }, "QUIC needs 1 to 8 ports"},
		{"QUIC port 0", func(c *Config) { c.QUICPorts = []uint16{0} }, "QUIC port 0"},
		{"QUIC port twice", func(c *Config) { c.QUICPorts = []uint16{443, 443} }, "given twice"},
		{"QUIC port is a service", func(c *Config) { c.Services = []Service{{Port: 443, Len: 1}} }, "both a service and a QUIC port"},
		{"QUIC off, its port a service", func(c *Config) { c.QUIC = false; c.Services = []Service{{Port: 443, Len: 1}} }, ""},
		{"v6 prefix", func(c *Config) { c.AggPrefixV6 = 65 }, "first 64 bits"},
		{"v4 prefix", func(c *Config) { c.AggPrefixV4 = 33 }, "[0, 32]"},
		{"rtt rate", func(c *Config) { c.RTTRate = -1 }, "rtt rate"},
		{"lifetimes", func(c *Config) { c.TSMinLifetime = time.Hour }, "above max"},
		{"duplicate service", func(c *Config) { c.Services = []Service{{Port: 1, Len: 1}, {Port: 1, Len: 2}} }, "twice"},
		{"xdp ingress", func(c *Config) { c.IngressHook = IngressXDP }, ""},
		{"ingress hook", func(c *Config) { c.IngressHook = 2 }, "want tc or xdp"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		err := c.Validate()
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: Validate() = %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestBPFConfigMasks(t *testing.T) {
	c := DefaultConfig()
	c.AggPrefixV4, c.AggPrefixV6 = 24, 48
	bc := c.bpfConfig(4 * time.Millisecond)
	// The kernel reads the masks as little-endian words of network-order bytes.
	if bc.V4PrefixMask != 0x00ffffff || bc.V6PrefixMask != 0x0000ffffffffffff {
		t.Errorf("masks %#x %#x, want 0xffffff and 0xffffffffffff", bc.V4PrefixMask, bc.V6PrefixMask)
	}
	if bc.Localfilt != 1 || bc.SkipSyn != 1 || bc.PushEvents != 1 || bc.Aggregate != 0 || bc.RateLimitNs != uint64(100*time.Millisecond) {
		t.Errorf("defaults not ePPing's: %+v", bc)
	}
	if bc.JiffyNs != 4e6 || bc.TrackQuic != 1 || bc.QuicPorts != [8]uint16{bpfx.Htons(443)} || bc.TrackKernel != 0 {
		t.Errorf("tick, QUIC or kernel source: %+v", bc)
	}
	c.RTTRate = 0.5
	if got := c.bpfConfig(0).RttRate; got != 1<<15 {
		t.Errorf("rtt rate 0.5 -> %d, want %d", got, 1<<15)
	}
}

func TestCounterNames(t *testing.T) {
	var c Counters
	c.TsNotNew, c.ParseErr[4] = 3, 2
	fields, err := CounterFields(&c)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, f := range fields {
		got[f.Name] = f.Value
	}
	if got["ts_not_new"] != 3 || got["parse_err_l3_proto"] != 2 || got["skip_no_tcp_ts"] != 0 {
		t.Errorf("counter names: %v", got)
	}
	if _, ok := got["gc_flow_expired"]; !ok {
		t.Errorf("gc_flow_expired missing: %v", got)
	}
}

var (
	when  = time.Date(2026, 11, 22, 10, 4, 5, 123456789, time.Local)
	flowB = Flow{Src: netip.MustParseAddrPort("198.51.100.1:80"), Dst: netip.MustParseAddrPort("192.0.2.1:40000"), Proto: 6, IDType: IDTCPTimestamp}
	rttEv = &RTTEvent{Time: when, Flow: flowB, RTT: 1234567 * time.Nanosecond, MinRTT: time.Millisecond, SRTT: 1200 * time.Microsecond,
		SentPackets: 10, SentBytes: 1000, RecPackets: 5, RecBytes: 50, ID: 101}
	flowEv = &FlowEvent{Time: when, Flow: flowB, Type: FlowOpening, Reason: ReasonSYN, Source: SourceDest}
)

func TestFormats(t *testing.T) {
	for _, tc := range []struct {
		f    Format
		want string
	}{
		{Standard, "10:04:05.123456789 1.23457 ms 1 ms TCP 198.51.100.1:80+192.0.2.1:40000 tsval\n" +
			"10:04:05.123456789 TCP 198.51.100.1:80+192.0.2.1:40000 opening due to SYN from dest\n"},
		{PPViz, itoa(when.Unix()) + ".123456789 0.001234567 0.001000000 198.51.100.1:80+192.0.2.1:40000\n"},
		{JSONL, `{"timestamp":` + itoa(when.UnixNano()) + `,"src_ip":"198.51.100.1","src_port":80,"dest_ip":"192.0.2.1","dest_port":40000,"protocol":"TCP","id_type":"tcp_ts","source":"tsval","rtt":1234567,"min_rtt":1000000,"srtt":1200000,"sent_packets":10,"sent_bytes":1000,"rec_packets":5,"rec_bytes":50,"match_on_egress":false,"id":101}` + "\n" +
			`{"timestamp":` + itoa(when.UnixNano()) + `,"src_ip":"198.51.100.1","src_port":80,"dest_ip":"192.0.2.1","dest_port":40000,"protocol":"TCP","id_type":"tcp_ts","flow_event":"opening","reason":"SYN","triggered_by":"dest"}` + "\n"},
	} {
		var buf bytes.Buffer
		w := NewWriter(&buf, tc.f)
		for _, ev := range []Event{rttEv, flowEv} {
			if err := w.Event(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if buf.String() != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.f, buf.String(), tc.want)
		}
	}
}

func itoa(v int64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestJSONArrayAndReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	w, err := NewFileWriter(path, JSON)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Event(rttEv); err != nil {
		t.Fatal(err)
	}
	// logrotate: move the file away, then SIGHUP makes the writer reopen the path.
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	for _, ev := range []Event{rttEv, flowEv} {
		if err := w.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for file, n := range map[string]int{path + ".1": 1, path: 2} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var objs []map[string]any
		if err := json.Unmarshal(b, &objs); err != nil || len(objs) != n {
			t.Errorf("%s: %d objects (%v), want a JSON array of %d:\n%s", file, len(objs), err, n, b)
		}
	}
	// An empty run is still a valid (empty) array.
	var buf bytes.Buffer
	NewWriter(&buf, JSON).Close()
	var objs []any
	if err := json.Unmarshal(buf.Bytes(), &objs); err != nil || len(objs) != 0 {
		t.Errorf("empty JSON output %q: %v", buf.String(), err)
	}
}

func TestAggregateFormats(t *testing.T) {
	var h Histogram
	for _, ns := range []uint64{20_000, 22_000, 30_000} {
		h.Bins[HistLayout.Bucket(ns)]++
		h.Count++
		h.Sum += ns
	}
	h.Min, h.Max = 20_000, 30_000
	rx := Traffic{TcpTsPkts: 3, TcpTsBytes: 300, OtherPkts: 2, OtherBytes: 196}
	tx := Traffic{TcpNotsPkts: 1, TcpNotsBytes: 66}
	rep := &AggReport{Time: when, Subnets: []SubnetStats{
		{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Rx: rx, Tx: tx, Histogram: h},
		{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Side: SideLocal, Tx: rx},
		{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), 24), Other: true, Histogram: h},
	}}
	var buf bytes.Buffer
	w := NewWriter(&buf, Standard)
	if err := w.Aggregate(rep); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"10:04:05.123456789: 198.51.100.0/24 remote -> rxpkts=5, rxbytes=496, txpkts=1, txbytes=66, rtt-count=3, min=0.02 ms, mean=0.024 ms, ",
		"10:04:05.123456789: 192.0.2.0/24 local -> rxpkts=0, rxbytes=0, txpkts=5, txbytes=496\n",
		"10:04:05.123456789: 0.0.0.0/0 remote -> rxpkts=0, rxbytes=0, txpkts=0, txbytes=0, rtt-count=3,",
	}
	lines := strings.SplitAfter(strings.TrimSpace(buf.String())+"\n", "\n")
	if len(lines) != 4 || lines[3] != "" {
		t.Fatalf("standard aggregate output, want 3 lines:\n%s", buf.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("standard aggregate line %d:\n%s\nwant it to start with\n%s", i, lines[i], w)
		}
	}
	buf.Reset()
	w = NewWriter(&buf, JSONL)
	if err := w.Aggregate(rep); err != nil {
		t.Fatal(err)
	}
	var objs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var o map[string]any
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	// ePPing's layout: rx_stats/tx_stats with a {packets, bytes} object per non-empty kind.
	wantJSON := []string{
		`"ip_prefix":"198.51.100.0/24","side":"remote","rx_stats":{"TCP_TS":{"packets":3,"bytes":300},"other":{"packets":2,"bytes":196}},"tx_stats":{"TCP_noTS":{"packets":1,"bytes":66}},"count_rtt":3,"min_rtt":20000,`,
		`"ip_prefix":"192.0.2.0/24","side":"local","rx_stats":{},"tx_stats":{"TCP_TS":{"packets":3,"bytes":300},"other":{"packets":2,"bytes":196}}}`,
	}
	for i, w := range wantJSON {
		if line := strings.Split(buf.String(), "\n")[i]; !strings.Contains(line, w) {
			t.Errorf("JSON aggregate line %d:\n%s\nwant it to contain\n%s", i, line, w)
		}
	}
	if len(objs) != 3 || objs[0]["max_rtt"] != 30000.0 || len(objs[0]["histogram_bins"].([]any)) != 3 || objs[1]["count_rtt"] != nil {
		t.Errorf("JSON aggregate objects %v", objs)
	}
}

func TestSubnetMetrics(t *testing.T) {
	mt := &Metrics{subnets: map[subnetKey]*SubnetStats{}, lastSeen: map[subnetKey]time.Time{}}
	s := SubnetStats{Prefix: netip.MustParsePrefix("198.51.100.0/24"),
		Rx: Traffic{TcpTsPkts: 3, TcpTsBytes: 300}, Tx: Traffic{OtherPkts: 1, OtherBytes: 98}}
	for range 2 { // cumulative over reports
		if err := mt.Aggregate(&AggReport{Time: when, Subnets: []SubnetStats{s}}); err != nil {
			t.Fatal(err)
		}
	}
	// The exposition format, metrics and label sets sorted.
	var bytesLines, pktLines []string
	for _, dir := range []string{"rx", "tx"} {
		for _, kind := range []string{"other", "tcp_nots", "tcp_ts"} {
			pkts, bytes := 0, 0
			switch dir + "/" + kind {
			case "rx/tcp_ts":
				pkts, bytes = 6, 600
			case "tx/other":
				pkts, bytes = 2, 196
			}
			labels := fmt.Sprintf(`{direction=%q,prefix="198.51.100.0/24",side="remote",traffic=%q}`, dir, kind)
			bytesLines = append(bytesLines, fmt.Sprintf("kedge_pping_subnet_bytes_total%s %d\n", labels, bytes))
			pktLines = append(pktLines, fmt.Sprintf("kedge_pping_subnet_packets_total%s %d\n", labels, pkts))
		}
	}
	want := "# HELP kedge_pping_subnet_bytes_total " + subnetBytesHelp + "\n# TYPE kedge_pping_subnet_bytes_total counter\n" +
		strings.Join(bytesLines, "") + "# HELP kedge_pping_subnet_packets_total " + subnetPktsHelp +
		"\n# TYPE kedge_pping_subnet_packets_total counter\n" + strings.Join(pktLines, "")
	if err := testutil.CollectAndCompare(&subnetCollector{mt: mt}, strings.NewReader(want),
		"kedge_pping_subnet_packets_total", "kedge_pping_subnet_bytes_total", "kedge_pping_subnet_rtt_seconds"); err != nil {
		t.Error(err)
	}
}

// TestSubnetMetricsTimeout: a subnet without traffic for longer than the aggregation timeout
// (--aggregate-timeout) leaves the cumulative series; one with traffic stays.
func TestSubnetMetricsTimeout(t *testing.T) {
	mt := &Metrics{timeout: 30 * time.Second, subnets: map[subnetKey]*SubnetStats{}, lastSeen: map[subnetKey]time.Time{}}
	a := SubnetStats{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Rx: Traffic{OtherPkts: 1, OtherBytes: 98}}
	b := SubnetStats{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Rx: Traffic{OtherPkts: 1, OtherBytes: 98}}
	for _, step := range []struct {
		after   time.Duration
		subnets []SubnetStats
		want    []string
	}{
		{0, []SubnetStats{a, b}, []string{"198.51.100.0/24", "203.0.113.0/24"}},
		{20 * time.Second, []SubnetStats{b}, []string{"198.51.100.0/24", "203.0.113.0/24"}},
		{30 * time.Second, []SubnetStats{b, {Prefix: a.Prefix}}, []string{"198.51.100.0/24", "203.0.113.0/24"}}, // an empty entry is no traffic
		{31 * time.Second, []SubnetStats{b}, []string{"203.0.113.0/24"}},
	} {
		if err := mt.Aggregate(&AggReport{Time: when.Add(step.after), Subnets: step.subnets}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for k := range mt.subnets {
			got = append(got, k.prefix)
		}
		slices.Sort(got)
		if !slices.Equal(got, step.want) {
			t.Errorf("after %v: subnets %v, want %v", step.after, got, step.want)
		}
	}
}
