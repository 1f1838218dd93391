package raftbench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Probe measures the heartbeat round trip of one follower as its leader sees it. It runs
// in the leader's network namespace (`kedge bench raft-hbprobe`, started by the bench),
// sends MsgHeartbeat in the leader's name - from the leader's raft address (raw socket),
// current term, commit 0, an 8-byte context that numbers the probe - and takes the time
// until the MsgHeartbeatResp echoing that context arrives (a raw socket sees every UDP
// packet the namespace receives, the leader's own socket gets them too: etcd-raft ignores a
// heartbeat response whose context it does not know). Only for clusters without a key:
// the probe cannot sign.
type Probe struct {
	Cluster, Leader, Follower uint64
	From, To                  netip.AddrPort // the leader's and the follower's raft addresses (IPv4)
	Term                      uint64
	Count                     int
	Interval                  time.Duration
	Timeout                   time.Duration // per probe
}

// Run sends p.Count probes and returns the round trips in µs of those answered in time,
// and how many were not.
func (p Probe) Run() (rtts []float64, lost int, err error) {
	if !p.From.Addr().Is4() || !p.To.Addr().Is4() {
		return nil, 0, errors.New("heartbeat probe: IPv4 raft addresses only")
	}
	tx, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return nil, 0, fmt.Errorf("heartbeat probe: raw send socket: %w", err)
	}
	defer syscall.Close(tx)
	rx, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_UDP)
	if err != nil {
		return nil, 0, fmt.Errorf("heartbeat probe: raw receive socket: %w", err)
	}
	defer syscall.Close(rx)
	dst := &syscall.SockaddrInet4{Addr: p.To.Addr().As4()}
	buf := make([]byte, 2048)
	tag := uint32(time.Now().UnixNano())
	for i := range p.Count {
		ctx := binary.BigEndian.AppendUint32([]byte("kprb"), tag+uint32(i))
		pkt, err := wire.Encode(make([]byte, wire.PktLen), p.Cluster, &pb.Message{Type: pb.MsgHeartbeat.Enum(),
			From: proto.Uint64(p.Leader), To: proto.Uint64(p.Follower), Term: proto.Uint64(p.Term), Context: ctx})
		if err != nil {
			return nil, 0, err
		}
		frame := pktbuild.Datagram(p.From, p.To, pkt)
		sent := time.Now()
		if err := syscall.Sendto(tx, frame[14:], 0, dst); err != nil {
			return nil, 0, fmt.Errorf("heartbeat probe: send: %w", err)
		}
		got := false
		for deadline := sent.Add(p.Timeout); !got && time.Now().Before(deadline); {
			tv := syscall.NsecToTimeval(int64(time.Until(deadline)) + 1000)
			if err := syscall.SetsockoptTimeval(rx, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
				return nil, 0, err
			}
			n, _, err := syscall.Recvfrom(rx, buf, 0)
			if err != nil {
				if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
					continue
				}
				return nil, 0, fmt.Errorf("heartbeat probe: receive: %w", err)
			}
			if isProbeResp(buf[:n], p, ctx) {
				rtts = append(rtts, float64(time.Since(sent).Nanoseconds())/1e3)
				got = true
			}
		}
		if !got {
			lost++
		}
		time.Sleep(p.Interval) // pacing between probes
	}
	return rtts, lost, nil
}

// isProbeResp: an IPv4 datagram from the follower's raft address to the leader's carrying
// the MsgHeartbeatResp with this probe's context.
func isProbeResp(b []byte, p Probe, ctx []byte) bool {
	if len(b) < 20 || b[0]>>4 != 4 {
		return false
	}
	ihl := int(b[0]&0xf) * 4
	if len(b) < ihl+8+wire.PktLen || netip.AddrFrom4([4]byte(b[12:16])) != p.To.Addr() {
		return false
	}
	udp := b[ihl:]
	if binary.BigEndian.Uint16(udp[0:]) != p.To.Port() || binary.BigEndian.Uint16(udp[2:]) != p.From.Port() {
		return false
	}
	m, reason := wire.Decode(udp[8:8+wire.PktLen], p.Cluster, p.Leader)
	return reason == wire.OK && m.GetType() == pb.MsgHeartbeatResp && m.GetFrom() == p.Follower &&
		string(m.GetContext()) == string(ctx)
}
