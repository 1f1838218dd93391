// Package config reads and checks a kedge raft node's config file (docs/raft.md section 1).
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/kedge-dev/kedge/internal/strictyaml"
)

// Peer is one member of the static membership.
type Peer struct {
	ID     uint64 `yaml:"id"`
	Raft   string `yaml:"raft"`   // host:port, UDP and TCP
	Client string `yaml:"client"` // host:port, HTTP
}

// Config is node.yaml.
type Config struct {
	ClusterID       uint64        `yaml:"cluster_id"`
	ID              uint64        `yaml:"id"`
	DataDir         string        `yaml:"data_dir"`
	Peers           []Peer        `yaml:"peers"`
	BindRaft        string        `yaml:"bind_raft"`
	BindClient      string        `yaml:"bind_client"`
	Tick            time.Duration `yaml:"tick"`
	ElectionTicks   int           `yaml:"election_ticks"`
	HeartbeatTicks  int           `yaml:"heartbeat_ticks"`
	SnapshotEntries uint64        `yaml:"snapshot_entries"`
	KeepEntries     uint64        `yaml:"keep_entries"`
	MaxAppendBytes  uint64        `yaml:"max_append_bytes"`
	MaxInflight     int           `yaml:"max_inflight"`
	RequestTimeout  time.Duration `yaml:"request_timeout"`
	// ClusterKey authenticates every UDP packet (docs/raft.md, "Kernel paths: pre-vote and
	// authentication"): 32 hex digits in the file (cluster_key) or in a file of its own
	// (cluster_key_file, mode 0600 or stricter). Never logged or printed.
	ClusterKey     *wire.Key `yaml:"cluster_key"`
	ClusterKeyFile string    `yaml:"cluster_key_file"`
}

// Defaults fills the optional fields that are zero.
func (c *Config) Defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.ElectionTicks, 10)
	def(&c.HeartbeatTicks, 1)
	def(&c.MaxInflight, 256)
	if c.Tick == 0 {
		c.Tick = 10 * time.Millisecond
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = 10000
	}
	if c.KeepEntries == 0 {
		c.KeepEntries = min(5000, c.SnapshotEntries)
	}
	if c.MaxAppendBytes == 0 {
		c.MaxAppendBytes = 1 << 20
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 5 * time.Second
	}
}

// Load reads path, applies the overrides (id, dataDir: zero means none) and the defaults,
// and checks the result.
func Load(path string, id uint64, dataDir string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(b, id, dataDir)
}

// Parse is Load on the file's contents.
func Parse(b []byte, id uint64, dataDir string) (*Config, error) {
	var c Config
	if err := decode(b, &c); err != nil {
		return nil, err
	}
	if id != 0 {
		c.ID = id
	}
	if dataDir != "" {
		c.DataDir = dataDir
	}
	c.DataDir = strings.ReplaceAll(c.DataDir, "{id}", strconv.FormatUint(c.ID, 10))
	if err := c.loadKey(); err != nil {
		return nil, err
	}
	c.Defaults()
	if err := c.Check(); err != nil {
		return nil, err
	}
	return &c, nil
}

// decode reads a config strictly: a mistyped key is named with its line and the nearest
// valid key, an empty file says so.
func decode(b []byte, c *Config) error {
	if err := strictyaml.Decode(b, c); err != nil {
		if errors.Is(err, strictyaml.ErrEmpty) {
			return errors.New("parse config: the file is empty: declare id, peers and data_dir (docs/raft.md has an example)")
		}
		return fmt.Errorf("parse config: %w", err)
	}
	return nil
}

// LoadPeers reads only the peers of a config (a client needs their addresses, not an id).
func LoadPeers(path string) ([]Peer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var c Config
	if err := decode(b, &c); err != nil {
		return nil, err
	}
	if len(c.Peers) == 0 {
		return nil, fmt.Errorf("config %s: no peers", path)
	}
	for i, p := range c.Peers {
		if _, _, err := splitHostPort(p.Client); err != nil {
			return nil, fmt.Errorf("config: peers[%d].client: %w", i, err)
		}
	}
	return c.Peers, nil
}

// Check validates the config; errors name the offending key.
func (c *Config) Check() error {
	if c.ClusterID == 0 {
		return errors.New("config: cluster_id must be set and non-zero")
	}
	if c.ID == 0 {
		return errors.New("config: id must be set and non-zero (in the file or with --id)")
	}
	if c.DataDir == "" {
		return errors.New("config: data_dir must be set (in the file or with --data-dir)")
	}
	switch len(c.Peers) {
	case 1, 3, 5, 7:
	default:
		return fmt.Errorf("config: peers: %d peers, want 1, 3, 5 or 7", len(c.Peers))
	}
	seen := map[uint64]bool{}
	for i, p := range c.Peers {
		if p.ID == 0 {
			return fmt.Errorf("config: peers[%d].id must be non-zero", i)
		}
		if seen[p.ID] {
			return fmt.Errorf("config: peers[%d].id %d appears twice", i, p.ID)
		}
		seen[p.ID] = true
		if _, err := ResolveAddr(p.Raft); err != nil {
			return fmt.Errorf("config: peers[%d].raft: %w", i, err)
		}
		if _, _, err := splitHostPort(p.Client); err != nil {
			return fmt.Errorf("config: peers[%d].client: %w", i, err)
		}
	}
	if !seen[c.ID] {
		return fmt.Errorf("config: id %d is not among the peers", c.ID)
	}
	for key, a := range map[string]string{"bind_raft": c.BindRaft, "bind_client": c.BindClient} {
		if a == "" {
			continue
		}
		if _, _, err := splitHostPort(a); err != nil {
			return fmt.Errorf("config: %s: %w", key, err)
		}
	}
	if c.Tick < time.Millisecond {
		return fmt.Errorf("config: tick %v is below 1ms", c.Tick)
	}
	if c.HeartbeatTicks < 1 || c.ElectionTicks <= c.HeartbeatTicks {
		return fmt.Errorf("config: want election_ticks (%d) > heartbeat_ticks (%d) >= 1", c.ElectionTicks, c.HeartbeatTicks)
	}
	if c.KeepEntries > c.SnapshotEntries {
		return fmt.Errorf("config: keep_entries (%d) > snapshot_entries (%d)", c.KeepEntries, c.SnapshotEntries)
	}
	if c.MaxAppendBytes > 4<<20 {
		return fmt.Errorf("config: max_append_bytes %d is above 4 MiB (the bulk frame limit is 8 MiB)", c.MaxAppendBytes)
	}
	if c.RequestTimeout <= 0 || c.MaxInflight < 1 {
		return errors.New("config: request_timeout and max_inflight must be positive")
	}
	return nil
}

// Self is this node's peer entry.
func (c *Config) Self() Peer {
	for _, p := range c.Peers {
		if p.ID == c.ID {
			return p
		}
	}
	return Peer{}
}

// RaftBind and ClientBind are the listen addresses.
func (c *Config) RaftBind() string   { return or(c.BindRaft, c.Self().Raft) }
func (c *Config) ClientBind() string { return or(c.BindClient, c.Self().Client) }

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ResolveAddr turns a peer's raft address into an IP and port (hostnames are resolved once).
func ResolveAddr(s string) (netip.AddrPort, error) {
	host, port, err := splitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		ips, lerr := net.LookupIP(host)
		if lerr != nil || len(ips) == 0 {
			return netip.AddrPort{}, fmt.Errorf("resolve %q: %v", host, lerr)
		}
		ip, _ = netip.AddrFromSlice(ips[0])
	}
	return netip.AddrPortFrom(ip.Unmap(), port), nil
}

func splitHostPort(s string) (string, uint16, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: want host:port", s)
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: port must be a number 0-65535", s)
	}
	return host, uint16(p), nil
}

// loadKey reads cluster_key_file into ClusterKey.
func (c *Config) loadKey() error {
	if c.ClusterKeyFile == "" {
		return nil
	}
	if c.ClusterKey != nil {
		return errors.New("config: cluster_key and cluster_key_file are both set: keep one")
	}
	f, err := os.Open(c.ClusterKeyFile)
	if err != nil {
		return fmt.Errorf("config: cluster_key_file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("config: cluster_key_file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("config: cluster_key_file %s is readable by group or others (mode %v): chmod 600 it", c.ClusterKeyFile, st.Mode().Perm())
	}
	b := make([]byte, 256)
	n, _ := f.Read(b)
	k, err := wire.ParseKey(string(b[:n]))
	if err != nil {
		return fmt.Errorf("config: cluster_key_file %s: %w", c.ClusterKeyFile, err)
	}
	c.ClusterKey = &k
	return nil
}
