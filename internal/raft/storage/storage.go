package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// Storage is a node's data_dir: the live WAL segment, the snapshots, and the etcd-raft
// MemoryStorage rebuilt from them, which etcd-raft reads through (it implements
// raft.Storage). Not safe for concurrent use: the node's Ready loop owns it.
type Storage struct {
	*raft.MemoryStorage

	dir    string
	lock   *os.File
	seg    *os.File
	segSeq uint64
	off    int64         // where the live segment's next record goes
	alloc  int64         // the live segment's size: preallocated space (zeros) from off to here
	hs     *pb.HardState // last HardState written
	log    *slog.Logger

	// FsyncObserver, if set, is called with the duration of every WAL fsync.
	FsyncObserver func(time.Duration)
}

// Recovered is what Open found.
type Recovered struct {
	Snapshot  *pb.Snapshot // nil when the node never took or received one
	HardState *pb.HardState
	Entries   int    // entries replayed after the snapshot
	Fresh     bool   // nothing durable: the node must bootstrap
	TornBytes int64  // bytes of a torn write cut from the live segment's tail (zeroed again)
	Segment   string // the live segment's path
}

const (
	walDir        = "wal"
	snapDir       = "snap"
	walExt        = ".wal"
	snapExt       = ".snap"
	tmpExt        = ".tmp"
	keepSnapshots = 2
)

// SegmentPrealloc is the space a WAL segment is given ahead of its records, and the step by
// which a full one grows: etcd's segment size. Records are then written into space the file
// already has (fallocate), so an fdatasync flushes their blocks without a journal
// transaction for the file's new size on every write. Tests may lower it.
var SegmentPrealloc int64 = 64 << 20

// Open locks dir, recovers its state (creating the layout when dir is new) and returns the
// storage with MemoryStorage filled: snapshot, entries, HardState.
func Open(dir string, log *slog.Logger) (*Storage, *Recovered, error) {
	for _, d := range []string{dir, filepath.Join(dir, walDir), filepath.Join(dir, snapDir)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, nil, fmt.Errorf("create data dir: %w", err)
		}
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, nil, fmt.Errorf("lock data dir %s: %w (another kedge raft node uses it; stop it or choose another --data-dir)", dir, err)
	}
	s := &Storage{MemoryStorage: raft.NewMemoryStorage(), dir: dir, lock: lock, log: log, hs: &pb.HardState{}}
	rec, err := s.recover()
	if err != nil {
		lock.Close()
		return nil, nil, err
	}
	return s, rec, nil
}

func (s *Storage) recover() (*Recovered, error) {
	removeTemps(filepath.Join(s.dir, walDir))
	removeTemps(filepath.Join(s.dir, snapDir))
	segs, err := listSeq(filepath.Join(s.dir, walDir), walExt)
	if err != nil {
		return nil, err
	}
	if len(segs) == 0 {
		// A new data dir: an empty segment that starts at index 0.
		if err := s.cut(&pb.SnapshotMetadata{ConfState: &pb.ConfState{}}, nil); err != nil {
			return nil, err
		}
		return &Recovered{Fresh: true, HardState: &pb.HardState{}, Segment: s.SegmentPath()}, nil
	}
	s.segSeq = segs[len(segs)-1]
	path := s.segPath(s.segSeq)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open wal segment: %w", err)
	}
	b, zeros, err := readSegment(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read wal segment: %w", err)
	}
	r, err := replay(b, zeros)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("replay %s: %w (the data dir is damaged: restore it or remove it and let the node catch up from its peers)", path, err)
	}
	if r.torn > 0 {
		// Cut, then preallocated again: the space after the log's end reads as zeros,
		// which the torn-write rule of the next recovery relies on.
		s.log.Warn("wal: torn tail cut", "segment", path, "offset", r.size, "bytes", r.torn)
		if err := f.Truncate(r.size); err != nil {
			f.Close()
			return nil, fmt.Errorf("truncate torn wal tail: %w", err)
		}
	}
	s.seg, s.off = f, r.size
	if s.alloc, err = preallocate(f, r.size); err != nil {
		f.Close()
		return nil, err
	}
	rec := &Recovered{HardState: r.hs, Entries: len(r.ents), TornBytes: r.torn, Segment: path}
	if r.meta.GetIndex() > 0 {
		snap, err := s.loadSnapshot(r.meta.GetTerm(), r.meta.GetIndex())
		if err != nil {
			return nil, err
		}
		if err := s.MemoryStorage.ApplySnapshot(snap); err != nil {
			return nil, fmt.Errorf("apply snapshot: %w", err)
		}
		rec.Snapshot = snap
	}
	if err := s.MemoryStorage.Append(r.ents); err != nil {
		return nil, fmt.Errorf("append recovered entries: %w", err)
	}
	if err := s.MemoryStorage.SetHardState(r.hs); err != nil {
		return nil, fmt.Errorf("set hard state: %w", err)
	}
	s.hs = r.hs
	rec.Fresh = r.meta.GetIndex() == 0 && len(r.ents) == 0 && raft.IsEmptyHardState(r.hs)
	// Segments older than the live one are leftovers of an interrupted compaction.
	s.removeOld(segs[:len(segs)-1], nil)
	return rec, nil
}

// Save appends entries and the HardState (nil: unchanged) to the WAL, fsyncs when sync is
// set, and then adds them to MemoryStorage. This is step 2 of the Ready contract: the
// caller sends the Ready's messages only after Save returned.
func (s *Storage) Save(hs *pb.HardState, ents []*pb.Entry, sync bool) error {
	var b []byte
	var err error
	for _, e := range ents {
		if b, err = appendRecord(b, recEntry, e); err != nil {
			return err
		}
	}
	if hs != nil && !raft.IsEmptyHardState(hs) && !sameHardState(hs, s.hs) {
		if b, err = appendRecord(b, recHardState, hs); err != nil {
			return err
		}
	}
	if len(b) > 0 {
		if s.off+int64(len(b)) > s.alloc {
			if s.alloc, err = preallocate(s.seg, s.off+int64(len(b))); err != nil {
				return err
			}
		}
		if _, err := s.seg.WriteAt(b, s.off); err != nil {
			return fmt.Errorf("write wal: %w", err)
		}
		s.off += int64(len(b))
	}
	if sync && len(b) > 0 {
		if err := s.fsync(s.seg); err != nil {
			return err
		}
	}
	if err := s.MemoryStorage.Append(ents); err != nil {
		return fmt.Errorf("append entries: %w", err)
	}
	if hs != nil && !raft.IsEmptyHardState(hs) {
		s.hs = copyHardState(hs)
		if err := s.MemoryStorage.SetHardState(hs); err != nil {
			return fmt.Errorf("set hard state: %w", err)
		}
	}
	return nil
}

// sameHardState and copyHardState are proto.Equal and proto.Clone for the three fields a
// HardState has, without their reflection (once per Ready).
func sameHardState(a, b *pb.HardState) bool {
	return a.GetTerm() == b.GetTerm() && a.GetVote() == b.GetVote() && a.GetCommit() == b.GetCommit()
}

func copyHardState(hs *pb.HardState) *pb.HardState {
	field := func(p *uint64) *uint64 { // a field's presence kept, as proto.Clone keeps it
		if p == nil {
			return nil
		}
		return new(*p)
	}
	return &pb.HardState{Term: field(hs.Term), Vote: field(hs.Vote), Commit: field(hs.Commit)}
}

func (s *Storage) fsync(f *os.File) error {
	start := time.Now()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	if s.FsyncObserver != nil {
		s.FsyncObserver(time.Since(start))
	}
	return nil
}

// ApplySnapshot persists a snapshot received from the leader (Ready.Snapshot) with the
// Ready's HardState (nil: unchanged): snapshot file, then a new segment starting after it
// with that HardState, then MemoryStorage. The Ready's entries follow with Save.
func (s *Storage) ApplySnapshot(snap *pb.Snapshot, hs *pb.HardState) error {
	if hs != nil && !raft.IsEmptyHardState(hs) {
		s.hs = proto.Clone(hs).(*pb.HardState)
	}
	if err := s.saveSnapshot(snap); err != nil {
		return err
	}
	if err := s.MemoryStorage.ApplySnapshot(snap); err != nil {
		return fmt.Errorf("apply snapshot: %w", err)
	}
	return s.cutAfter(snap.GetMetadata())
}

// CreateSnapshot takes a snapshot of the state machine (data) at applied, persists it, starts
// a new segment after it, and compacts MemoryStorage to keep entries behind it.
func (s *Storage) CreateSnapshot(applied uint64, cs *pb.ConfState, data []byte, keep uint64) (*pb.Snapshot, error) {
	snap, err := s.MemoryStorage.CreateSnapshot(applied, cs, data)
	if err != nil {
		return nil, fmt.Errorf("create snapshot: %w", err)
	}
	if err := s.saveSnapshot(snap); err != nil {
		return nil, err
	}
	if err := s.cutAfter(snap.GetMetadata()); err != nil {
		return nil, err
	}
	if applied > keep {
		if err := s.MemoryStorage.Compact(applied - keep); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return nil, fmt.Errorf("compact log: %w", err)
		}
	}
	return snap, nil
}

// cutAfter starts a new segment after the snapshot meta names, holding the entries after it
// that MemoryStorage has and the HardState, then removes older segments and snapshots.
func (s *Storage) cutAfter(meta *pb.SnapshotMetadata) error {
	old, err := listSeq(filepath.Join(s.dir, walDir), walExt)
	if err != nil {
		return err
	}
	last, _ := s.MemoryStorage.LastIndex()
	var ents []*pb.Entry
	if last > meta.GetIndex() {
		if ents, err = s.MemoryStorage.Entries(meta.GetIndex()+1, last+1, ^uint64(0)); err != nil {
			return fmt.Errorf("read entries for new segment: %w", err)
		}
	}
	if err := s.cut(meta, ents); err != nil {
		return err
	}
	s.removeOld(old, meta)
	return nil
}

// cut writes segment segSeq+1 under a temporary name (checkpoint, entries, HardState),
// fsyncs it, renames it and fsyncs the directory: a segment under its final name is whole.
func (s *Storage) cut(meta *pb.SnapshotMetadata, ents []*pb.Entry) error {
	b, err := appendRecord(nil, recCheckpoint, meta)
	if err != nil {
		return err
	}
	hs := proto.Clone(s.hs).(*pb.HardState)
	if hs.GetCommit() < meta.GetIndex() {
		hs.Commit = proto.Uint64(meta.GetIndex()) // a snapshot is committed by definition
	}
	// Entries before the HardState that may commit them, as in Save.
	for _, e := range ents {
		if b, err = appendRecord(b, recEntry, e); err != nil {
			return err
		}
	}
	if !raft.IsEmptyHardState(hs) {
		if b, err = appendRecord(b, recHardState, hs); err != nil {
			return err
		}
	}
	seq := s.segSeq + 1
	path := s.segPath(seq)
	f, err := writeDurable(path, b, SegmentPrealloc)
	if err != nil {
		return err
	}
	if s.seg != nil {
		s.seg.Close()
	}
	s.seg, s.segSeq, s.hs = f, seq, hs
	s.off, s.alloc = int64(len(b)), max(int64(len(b)), SegmentPrealloc)
	return nil
}

// writeDurable writes b to path+".tmp", fsyncs, renames to path and fsyncs the directory.
// With prealloc > 0 the file is given that size first (zeros after b) and stays open.
func writeDurable(path string, b []byte, prealloc int64) (*os.File, error) {
	tmp := path + tmpExt
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	fail := func(err error) (*os.File, error) { f.Close(); os.Remove(tmp); return nil, err }
	if _, err := f.Write(b); err != nil {
		return fail(fmt.Errorf("write %s: %w", tmp, err))
	}
	if prealloc > int64(len(b)) {
		if err := allocate(f, prealloc); err != nil {
			return fail(err)
		}
	}
	if err := unix.Fsync(int(f.Fd())); err != nil {
		return fail(fmt.Errorf("fsync %s: %w", tmp, err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("rename %s: %w", tmp, err))
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		f.Close()
		return nil, err
	}
	if prealloc == 0 {
		return nil, f.Close()
	}
	return f, nil
}

// preallocate gives the live segment f (records up to used) preallocated space after
// them: SegmentPrealloc at least, growing in whole steps of it; a file that has space past
// used already keeps its size. The new size is fsynced here, so that the writes'
// fdatasyncs do not carry it. It returns the file's size.
func preallocate(f *os.File, used int64) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat wal segment: %w", err)
	}
	if fi.Size() > used && fi.Size() >= SegmentPrealloc {
		return fi.Size(), nil
	}
	want := (used/SegmentPrealloc + 1) * SegmentPrealloc
	if err := allocate(f, want); err != nil {
		return 0, err
	}
	if err := unix.Fsync(int(f.Fd())); err != nil {
		return 0, fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	return want, nil
}

// allocate makes f size bytes long with its blocks allocated (fallocate; where the file
// system has none, a sparse extension, whose zeros read the same).
func allocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		err = f.Truncate(size)
	}
	if err != nil {
		return fmt.Errorf("preallocate %s: %w", f.Name(), err)
	}
	return nil
}

func lastNonZero(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] != 0 {
			return i
		}
	}
	return -1
}

// dataEnd is where f's last data region ends (size when the file system cannot say).
func dataEnd(f *os.File, size int64) int64 {
	end, off := int64(0), int64(0)
	for {
		d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data after off
			return end
		}
		if err != nil {
			return size
		}
		if off, err = unix.Seek(int(f.Fd()), d, unix.SEEK_HOLE); err != nil {
			return size
		}
		end = off
	}
}

// readSegment returns a segment's bytes up to its last non-zero byte and how many zero
// bytes follow to its end. The preallocated space is skipped where the file system reports
// it as a hole (SEEK_DATA/SEEK_HOLE: ext4 and xfs do for space never written), else read.
func readSegment(f *os.File) ([]byte, int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := fi.Size()
	end := dataEnd(f, size)
	// Back from end over zeros, a chunk at a time.
	buf := make([]byte, 1<<20)
	for end > 0 {
		start := max(0, end-int64(len(buf)))
		chunk := buf[:end-start]
		if _, err := f.ReadAt(chunk, start); err != nil {
			return nil, 0, err
		}
		if i := lastNonZero(chunk); i >= 0 {
			end = start + int64(i) + 1
			break
		}
		end = start
	}
	b := make([]byte, end)
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, 0, err
	}
	return b, size - end, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir: %w", err)
	}
	defer d.Close()
	if err := unix.Fsync(int(d.Fd())); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// Snapshot files: 4-byte CRC32-C of the rest, then pb.Snapshot.
func (s *Storage) saveSnapshot(snap *pb.Snapshot) error {
	data, err := proto.Marshal(snap)
	if err != nil {
		return fmt.Errorf("marshal snapshot: %w", err)
	}
	b := binary.BigEndian.AppendUint32(nil, crc32.Checksum(data, castagnoli))
	_, err = writeDurable(s.snapPath(snap.GetMetadata().GetTerm(), snap.GetMetadata().GetIndex()), append(b, data...), 0)
	return err
}

func (s *Storage) loadSnapshot(term, index uint64) (*pb.Snapshot, error) {
	path := s.snapPath(term, index)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read snapshot named by the wal: %w", err)
	}
	if len(b) < 4 || crc32.Checksum(b[4:], castagnoli) != binary.BigEndian.Uint32(b) {
		return nil, fmt.Errorf("%w: snapshot %s fails its CRC", ErrCorrupt, path)
	}
	snap := &pb.Snapshot{}
	if err := proto.Unmarshal(b[4:], snap); err != nil {
		return nil, fmt.Errorf("%w: snapshot %s: %v", ErrCorrupt, path, err)
	}
	return snap, nil
}

// removeOld removes the given segments and all but the newest snapshots (never the one meta
// names). Failures are logged: leftovers are removed at the next start.
func (s *Storage) removeOld(segs []uint64, meta *pb.SnapshotMetadata) {
	for _, seq := range segs {
		if seq != s.segSeq {
			if err := os.Remove(s.segPath(seq)); err != nil {
				s.log.Warn("wal: remove old segment", "err", err)
			}
		}
	}
	names, _ := filepath.Glob(filepath.Join(s.dir, snapDir, "*"+snapExt))
	slices.SortFunc(names, func(a, b string) int { return strings.Compare(snapKey(b), snapKey(a)) })
	for i, n := range names {
		if i >= keepSnapshots && (meta == nil || n != s.snapPath(meta.GetTerm(), meta.GetIndex())) {
			os.Remove(n)
		}
	}
}

// snapKey sorts snapshot names by index (the second number).
func snapKey(path string) string {
	base := strings.TrimSuffix(filepath.Base(path), snapExt)
	_, idx, _ := strings.Cut(base, "-")
	return idx
}

func (s *Storage) segPath(seq uint64) string {
	return filepath.Join(s.dir, walDir, fmt.Sprintf("%016d%s", seq, walExt))
}

func (s *Storage) snapPath(term, index uint64) string {
	return filepath.Join(s.dir, snapDir, fmt.Sprintf("%016d-%016d%s", term, index, snapExt))
}

func listSeq(dir, ext string) ([]uint64, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var seqs []uint64
	for _, de := range des {
		name, ok := strings.CutSuffix(de.Name(), ext)
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(name, 10, 64); err == nil {
			seqs = append(seqs, n)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

func removeTemps(dir string) {
	tmps, _ := filepath.Glob(filepath.Join(dir, "*"+tmpExt))
	for _, t := range tmps {
		os.Remove(t)
	}
}

// SegmentPath is the live segment (tests cut it).
func (s *Storage) SegmentPath() string { return s.segPath(s.segSeq) }

// Close closes the segment and releases the lock.
func (s *Storage) Close() error {
	err := s.seg.Close()
	s.lock.Close()
	return err
}

// Durable is what the newest segment of dir holds: the HardState and the last entry's
// index and term (the snapshot's when no entry follows it). It takes no lock, so it can look
// at a live node's data dir (tests check the Ready contract with it).
func Durable(dir string) (hs *pb.HardState, lastIndex, lastTerm uint64, err error) {
	segs, err := listSeq(filepath.Join(dir, walDir), walExt)
	if err != nil || len(segs) == 0 {
		return nil, 0, 0, fmt.Errorf("no wal segment in %s: %v", dir, err)
	}
	f, err := os.Open(filepath.Join(dir, walDir, fmt.Sprintf("%016d%s", segs[len(segs)-1], walExt)))
	if err != nil {
		return nil, 0, 0, err
	}
	defer f.Close()
	b, zeros, err := readSegment(f)
	if err != nil {
		return nil, 0, 0, err
	}
	r, err := replay(b, zeros)
	if err != nil {
		return nil, 0, 0, err
	}
	lastIndex, lastTerm = r.meta.GetIndex(), r.meta.GetTerm()
	if n := len(r.ents); n > 0 {
		lastIndex, lastTerm = r.ents[n-1].GetIndex(), r.ents[n-1].GetTerm()
	}
	return r.hs, lastIndex, lastTerm, nil
}
