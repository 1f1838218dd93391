package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

func init() { register(newDemoCmd) }

const (
	demoPort    = 7007
	demoTimeout = time.Second // per round trip; a lost packet costs this much
)

func newDemoCmd() *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show kedge on this machine: probe, lab, a measured UDP round trip, teardown",
		Long: `Demo prints what this kernel offers kedge, brings up a lab (client, srv1, srv2 on
a bridge), measures UDP round trips between client and srv1, removes the lab and
checks that nothing of it is left. 'make demo' runs 'kedge cleanup --quiet' first.`,
		Example: `  sudo kedge demo
  sudo kedge demo --count 10000`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 1 || count > 1_000_000 {
				return usagef("--count %d is out of range: use 1-1000000", count)
			}
			ctx, stop := untilDone(cmd.Context(), 0)
			defer stop()
			return runDemo(ctx, cmd.OutOrStdout(), count)
		},
	}
	cmd.Flags().IntVar(&count, "count", 1000, "UDP round trips to measure")
	cmd.AddCommand(newDemoTourCmd())
	return cmd
}

func runDemo(ctx context.Context, w io.Writer, count int) (err error) {
	fmt.Fprintln(w, "== 1/4 what this kernel offers kedge")
	r, err := probeRun(ctx)
	if err != nil {
		return err
	}
	if err := r.WriteTable(w); err != nil {
		return err
	}
	if err := unsupported(r); err != nil {
		return err
	}

	fmt.Fprintln(w, "\n== 2/4 lab: client, srv1, srv2 on a bridge")
	l, err := lab.Up(lab.Spec{Name: "demo", Fabric: lab.Bridge, Hosts: []string{"client", "srv1", "srv2"}})
	if err != nil {
		return rootHint(fmt.Errorf("create demo lab: %w", err))
	}
	closed := false
	defer func() {
		if !closed {
			err = errors.Join(err, l.Close())
		}
	}()
	if err := writeLab(w, l); err != nil {
		return err
	}

	client, srv := l.Host("client"), l.Host("srv1")
	fmt.Fprintf(w, "\n== 3/4 %d UDP round trips %s (%s) -> %s (%s:%d), measured in Go\n",
		count, client.HostName, client.IPv4, srv.HostName, srv.IPv4, demoPort)
	rtts, lost, err := udpRoundTrips(ctx, client, srv, count)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, summarize(rtts, lost))

	fmt.Fprintln(w, "\n== 4/4 teardown")
	closed = true
	if err := l.Close(); err != nil {
		return err
	}
	left, err := ownNamespaces()
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("namespaces left after teardown: %s (remove them with 'kedge cleanup')", strings.Join(left, ", "))
	}
	fmt.Fprintln(w, "lab removed; no kedge namespace of this run is left")
	return nil
}

// udpRoundTrips runs an echo server in srv and sends count numbered datagrams from client,
// one at a time, timing each until its echo arrives.
func udpRoundTrips(ctx context.Context, client, srv *lab.Host, count int) (rtts []time.Duration, lost int, err error) {
	var server *net.UDPConn
	err = srv.Do(func() (err error) {
		server, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(srv.IPv4, demoPort)))
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("listen in %s: %w", srv.HostName, err)
	}
	defer server.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := server.ReadFromUDPAddrPort(buf)
			if err != nil {
				return // closed
			}
			_, _ = server.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	var conn *net.UDPConn
	err = client.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(srv.IPv4, demoPort)))
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("dial from %s: %w", client.HostName, err)
	}
	defer conn.Close()

	req, resp := make([]byte, 8), make([]byte, 64)
	for seq := uint64(0); seq < uint64(count); seq++ {
		if err := ctx.Err(); err != nil {
			return nil, 0, fmt.Errorf("measure round trips: %w", err)
		}
		binary.BigEndian.PutUint64(req, seq)
		start := time.Now()
		if _, err := conn.Write(req); err != nil {
			return nil, 0, fmt.Errorf("send to %s: %w", srv.HostName, err)
		}
		if err := conn.SetReadDeadline(start.Add(demoTimeout)); err != nil {
			return nil, 0, fmt.Errorf("set deadline: %w", err)
		}
		for {
			n, err := conn.Read(resp)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				lost++
				break
			}
			if err != nil {
				return nil, 0, fmt.Errorf("receive from %s: %w", srv.HostName, err)
			}
			if n == len(req) && binary.BigEndian.Uint64(resp) == seq { // else a late echo
				rtts = append(rtts, time.Since(start))
				break
			}
		}
		if lost > count/10+3 {
			return nil, 0, fmt.Errorf("%d of %d round trips lost: the lab does not forward", lost, seq+1)
		}
	}
	return rtts, lost, nil
}

func summarize(rtts []time.Duration, lost int) string {
	if len(rtts) == 0 {
		return fmt.Sprintf("no echo received (%d lost)", lost)
	}
	s := slices.Clone(rtts)
	slices.Sort(s)
	pct := func(p float64) time.Duration { return s[int(p*float64(len(s)-1))] }
	us := func(d time.Duration) string { return fmt.Sprintf("%.1fus", float64(d)/float64(time.Microsecond)) }
	return fmt.Sprintf("round trip: min %s  p50 %s  p90 %s  p99 %s  max %s  (%d measured, %d lost)",
		us(s[0]), us(pct(0.50)), us(pct(0.90)), us(pct(0.99)), us(s[len(s)-1]), len(s), lost)
}

// ownNamespaces lists the namespaces this process still owns.
func ownNamespaces() ([]string, error) {
	names, err := netnsx.List()
	var own []string
	for _, n := range names {
		if pid, ok := netnsx.OwnerPID(n); ok && pid == os.Getpid() {
			own = append(own, n)
		}
	}
	return own, err
}
