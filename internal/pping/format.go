package pping

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
)

// Format is an output format.
type Format int

const (
	// Standard is ePPing's human-readable line per event.
	Standard Format = iota
	// JSON is one JSON array of event objects (ePPing's -F json).
	JSON
	// JSONL is one JSON object per line.
	JSONL
	// PPViz is Kathie Nichols' machine-readable format: time rtt minrtt flow (RTTs only).
	PPViz
)

// Formats lists the format names ParseFormat accepts.
var Formats = []string{"standard", "json", "jsonl", "ppviz"}

func (f Format) String() string { return Formats[f] }

// ParseFormat parses a format name.
func ParseFormat(s string) (Format, error) {
	for i, n := range Formats {
		if s == n {
			return Format(i), nil
		}
	}
	return 0, fmt.Errorf("unknown format %q (want standard, json, jsonl or ppviz)", s)
}

// Sink receives what the monitor produces.
type Sink interface {
	Event(Event) error
	Aggregate(*AggReport) error
}

// Writer formats events and aggregation reports onto a stream or a file. It is safe for
// concurrent use. A file Writer reopens its file on Reopen (SIGHUP), so logrotate can move
// the old one away.
type Writer struct {
	mu     sync.Mutex
	format Format
	path   string   // "" for a plain stream
	file   *os.File // when path != ""
	w      *bufio.Writer
	items  int // JSON: objects written into the current array
	closed bool
}

// NewWriter writes to w.
func NewWriter(w io.Writer, f Format) *Writer {
	wr := &Writer{format: f, w: bufio.NewWriter(w)}
	wr.start()
	return wr
}

// start opens the JSON array (ePPing writes it even when no event follows).
func (wr *Writer) start() {
	wr.items = 0
	if wr.format == JSON {
		wr.w.WriteString("[")
	}
}

// NewFileWriter appends to the file at path, creating it if needed.
func NewFileWriter(path string, f Format) (*Writer, error) {
	wr := &Writer{format: f, path: path}
	if err := wr.open(); err != nil {
		return nil, err
	}
	return wr, nil
}

func (wr *Writer) open() error {
	f, err := os.OpenFile(wr.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open output %s: %w", wr.path, err)
	}
	wr.file, wr.w = f, bufio.NewWriter(f)
	wr.start()
	return nil
}

// Reopen closes the output file and opens the path again (a no-op for streams).
func (wr *Writer) Reopen() error {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.path == "" {
		return nil
	}
	if err := wr.finish(); err != nil {
		return err
	}
	return wr.open()
}

// finish ends the JSON array, flushes and closes a file.
func (wr *Writer) finish() error {
	if wr.format == JSON {
		wr.w.WriteString("\n]\n")
	}
	err := wr.w.Flush()
	if wr.file != nil {
		if cerr := wr.file.Close(); err == nil {
			err = cerr
		}
		wr.file = nil
	}
	if err != nil {
		return fmt.Errorf("close output: %w", err)
	}
	return nil
}

// Close ends the output (closing a JSON array) and closes the file.
func (wr *Writer) Close() error {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.closed {
		return nil
	}
	wr.closed = true
	return wr.finish()
}

// Flush writes buffered output.
func (wr *Writer) Flush() error {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	return wr.w.Flush()
}

// Event writes one event.
func (wr *Writer) Event(ev Event) error {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	var err error
	switch wr.format {
	case Standard:
		err = writeStandard(wr.w, ev)
	case PPViz:
		if e, ok := ev.(*RTTEvent); ok { // ppviz has no flow events
			_, err = fmt.Fprintf(wr.w, "%s %.9f %.9f %s\n", unixSeconds(e.Time), e.RTT.Seconds(), e.MinRTT.Seconds(), e.Flow)
		}
	default:
		err = wr.writeJSON(eventJSON(ev))
	}
	if err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	return nil
}

// Aggregate writes one aggregation report (every subnet that had traffic or samples). The
// standard line is ePPing's: traffic, then the RTT summary when there were RTTs.
func (wr *Writer) Aggregate(rep *AggReport) error {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	for i := range rep.Subnets {
		s := &rep.Subnets[i]
		var err error
		if wr.format == Standard || wr.format == PPViz {
			fmt.Fprintf(wr.w, "%s: %s %s -> rxpkts=%d, rxbytes=%d, txpkts=%d, txbytes=%d", clockTime(rep.Time), s.name(), s.Side,
				s.Rx.Packets(), s.Rx.Bytes(), s.Tx.Packets(), s.Tx.Bytes())
			if s.Count > 0 {
				fmt.Fprintf(wr.w, ", rtt-count=%d, min=%s ms, mean=%s ms, median=%s ms, p95=%s ms, p99=%s ms, max=%s ms",
					s.Count, ms(time.Duration(s.Min)), ms(s.Mean()), ms(s.Quantile(0.5)), ms(s.Quantile(0.95)),
					ms(s.Quantile(0.99)), ms(time.Duration(s.Max)))
			}
			err = wr.w.WriteByte('\n')
		} else {
			err = wr.writeJSON(aggJSON(rep.Time, s))
		}
		if err != nil {
			return fmt.Errorf("write aggregate: %w", err)
		}
	}
	return wr.w.Flush()
}

func (s *SubnetStats) name() string {
	if s.Other {
		if s.Prefix.Addr().Is4() {
			return "0.0.0.0/0"
		}
		return "::/0"
	}
	return s.Prefix.String()
}

func (wr *Writer) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if wr.format == JSON {
		sep := ",\n"
		if wr.items == 0 {
			sep = "\n"
		}
		wr.w.WriteString(sep)
		wr.items++
		_, err = wr.w.Write(b)
		return err
	}
	wr.w.Write(b)
	return wr.w.WriteByte('\n')
}

// ms formats a duration in milliseconds with six significant digits (ePPing's %.6g).
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/1e6, 'g', 6, 64)
}

// clockTime is ePPing's time of day with nanoseconds: 15:04:05.000000000.
func clockTime(t time.Time) string { return t.Format("15:04:05.000000000") }

func unixSeconds(t time.Time) string {
	return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond())
}

func writeStandard(w io.Writer, ev Event) error {
	var err error
	switch e := ev.(type) {
	case *RTTEvent:
		_, err = fmt.Fprintf(w, "%s %s ms %s ms %s %s %s\n", clockTime(e.Time), ms(e.RTT), ms(e.MinRTT), e.Flow.Protocol(), e.Flow, e.Flow.IDType.Source())
	case *FlowEvent:
		_, err = fmt.Fprintf(w, "%s %s %s %s due to %s from %s\n", clockTime(e.Time), e.Flow.Protocol(), e.Flow, e.Type, e.Reason, e.Source)
	case *MapFullEvent:
		_, err = fmt.Fprintf(w, "%s Warning: unable to create %s entry for flow %s\n", clockTime(e.Time), e.Map, e.Flow)
	}
	return err
}

// jsonEvent holds ePPing's JSON field names; kedge's additions are id_type, source, srtt,
// id and conn_id.
type jsonEvent struct {
	Timestamp int64  `json:"timestamp"` // ns since the epoch
	SrcIP     string `json:"src_ip"`
	SrcPort   uint16 `json:"src_port"`
	DestIP    string `json:"dest_ip"`
	DestPort  uint16 `json:"dest_port"`
	Protocol  string `json:"protocol"`
	IDType    string `json:"id_type"`
	Source    string `json:"source,omitempty"` // RTT events: tsval, icmp, dns, udp, quic, kernel
	// RTT events
	RTT           *int64  `json:"rtt,omitempty"`
	MinRTT        *int64  `json:"min_rtt,omitempty"`
	SRTT          *int64  `json:"srtt,omitempty"`
	SentPackets   *uint64 `json:"sent_packets,omitempty"`
	SentBytes     *uint64 `json:"sent_bytes,omitempty"`
	RecPackets    *uint64 `json:"rec_packets,omitempty"`
	RecBytes      *uint64 `json:"rec_bytes,omitempty"`
	MatchOnEgress *bool   `json:"match_on_egress,omitempty"`
	ID            *uint64 `json:"id,omitempty"`
	ConnID        string  `json:"conn_id,omitempty"` // QUIC: the server's connection id, hex
	// flow events
	FlowEvent   string `json:"flow_event,omitempty"`
	Reason      string `json:"reason,omitempty"`
	TriggeredBy string `json:"triggered_by,omitempty"`
	// map-full warnings
	Warning string `json:"warning,omitempty"`
}

func flowJSON(t time.Time, f Flow) jsonEvent {
	return jsonEvent{
		Timestamp: t.UnixNano(),
		SrcIP:     f.Src.Addr().String(), SrcPort: f.Src.Port(),
		DestIP: f.Dst.Addr().String(), DestPort: f.Dst.Port(),
		Protocol: f.Protocol(), IDType: f.IDType.String(),
	}
}

func eventJSON(ev Event) jsonEvent {
	switch e := ev.(type) {
	case *RTTEvent:
		j := flowJSON(e.Time, e.Flow)
		rtt, minRTT, srtt := int64(e.RTT), int64(e.MinRTT), int64(e.SRTT)
		j.RTT, j.MinRTT, j.SRTT = &rtt, &minRTT, &srtt
		j.SentPackets, j.SentBytes, j.RecPackets, j.RecBytes = &e.SentPackets, &e.SentBytes, &e.RecPackets, &e.RecBytes
		j.MatchOnEgress, j.ID = &e.MatchOnEgress, &e.ID
		j.Source = e.Flow.IDType.Source()
		j.ConnID = hex.EncodeToString(e.ConnID)
		return j
	case *FlowEvent:
		j := flowJSON(e.Time, e.Flow)
		j.FlowEvent, j.Reason, j.TriggeredBy = e.Type.String(), e.Reason.String(), e.Source.String()
		return j
	case *MapFullEvent:
		j := flowJSON(e.Time, e.Flow)
		j.Warning = e.Map + " map full"
		return j
	}
	return jsonEvent{}
}

// jsonAgg holds ePPing's aggregation field names: rx_stats and tx_stats always, the RTT
// fields only for subnets with RTTs. ePPing's "histogram" is linear 4 ms bins; kedge's
// log-linear bins are in "histogram_bins" as [lower edge ns, count] pairs (non-empty bins
// only), so tools that expect ePPing's layout do not misread them.
type jsonAgg struct {
	Timestamp int64       `json:"timestamp"`
	IPPrefix  string      `json:"ip_prefix"`
	Side      string      `json:"side"` // remote or local (kedge's addition)
	RxStats   jsonTraffic `json:"rx_stats"`
	TxStats   jsonTraffic `json:"tx_stats"`
	*jsonAggRTT
}

type jsonAggRTT struct {
	CountRTT  uint64      `json:"count_rtt"`
	MinRTT    uint64      `json:"min_rtt"`
	MeanRTT   float64     `json:"mean_rtt"`
	MedianRTT float64     `json:"median_rtt"`
	P95RTT    float64     `json:"p95_rtt"`
	P99RTT    float64     `json:"p99_rtt"`
	MaxRTT    uint64      `json:"max_rtt"`
	Bins      [][2]uint64 `json:"histogram_bins"`
}

// jsonTraffic is ePPing's traffic object: a {packets, bytes} tuple per kind of traffic,
// empty kinds left out.
type jsonTraffic struct {
	TCPTS   *jsonPktBytes `json:"TCP_TS,omitempty"`
	TCPNoTS *jsonPktBytes `json:"TCP_noTS,omitempty"`
	Other   *jsonPktBytes `json:"other,omitempty"`
}

type jsonPktBytes struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

func pktBytes(pkts, bytes uint64) *jsonPktBytes {
	if pkts == 0 {
		return nil
	}
	return &jsonPktBytes{pkts, bytes}
}

func trafficJSON(t *Traffic) jsonTraffic {
	return jsonTraffic{
		TCPTS:   pktBytes(t.TcpTsPkts, t.TcpTsBytes),
		TCPNoTS: pktBytes(t.TcpNotsPkts, t.TcpNotsBytes),
		Other:   pktBytes(t.OtherPkts, t.OtherBytes),
	}
}

func aggJSON(t time.Time, s *SubnetStats) jsonAgg {
	j := jsonAgg{Timestamp: t.UnixNano(), IPPrefix: s.name(), Side: s.Side.String(), RxStats: trafficJSON(&s.Rx), TxStats: trafficJSON(&s.Tx)}
	if s.Count == 0 {
		return j
	}
	j.jsonAggRTT = &jsonAggRTT{
		CountRTT: s.Count, MinRTT: s.Min, MaxRTT: s.Max, MeanRTT: float64(s.Mean()),
		MedianRTT: float64(s.Quantile(0.5)), P95RTT: float64(s.Quantile(0.95)), P99RTT: float64(s.Quantile(0.99)),
	}
	for b, n := range s.Bins {
		if n > 0 {
			j.Bins = append(j.Bins, [2]uint64{HistLayout.Lower(b), n})
		}
	}
	return j
}
