package storage

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/kedge-dev/kedge/internal/raft/rafttest"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func ent(term, index uint64, data string) *pb.Entry {
	return &pb.Entry{Term: proto.Uint64(term), Index: proto.Uint64(index), Data: []byte(data)}
}

func hard(term, vote, commit uint64) *pb.HardState {
	return &pb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
}

// op is one record as the test wrote it, to rebuild the expected state of any prefix.
type op struct {
	e  *pb.Entry
	hs *pb.HardState
}

type model struct {
	first uint64 // first index after the snapshot
	ents  []*pb.Entry
	hs    *pb.HardState
}

func (m *model) apply(o op) {
	if o.hs != nil {
		m.hs = o.hs
		return
	}
	i := o.e.GetIndex()
	m.ents = append(m.ents[:i-m.first], o.e)
}

// saver writes through Storage.Save and mirrors every record into ops.
type saver struct {
	t   *testing.T
	s   *Storage
	ops []op
}

func (w *saver) save(hs *pb.HardState, ents ...*pb.Entry) {
	w.t.Helper()
	if err := w.s.Save(hs, ents, true); err != nil {
		w.t.Fatalf("save: %v", err)
	}
	for _, e := range ents {
		w.ops = append(w.ops, op{e: e})
	}
	if hs != nil {
		w.ops = append(w.ops, op{hs: hs})
	}
}

// history writes a log with elections, a conflicting suffix that is overwritten, and
// commits, as a follower would see it.
func history(w *saver) {
	w.save(hard(1, 1, 0), ent(1, 1, "a"), ent(1, 2, "b"))
	w.save(hard(1, 1, 2), ent(1, 3, "c"))
	w.save(nil, ent(1, 4, "d-lost"), ent(1, 5, "e-lost"))
	w.save(hard(2, 2, 3))
	w.save(nil, ent(2, 4, "d2")) // overwrites 4 and 5
	w.save(hard(2, 2, 4), ent(2, 5, "e2"), ent(2, 6, "f2"))
	w.save(hard(3, 0, 6))
}

func open(t *testing.T, dir string) (*Storage, *Recovered) {
	t.Helper()
	s, rec, err := Open(dir, quiet)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return s, rec
}

// checkState compares the storage with the model and starts etcd-raft on it: RawNode panics
// on an inconsistent HardState (commit outside the log).
func checkState(t *testing.T, what string, s *Storage, m *model) {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != m.first || last != m.first+uint64(len(m.ents))-1 {
		t.Fatalf("%s: log %d..%d, want %d..%d", what, first, last, m.first, m.first+uint64(len(m.ents))-1)
	}
	if len(m.ents) > 0 {
		got, err := s.Entries(first, last+1, ^uint64(0))
		if err != nil {
			t.Fatalf("%s: entries: %v", what, err)
		}
		for i := range got {
			if !proto.Equal(got[i], m.ents[i]) {
				t.Fatalf("%s: entry %d = %v, want %v", what, got[i].GetIndex(), got[i], m.ents[i])
			}
		}
	}
	hs, _, _ := s.InitialState()
	want := m.hs
	if want == nil {
		want = &pb.HardState{}
	}
	if hs.GetTerm() != want.GetTerm() || hs.GetVote() != want.GetVote() || hs.GetCommit() != want.GetCommit() {
		t.Fatalf("%s: hard state %v, want %v", what, hs, want)
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("%s: etcd-raft refuses the recovered state: %v", what, r)
			}
		}()
		if raft.IsEmptyHardState(hs) && last == 0 {
			return
		}
		if _, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: s,
			MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 16, Logger: rafttest.DiscardLogger{}}); err != nil {
			t.Fatalf("%s: start raft: %v", what, err)
		}
	}()
}

// TestTruncateAtEveryBoundary simulates a crash between write and fsync: the live segment
// is cut at every record boundary and at every byte inside the last records, and the node
// must recover exactly the records before the cut, accept new writes, and recover again.
func TestTruncateAtEveryBoundary(t *testing.T) {
	for _, withSnap := range []bool{false, true} {
		t.Run(fmt.Sprintf("snapshot=%v", withSnap), func(t *testing.T) {
			dir := t.TempDir()
			s, rec := open(t, dir)
			if !rec.Fresh {
				t.Fatalf("new dir not fresh: %+v", rec)
			}
			w := &saver{t: t, s: s}
			base := &model{first: 1}
			if withSnap {
				history(w)
				snap, err := s.CreateSnapshot(4, &pb.ConfState{Voters: []uint64{1, 2, 3}}, []byte("state@4"), 0)
				if err != nil {
					t.Fatalf("snapshot: %v", err)
				}
				if snap.GetMetadata().GetIndex() != 4 {
					t.Fatalf("snapshot index %d", snap.GetMetadata().GetIndex())
				}
				// The new segment holds the checkpoint, the HardState and entries 5..6.
				base = &model{first: 5, hs: hard(3, 0, 6), ents: []*pb.Entry{ent(2, 5, "e2"), ent(2, 6, "f2")}}
				w.ops = nil
				w.save(nil, ent(3, 7, "g3"))
				w.save(hard(3, 0, 7), ent(3, 8, "h3"))
				w.save(nil, ent(3, 9, "i3"))
			} else {
				history(w)
			}
			seg, full, r := closeAndRead(t, s)
			// Records before the test's own: checkpoint (+ HardState + entries of the cut).
			pre := len(r.offsets) - len(w.ops)
			cuts := map[int]int{} // byte offset -> records kept
			for k := pre; k <= len(r.offsets); k++ {
				end := r.offsets[k-1]
				cuts[int(end)] = k
				if k < len(r.offsets) { // every byte inside the next record: a torn write
					for b := end + 1; b < r.offsets[k]; b++ {
						cuts[int(b)] = k
					}
				}
			}
			for cut, kept := range cuts {
				what := fmt.Sprintf("cut at %d (%d records)", cut, kept)
				d := t.TempDir()
				copyDir(t, dir, d)
				if err := os.WriteFile(filepath.Join(d, walDir, filepath.Base(seg)), full[:cut], 0o640); err != nil {
					t.Fatal(err)
				}
				m := &model{first: base.first, hs: base.hs, ents: append([]*pb.Entry(nil), base.ents...)}
				for _, o := range w.ops[:kept-pre] {
					m.apply(o)
				}
				s2, rec := open(t, d)
				// Torn: the bytes after the last whole record up to the last non-zero one
				// (zeros after it read as preallocated space).
				if want := max(0, int64(len(bytes.TrimRight(full[:cut], "\x00")))-r.offsets[kept-1]); rec.TornBytes != want {
					t.Errorf("%s: torn bytes %d, want %d", what, rec.TornBytes, want)
				}
				checkState(t, what, s2, m)
				writeAndReopen(t, what, d, s2, m)
			}
			if len(cuts) < 20 {
				t.Fatalf("only %d cuts tested", len(cuts))
			}
		})
	}
}

// closeAndRead closes s and returns its live segment's path, bytes and records.
func closeAndRead(t *testing.T, s *Storage) (string, []byte, *replayed) {
	t.Helper()
	seg := s.SegmentPath()
	s.Close()
	full, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := replay(full, 0)
	if err != nil {
		t.Fatalf("replay the whole segment: %v", err)
	}
	return seg, full, r
}

// writeAndReopen: the node recovered in s (data dir dir, state m) appends and recovers
// again, with nothing torn the second time.
func writeAndReopen(t *testing.T, what, dir string, s *Storage, m *model) {
	t.Helper()
	last, _ := s.LastIndex()
	next := ent(9, last+1, "after")
	if err := s.Save(hard(9, 0, m.hs.GetCommit()), []*pb.Entry{next}, true); err != nil {
		t.Fatalf("%s: save after recovery: %v", what, err)
	}
	s.Close()
	s3, rec3 := open(t, dir)
	defer s3.Close()
	m.apply(op{e: next})
	m.apply(op{hs: hard(9, 0, m.hs.GetCommit())})
	if rec3.TornBytes != 0 {
		t.Errorf("%s: second recovery cut %d bytes", what, rec3.TornBytes)
	}
	checkState(t, what+", reopened", s3, m)
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o750)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o640)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCorruptionRefused: a damaged record with valid data after it is not a torn tail.
func TestCorruptionRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	history(&saver{t: t, s: s})
	seg := s.SegmentPath()
	s.Close()
	b, _ := os.ReadFile(seg)
	r, _ := replay(b, 0)
	mid := r.offsets[len(r.offsets)/2] + recHeader + 1 // inside a record's data
	b[mid] ^= 0xff
	os.WriteFile(seg, b, 0o640)
	if _, _, err := Open(dir, quiet); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open damaged wal: err = %v, want ErrCorrupt", err)
	}
}

// TestZeroTail: zeros after the records (a file extended before its blocks were written,
// or preallocated space) are free space: nothing is torn, the next record goes right after
// the last one.
func TestZeroTail(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	w := &saver{t: t, s: s}
	history(w)
	seg := s.SegmentPath()
	s.Close()
	fi, _ := os.Stat(seg)
	if err := os.Truncate(seg, fi.Size()+3*SegmentPrealloc+100); err != nil {
		t.Fatal(err)
	}
	s2, rec := open(t, dir)
	if rec.TornBytes != 0 {
		t.Fatalf("torn %d, want 0", rec.TornBytes)
	}
	m := &model{first: 1}
	for _, o := range w.ops {
		m.apply(o)
	}
	checkState(t, "zero tail", s2, m)
	w.s = s2
	w.save(hard(3, 0, 7), ent(3, 7, "g"))
	m.apply(w.ops[len(w.ops)-2])
	m.apply(w.ops[len(w.ops)-1])
	s2.Close()
	s3, rec := open(t, dir)
	defer s3.Close()
	if rec.TornBytes != 0 {
		t.Fatalf("reopened: torn %d, want 0", rec.TornBytes)
	}
	checkState(t, "zero tail, written and reopened", s3, m)
}

// TestPreallocated: a segment is preallocated to SegmentPrealloc when it is made and when an
// older one without the space is opened, grows by whole steps when its records fill it, and
// reads back whole through every growth.
func TestPreallocated(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(s.SegmentPath())
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if got := size(); got != SegmentPrealloc {
		t.Fatalf("new segment: %d bytes, want %d", got, SegmentPrealloc)
	}
	w := &saver{t: t, s: s}
	m := &model{first: 1}
	val := bytes.Repeat([]byte("v"), 300)
	for i := uint64(1); i <= 3*uint64(SegmentPrealloc)/300; i++ {
		w.save(hard(1, 1, i-1), ent(1, i, string(val)))
	}
	for _, o := range w.ops {
		m.apply(o)
	}
	if got := size(); got%SegmentPrealloc != 0 || got <= s.off || got < 3*SegmentPrealloc {
		t.Fatalf("after %d bytes of records: segment of %d bytes, want whole steps of %d past them", s.off, got, SegmentPrealloc)
	}
	seg, used := s.SegmentPath(), s.off
	s.Close()
	// An older segment, cut to its records: opening it preallocates it again.
	if err := os.Truncate(seg, used); err != nil {
		t.Fatal(err)
	}
	s, rec := open(t, dir)
	defer s.Close()
	if rec.TornBytes != 0 {
		t.Fatalf("torn %d, want 0", rec.TornBytes)
	}
	checkState(t, "reopened", s, m)
	if got := size(); got <= used || got%SegmentPrealloc != 0 {
		t.Fatalf("reopened segment of %d bytes holding %d: not preallocated", got, used)
	}
}

// TestTornOverwrite simulates a crash during a write into preallocated space, before its
// fsync: the write's sectors reach the disk in any order, so any subset of them may be
// missing (zeros). Recovery keeps every record before the write and the write's records
// before its first missing sector, cuts the rest (TornBytes), and the node writes and
// recovers again.
func TestTornOverwrite(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	w := &saver{t: t, s: s}
	history(w)
	before := len(w.ops)
	start := s.off
	// The last write: four entries of 300 bytes and a HardState, over several sectors.
	val := func(c byte) string { return string(bytes.Repeat([]byte{c}, 300)) }
	w.save(hard(3, 0, 8), ent(3, 7, val('g')), ent(3, 8, val('h')), ent(3, 9, val('i')), ent(3, 10, val('j')))
	end := s.off
	seg, full, r := closeAndRead(t, s)
	ends := r.offsets[len(r.offsets)-(len(w.ops)-before):] // end of each record of the last write
	var sectors []int64
	for sec := start &^ (sector - 1); sec < end; sec += sector {
		sectors = append(sectors, sec)
	}
	if len(sectors) < 3 {
		t.Fatalf("the last write spans %d sectors, want at least 3", len(sectors))
	}
	// Every subset of the write's sectors missing, except none.
	for mask := 1; mask < 1<<len(sectors); mask++ {
		b := bytes.Clone(full)
		firstMissing := end
		for i, sec := range sectors {
			if mask&(1<<i) == 0 {
				continue
			}
			lo, hi := max(sec, start), min(sec+sector, end)
			clear(b[lo:hi])
			firstMissing = min(firstMissing, lo)
		}
		kept := 0 // records of the last write that end before its first missing sector
		for _, e := range ends {
			if e <= firstMissing {
				kept++
			}
		}
		what := fmt.Sprintf("sectors missing %b", mask)
		d := t.TempDir()
		copyDir(t, dir, d)
		if err := os.WriteFile(filepath.Join(d, walDir, filepath.Base(seg)), b, 0o640); err != nil {
			t.Fatal(err)
		}
		m := &model{first: 1}
		for _, o := range w.ops[:before+kept] {
			m.apply(o)
		}
		s2, rec := open(t, d)
		cutAt := start
		if kept > 0 {
			cutAt = ends[kept-1]
		}
		if want := max(0, int64(lastNonZero(b)+1)-cutAt); rec.TornBytes != want {
			t.Errorf("%s: torn bytes %d, want %d", what, rec.TornBytes, want)
		}
		checkState(t, what, s2, m)
		writeAndReopen(t, what, d, s2, m)
	}
}

func TestMain(m *testing.M) {
	SegmentPrealloc = 4096 // small: the tests copy data dirs, and fill segments past it
	os.Exit(m.Run())
}

// TestSnapshotRecovery: snapshots survive restart, a crash between the snapshot file and the
// segment cut recovers the previous state, received snapshots replace the log.
func TestSnapshotRecovery(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	w := &saver{t: t, s: s}
	history(w)
	// Crash after the snapshot file, before the cut: the file is ignored.
	snap, _ := s.MemoryStorage.CreateSnapshot(3, &pb.ConfState{Voters: []uint64{1}}, []byte("x"))
	if err := s.saveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, rec := open(t, dir)
	if rec.Snapshot != nil {
		t.Fatalf("snapshot not named by the wal was loaded")
	}
	m := &model{first: 1}
	for _, o := range w.ops {
		m.apply(o)
	}
	checkState(t, "after interrupted snapshot", s, m)

	// A snapshot from the leader at index 100 replaces everything.
	in := &pb.Snapshot{Data: []byte("leader-state"), Metadata: &pb.SnapshotMetadata{
		Index: proto.Uint64(100), Term: proto.Uint64(5), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := s.ApplySnapshot(in, hard(5, 0, 100)); err != nil {
		t.Fatalf("apply snapshot: %v", err)
	}
	if err := s.Save(hard(5, 0, 101), []*pb.Entry{ent(5, 101, "z")}, true); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, rec = open(t, dir)
	defer s.Close()
	if rec.Snapshot == nil || !bytes.Equal(rec.Snapshot.GetData(), []byte("leader-state")) {
		t.Fatalf("snapshot not recovered: %+v", rec.Snapshot)
	}
	checkState(t, "after received snapshot", s, &model{first: 101, hs: hard(5, 0, 101), ents: []*pb.Entry{ent(5, 101, "z")}})
	segs, _ := listSeq(filepath.Join(dir, walDir), walExt)
	if len(segs) != 1 {
		t.Errorf("%d segments left, want 1", len(segs))
	}
}

// TestLocked: a second Open of the same dir fails.
func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	defer s.Close()
	if _, _, err := Open(dir, quiet); err == nil {
		t.Fatal("second open of a locked data dir succeeded")
	}
}

// FuzzReplay: replay never panics on arbitrary segment bytes, and what it accepts is a
// consistent log (check passed) whose valid records end at r.size.
func FuzzReplay(f *testing.F) {
	var seed []byte
	seed, _ = appendRecord(seed, recCheckpoint, &pb.SnapshotMetadata{Index: proto.Uint64(0)})
	seed, _ = appendRecord(seed, recEntry, ent(1, 1, "a"))
	seed, _ = appendRecord(seed, recHardState, hard(1, 1, 1))
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := replay(b, 0)
		if err != nil {
			return
		}
		if r.size+r.torn != int64(len(b)) {
			t.Fatalf("size %d + torn %d != %d", r.size, r.torn, len(b))
		}
		last := r.meta.GetIndex() + uint64(len(r.ents))
		for i, e := range r.ents {
			if e.GetIndex() != r.meta.GetIndex()+uint64(i)+1 {
				t.Fatalf("entry %d at position %d after snapshot %d", e.GetIndex(), i, r.meta.GetIndex())
			}
		}
		if r.hs.GetCommit() > last {
			t.Fatalf("commit %d beyond %d accepted", r.hs.GetCommit(), last)
		}
	})
}
