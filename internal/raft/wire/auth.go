package wire

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"structs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// Authentication of the UDP packets: the Go side of bpf/raft/auth.h (docs/raft.md, "Kernel
// paths: pre-vote and authentication"). With a cluster key every packet carries RAFT_F_MAC,
// an auth_seq and mac = SipHash-2-4-128(key, bytes 0..MACCover-1); without a key those
// fields are zero. The peer allowlist (from = a configured peer at its address) is the
// transport's check; Verifier adds the MAC and the replay window.

// MACCover is how many leading bytes of the packet the MAC covers: all but the MAC.
const MACCover = offMAC

// SeqKernel is auth_seq's bit 63: the sequence was drawn by a kernel sender of the node
// (XDP replies, kernel-sent heartbeats); clear for the node's user space.
const SeqKernel = 1 << 63

// ReplayWindow is how far below the highest accepted auth_seq of a sender a packet may be
// (reordering) and still be accepted once.
const ReplayWindow = 64

// Key is a 16-byte cluster key. It never prints: String, GoString, LogValue and
// MarshalText all give "[redacted]".
type Key [16]byte

// ParseKey reads a key of 32 hex digits (surrounding white space ignored).
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != len(k) {
		return k, fmt.Errorf("parse cluster key: want 32 hex digits (16 bytes), e.g. from 'openssl rand -hex 16'")
	}
	copy(k[:], b)
	return k, nil
}

func (k Key) halves() (uint64, uint64) {
	return binary.LittleEndian.Uint64(k[:8]), binary.LittleEndian.Uint64(k[8:])
}

func (Key) String() string               { return "[redacted]" }
func (Key) GoString() string             { return "[redacted]" }
func (Key) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (Key) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }
func (k Key) Format(f fmt.State, _ rune) { f.Write([]byte("[redacted]")) }

// UnmarshalText reads 32 hex digits (config files).
func (k *Key) UnmarshalText(b []byte) error {
	v, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

func (k *Key) zero() bool { return k == nil || *k == Key{} }

// MAC computes the packet's MAC (p holds at least MACCover bytes).
func MAC(k *Key, p []byte) [MACLen]byte {
	k0, k1 := k.halves()
	a, b := SipHash128(k0, k1, p[:MACCover])
	var m [MACLen]byte
	binary.LittleEndian.PutUint64(m[:8], a)
	binary.LittleEndian.PutUint64(m[8:], b)
	return m
}

// Signer signs the packets of one node's user space.
type Signer struct {
	key *Key
	seq atomic.Uint64
}

// NewSigner returns a signer for key (nil: packets go out without a MAC). The sequence
// starts at the wall clock in ns, so a restarted node starts above what it sent before.
func NewSigner(key *Key) *Signer {
	s := &Signer{}
	if !key.zero() {
		s.key = key
	}
	s.seq.Store(SeqStart())
	return s
}

// SeqStart is where a sender's auth_seq starts: CLOCK_REALTIME in ns (below bit 63).
func SeqStart() uint64 { return uint64(time.Now().UnixNano()) &^ SeqKernel }

// Sign sets the authentication fields of an encoded packet (len(p) == PktLen).
func (s *Signer) Sign(p []byte) {
	if s == nil || s.key == nil {
		return
	}
	seq := s.seq.Add(1) &^ SeqKernel
	p[offFlags] |= FlagMAC
	binary.BigEndian.PutUint64(p[offAuthSeq:], seq)
	m := MAC(s.key, p)
	copy(p[offMAC:], m[:])
}

type replayWindow struct{ top, seen uint64 }

// check is raft_replay_check(): RFC 4303's sliding window.
func (w *replayWindow) check(seq uint64) Reason {
	if seq == 0 {
		return DropStale
	}
	if seq > w.top {
		if d := seq - w.top; d >= ReplayWindow {
			w.seen = 1
		} else {
			w.seen = w.seen<<d | 1
		}
		w.top = seq
		return OK
	}
	d := w.top - seq
	switch {
	case d >= ReplayWindow:
		return DropStale
	case w.seen&(1<<d) != 0:
		return DropReplay
	}
	w.seen |= 1 << d
	return OK
}

// Verifier checks the authentication fields of received packets, as raft_auth() does
// after the allowlist.
type Verifier struct {
	key  *Key
	mark atomic.Pointer[Mark] // SetPassMark
	mu   sync.Mutex
	win  map[uint64]*[2]replayWindow // peer id -> [user space, kernel] windows
	// Marked counts the packets accepted by their pass mark (no SipHash in user space).
	Marked atomic.Uint64
}

// Mark is a pass mark: 16 random bytes the follower program (bpf/raft/raftxdp.bpf.c) writes
// over the MAC of a packet whose MAC it verified before passing it up. It never leaves the
// host and no sender knows it: a packet that arrives carrying it fails the program's MAC
// check like any other forgery.
type Mark [MACLen]byte

// NewMark draws a pass mark from crypto/rand.
func NewMark() (Mark, error) {
	var m Mark
	if _, err := rand.Read(m[:]); err != nil {
		return Mark{}, fmt.Errorf("draw a pass mark: %w", err)
	}
	return m, nil
}

// Halves are the mark as the program's two little-endian words (struct raftx_config's mark).
func (m Mark) Halves() (uint64, uint64) {
	return binary.LittleEndian.Uint64(m[:8]), binary.LittleEndian.Uint64(m[8:])
}

// SetPassMark makes Verify accept m in place of the MAC of a keyed packet: the program that
// writes it verified the MAC already. Set it before the program is attached (a marked packet
// that reaches a verifier without the mark is refused as DropMAC). The replay window is
// checked either way. Without a key it does nothing: unkeyed packets carry no MAC to replace.
func (v *Verifier) SetPassMark(m Mark) {
	if v.key != nil && m != (Mark{}) {
		v.mark.Store(&m)
	}
}

// NewVerifier returns a verifier for key (nil: no key, the MAC fields must be zero).
func NewVerifier(key *Key) *Verifier {
	v := &Verifier{win: map[uint64]*[2]replayWindow{}}
	if !key.zero() {
		v.key = key
	}
	return v
}

// Verify checks p (a packet Decode accepted, from a peer the allowlist accepted).
func (v *Verifier) Verify(p []byte) Reason {
	if len(p) != PktLen {
		return DropShort
	}
	seq := binary.BigEndian.Uint64(p[offAuthSeq:])
	if v.key == nil {
		if p[offFlags]&FlagMAC != 0 || seq != 0 || !allZero(p[offMAC:]) {
			return DropFlags
		}
		return OK
	}
	if p[offFlags]&FlagMAC == 0 {
		return DropMAC
	}
	if mk := v.mark.Load(); mk != nil && subtle.ConstantTimeCompare(mk[:], p[offMAC:offMAC+MACLen]) == 1 {
		v.Marked.Add(1)
	} else if m := MAC(v.key, p); subtle.ConstantTimeCompare(m[:], p[offMAC:offMAC+MACLen]) != 1 {
		return DropMAC
	}
	from := From(p)
	v.mu.Lock()
	defer v.mu.Unlock()
	w := v.win[from]
	if w == nil {
		w = new([2]replayWindow)
		v.win[from] = w
	}
	ch := 0
	if seq&SeqKernel != 0 {
		ch = 1
	}
	return w[ch].check(seq &^ SeqKernel)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// AuthPeer is an allowlist entry: a peer's id and raft address.
type AuthPeer struct {
	ID   uint64
	Addr netip.AddrPort
}

// AuthMaps are the maps auth.h defines, as a program that includes it was loaded.
type AuthMaps struct {
	Config, Peers, TxSeq *ebpf.Map
}

// authConfig mirrors struct raft_auth_config and authPeer struct raft_peer
// (bpf/raft/auth.h); TestAuthMirrors pins them to the compiled structs.
type authConfig struct {
	_         structs.HostLayout
	ClusterID uint64
	K0, K1    uint64
	KeySet    uint32
	_         uint32
}

type authPeer struct {
	_    structs.HostLayout
	Addr [16]byte // IPv4 v4-mapped
	Port uint16   // network order
	_    [2]byte
	_    uint32
	Lock uint32 // struct bpf_spin_lock: the kernel keeps its own
	_    uint32
	Win  [2]struct{ Top, Seen uint64 }
}

// Fill writes the cluster id, the key (nil: none), the allowlist and the kernel senders'
// first auth_seq into the maps. It resets the replay windows of the peers it writes.
func (m AuthMaps) Fill(cluster uint64, key *Key, peers []AuthPeer) error {
	cfg := authConfig{ClusterID: cluster}
	if !key.zero() {
		cfg.K0, cfg.K1 = key.halves()
		cfg.KeySet = 1
	}
	if err := m.Config.Update(uint32(0), &cfg, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write raft auth config: %w", err)
	}
	for _, p := range peers {
		var v authPeer
		v.Addr = p.Addr.Addr().As16() // IPv4 comes out v4-mapped, as parse.h stores it
		v.Port = bpfx.Htons(p.Addr.Port())
		if err := m.Peers.Update(p.ID, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write raft peer %d: %w", p.ID, err)
		}
	}
	if err := m.TxSeq.Update(uint32(0), SeqStart(), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write raft kernel sequence: %w", err)
	}
	return nil
}

// Receiver is a node's whole user-space check of a received UDP packet, in the order of the
// kernel's raft_hdr_check() + raft_auth(): the header (Decode), the allowlist (from is a
// peer and src is its address), then Verifier.
type Receiver struct {
	Cluster, Self uint64
	Peers         map[uint64]netip.AddrPort // the other nodes' raft addresses
	Verifier      *Verifier
}

// Receive returns the message of p, received from src, or why it was refused.
func (r *Receiver) Receive(p []byte, src netip.AddrPort) (*pb.Message, Reason) {
	m, reason := Decode(p, r.Cluster, r.Self)
	if reason != OK {
		return nil, reason
	}
	if a, ok := r.Peers[m.GetFrom()]; !ok || a != netip.AddrPortFrom(src.Addr().Unmap(), src.Port()) {
		return nil, DropPeer
	}
	if reason = r.Verifier.Verify(p); reason != OK {
		return nil, reason
	}
	return m, OK
}
