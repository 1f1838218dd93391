package sg_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/pkg/sg"
)

// Sum a 4-element int64 vector over 16 workers listening on consecutive ports.
func Example() {
	var workers []netip.AddrPort
	for i := range 16 {
		workers = append(workers, netip.AddrPortFrom(netip.MustParseAddr("10.77.0.2"), uint16(9000+i)))
	}
	g, err := sg.Open(sg.Config{
		Interface: "eth0",
		Workers:   workers,
		Reduction: sg.Sum,
		Type:      sg.Int64,
		Elems:     4,
		Timeout:   10 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	res, err := g.Scatter(context.Background(), []byte("query"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status, res.Count, res.Values)
}

// Complete a request when any 3 of the workers have answered, or fail at once when every
// request slot is busy.
func ExampleGroup_ScatterWith() {
	g, err := sg.Open(sg.Config{
		Interface: "lo",
		Workers:   []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9000"), netip.MustParseAddrPort("127.0.0.1:9001"), netip.MustParseAddrPort("127.0.0.1:9002"), netip.MustParseAddrPort("127.0.0.1:9003")},
		Reduction: sg.Max,
		Type:      sg.Int32,
		Elems:     1,
		InFlight:  32,
		OnFull:    sg.Fail,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	res, err := g.ScatterWith(context.Background(), nil, sg.RequestOptions{Need: 3, Timeout: 5 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status, res.Answered, res.Values)
}
