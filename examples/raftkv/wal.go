package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// wal is the node's write-ahead log: one file of records (4-byte length, 1-byte kind,
// protobuf), HardStates and entries in the order etcd-raft handed them out, replayed into a
// MemoryStorage at start. MemoryStorage.Append truncates a conflicting suffix, so the replay
// ends where the node's log ended. A record cut short by a crash is dropped at the next start.
type wal struct {
	f  *os.File
	w  *bufio.Writer
	st *raft.MemoryStorage
}

const (
	recHardState = 1
	recEntry     = 2
)

// openWAL opens dir/wal, replays it into st and reports whether it was empty (a new node).
func openWAL(dir string, st *raft.MemoryStorage) (*wal, bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "wal"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, err
	}
	good, n, err := replay(f, st)
	if err == nil {
		err = f.Truncate(good) // a torn last record
	}
	if err == nil {
		_, err = f.Seek(good, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("replay %s: %w", f.Name(), err)
	}
	return &wal{f: f, w: bufio.NewWriterSize(f, 1<<16), st: st}, n == 0, nil
}

// replay reads the records into st; good is the offset after the last whole record.
func replay(f *os.File, st *raft.MemoryStorage) (good int64, n int, err error) {
	r := bufio.NewReader(f)
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return good, n, nil // end, or a torn header
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:4]))
		if _, err := io.ReadFull(r, body); err != nil {
			return good, n, nil // torn body
		}
		switch hdr[4] {
		case recHardState:
			var hs pb.HardState
			if err := proto.Unmarshal(body, &hs); err != nil {
				return good, n, err
			}
			st.SetHardState(&hs)
		case recEntry:
			var e pb.Entry
			if err := proto.Unmarshal(body, &e); err != nil {
				return good, n, err
			}
			if err := st.Append([]*pb.Entry{&e}); err != nil {
				return good, n, err
			}
		default:
			return good, n, errors.New("unknown record kind")
		}
		good += int64(len(hdr) + len(body))
		n++
	}
}

// Save appends a Ready's entries and HardState, fsyncs when sync, then gives them to the
// MemoryStorage etcd-raft reads: durable before AfterSave (contract rule 4).
func (l *wal) Save(hs *pb.HardState, ents []*pb.Entry, sync bool) error {
	for _, e := range ents {
		if err := l.record(recEntry, e); err != nil {
			return err
		}
	}
	if hs != nil && !raft.IsEmptyHardState(hs) {
		if err := l.record(recHardState, hs); err != nil {
			return err
		}
	}
	if err := l.w.Flush(); err != nil {
		return fmt.Errorf("write wal: %w", err)
	}
	if sync {
		if err := l.f.Sync(); err != nil {
			return fmt.Errorf("fsync wal: %w", err)
		}
	}
	if err := l.st.Append(ents); err != nil {
		return err
	}
	if hs != nil && !raft.IsEmptyHardState(hs) {
		return l.st.SetHardState(hs)
	}
	return nil
}

func (l *wal) record(kind byte, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(len(b)))
	hdr[4] = kind
	l.w.Write(hdr[:])
	_, err = l.w.Write(b)
	return err
}

func (l *wal) Close() error { return l.f.Close() }
