package hedgebench

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// TestProgFrames: the frames MeasurePrograms times are requests to the service with the id
// in the service's field and their responses back, with valid checksums; a client of the
// other address family or an id that does not fit is refused.
func TestProgFrames(t *testing.T) {
	s := hedge.ServiceConfig{Address: "192.0.2.10:9999", RequestID: hedge.RequestIDSpec{Offset: 2, Length: 4}}
	client := netip.MustParseAddrPort("192.0.2.1:40000")
	reqs, resps, err := progFrames(s, client, 7, 3, 32)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || len(resps) != 3 {
		t.Fatalf("%d requests, %d responses, want 3 each", len(reqs), len(resps))
	}
	const udpPayload = 14 + 20 + 8
	for i := range reqs {
		for _, f := range [][]byte{reqs[i], resps[i]} {
			if err := pktbuild.VerifyChecksums(f); err != nil {
				t.Errorf("frame %d: %v", i, err)
			}
			if id := binary.BigEndian.Uint32(f[udpPayload+2:]); id != uint32(7+i) {
				t.Errorf("frame %d: id %d, want %d", i, id, 7+i)
			}
		}
		if dport := binary.BigEndian.Uint16(reqs[i][14+20+2:]); dport != 9999 {
			t.Errorf("request %d to port %d, want the service's 9999", i, dport)
		}
	}
	if _, _, err := progFrames(s, netip.MustParseAddrPort("[2001:db8::1]:40000"), 1, 1, 32); err == nil {
		t.Error("an IPv6 client of an IPv4 service accepted")
	}
	if _, _, err := progFrames(s, client, 1, 1, 4); err == nil {
		t.Error("a 4-byte id at offset 2 of a 4-byte payload accepted")
	}
}
