// Package storage is kedge raft's durable log: a write-ahead log of raftpb records in
// numbered segments plus snapshot files, fsynced before anything is acknowledged.
// docs/raft.md section 4 is the design; this file is the record format and replay.
package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Record types.
const (
	recCheckpoint = 1 // pb.SnapshotMetadata: the snapshot this segment starts after
	recEntry      = 2 // pb.Entry
	recHardState  = 3 // pb.HardState
)

const (
	recHeader = 8        // 4-byte length of type+data, 4-byte CRC32-C of type+data
	recMax    = 64 << 20 // a longer length is garbage, not a record
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendRecord appends one record to b.
func appendRecord(b []byte, typ byte, m proto.Message) ([]byte, error) {
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal record: %w", err)
	}
	crc := crc32.Update(crc32.Update(0, castagnoli, []byte{typ}), castagnoli, data)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)+1))
	b = binary.BigEndian.AppendUint32(b, crc)
	b = append(b, typ)
	return append(b, data...), nil
}

// ErrCorrupt is a record that fails its checks before the end of a segment: not a torn
// write but damage, so the node refuses to start.
var ErrCorrupt = errors.New("wal corrupt")

// replayed is the state a segment holds.
type replayed struct {
	meta    *pb.SnapshotMetadata
	hs      *pb.HardState
	ents    []*pb.Entry
	size    int64   // bytes of valid records; a torn tail starts here
	torn    int64   // bytes dropped after size
	offsets []int64 // end offset of every valid record (tests cut the file there)
}

// replay reads the records of one segment: b, the file's bytes up to its last non-zero
// byte, and then zeros zero bytes to the end of the file (a preallocated segment's unused
// space; a record whose last bytes are zeros reads them from there). A record that is cut
// short or fails its checks at the tail (see tornTail) ends the replay: a torn write, whose
// bytes in b are r.torn. The same failure with no sign of a torn write is ErrCorrupt.
func replay(b []byte, zeros int64) (*replayed, error) {
	r := &replayed{hs: &pb.HardState{}}
	data, end := int64(len(b)), int64(len(b))+zeros
	off := int64(0)
	for off < int64(len(b)) {
		// Up to two rounds: the header, then the record it announces.
		for range 2 {
			if need := off + recordSpan(b[off:]); need > int64(len(b)) && need <= end {
				b = append(b, make([]byte, need-int64(len(b)))...)
			}
		}
		rest := b[off:]
		if why := badRecord(rest); why != "" {
			if tornTail(b, off, end) {
				r.size, r.torn = off, max(0, data-off)
				return r, r.check()
			}
			return nil, fmt.Errorf("%w: %s at offset %d, with no sign of a torn write", ErrCorrupt, why, off)
		}
		n := int64(binary.BigEndian.Uint32(rest))
		if err := r.apply(rest[recHeader], rest[recHeader+1:recHeader+n]); err != nil {
			return nil, fmt.Errorf("%w: record at offset %d: %v", ErrCorrupt, off, err)
		}
		off += recHeader + n
		r.offsets = append(r.offsets, off)
	}
	r.size = off
	return r, r.check()
}

// recordSpan is how many bytes the record at the start of b takes by its header (the
// header alone when b is shorter or the length is out of range).
func recordSpan(b []byte) int64 {
	if len(b) < recHeader {
		return recHeader
	}
	n := int64(binary.BigEndian.Uint32(b))
	if n < 1 || n > recMax {
		return recHeader
	}
	return recHeader + n
}

// badRecord says what is wrong with the record at the start of b, or "".
func badRecord(b []byte) string {
	if len(b) < recHeader {
		return "short record header"
	}
	n := int64(binary.BigEndian.Uint32(b))
	switch {
	case n < 1 || n > recMax:
		return fmt.Sprintf("record length %d", n)
	case int64(len(b)) < recHeader+n:
		return "record cut short"
	case crc32.Checksum(b[recHeader:recHeader+n], castagnoli) != binary.BigEndian.Uint32(b[4:]):
		return "record CRC mismatch"
	}
	return ""
}

// sector is the unit a disk writes whole: an interrupted write leaves each of its sectors
// either written or as it was.
const sector = 512

// tornTail reports whether the bad record at off in b (a file of end bytes, zeros after b)
// is what an interrupted write leaves, acknowledged by no fsync:
//   - nothing but zeros from off on: the segment's preallocated space (or a file extended
//     before its data blocks were written);
//   - the record reaches or passes the end of the file: an interrupted append;
//   - the record's part of one of the 512-byte sectors it spans (aligned in the file) is
//     all zeros: an interrupted write into preallocated space, whose sectors reach the
//     disk in any order; one not written still holds what it held before - zeros after the
//     log's end (recovery zeroes a torn tail again). This is etcd's rule for its
//     preallocated segments (wal.isTornEntry).
//
// A bad record with none of these (a flipped bit in a complete record) is damage. The
// price of the third rule: damage that zeroes a whole sector's part of a record reads as
// a torn write, and the log is cut there.
func tornTail(b []byte, off, end int64) bool {
	rest := b[off:]
	if allZero(rest) {
		return true
	}
	span := recordSpan(rest)
	if len(rest) >= recHeader {
		if n := int64(binary.BigEndian.Uint32(rest)); n >= 1 && off+recHeader+n >= end {
			return true
		}
	}
	stop := min(off+span, int64(len(b)))
	for s := off &^ (sector - 1); s < stop; s += sector {
		if allZero(b[max(s, off):min(s+sector, stop)]) {
			return true
		}
	}
	return off+span > int64(len(b)) // a sector past b: zeros
}

func allZero(b []byte) bool { return len(bytes.Trim(b, "\x00")) == 0 }

func (r *replayed) apply(typ byte, data []byte) error {
	if r.meta == nil && typ != recCheckpoint {
		return errors.New("segment does not start with a checkpoint")
	}
	switch typ {
	case recCheckpoint:
		if r.meta != nil {
			return errors.New("second checkpoint in a segment")
		}
		r.meta = &pb.SnapshotMetadata{}
		return proto.Unmarshal(data, r.meta)
	case recHardState:
		hs := &pb.HardState{}
		if err := proto.Unmarshal(data, hs); err != nil {
			return err
		}
		r.hs = hs
	case recEntry:
		e := &pb.Entry{}
		if err := proto.Unmarshal(data, e); err != nil {
			return err
		}
		first := r.meta.GetIndex() + 1
		i := e.GetIndex()
		last := first + uint64(len(r.ents)) - 1
		if i < first || i > last+1 {
			return fmt.Errorf("entry %d does not continue a log of %d..%d", i, first, last)
		}
		// An entry at index i replaces i and everything after it (raft log truncation).
		r.ents = append(r.ents[:i-first], e)
	default:
		return fmt.Errorf("unknown record type %d", typ)
	}
	return nil
}

// check verifies what a consistent log must satisfy.
func (r *replayed) check() error {
	if r.meta == nil {
		return fmt.Errorf("%w: segment without a checkpoint", ErrCorrupt)
	}
	last := r.meta.GetIndex() + uint64(len(r.ents))
	if c := r.hs.GetCommit(); c > last {
		// Entries are written before the HardState that commits them: only damage gets here.
		return fmt.Errorf("%w: commit %d beyond the last entry %d", ErrCorrupt, c, last)
	}
	return nil
}
