// Package runstate is kedge's shared run state: who owns what a run creates, the status
// files runs publish, and the registry of cleaners that find what ended runs left behind.
//
// Every kedge process that creates something outside itself (a network namespace, a tc
// filter, a pin directory, a status file) does so for an Owner and puts the owner's ID in
// the thing's name. The owner holds an exclusive flock on its record, Dir/owners/<ID>.lock,
// for as long as it runs; the kernel drops the lock when the process ends, however it ends.
// So "is the owner still running" has a proof that holds across PID namespaces (a pid seen
// from a container means nothing on the host, and a pid gets reused): the lock is held (the
// run is alive) or it can be taken (the run has ended). The record also holds the pid and
// the process start time, shown to users and used only where flock is unavailable.
//
// An owner ID is <pid>.<6 hex digits>, e.g. 4242_9f3a1c: the pid for the humans reading
// `ip netns`, the random part so that two runs with the same pid in different PID
// namespaces never share an ID. Names made before runstate carry the bare pid ("legacy"
// IDs); for them only the old rule is left: alive while kill(pid, 0) finds a process.
package runstate

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dir holds kedge's run state: owner records under owners/, status files
// <capability>.<owner ID>.json. A variable only so tests can point it elsewhere.
var Dir = "/run/kedge"

func ownersDir() string { return filepath.Join(Dir, "owners") }

// recordPath is the owner record (and lock file) of id.
func recordPath(id string) string { return filepath.Join(ownersDir(), id+".lock") }

// Record is what an owner's lock file holds.
type Record struct {
	ID  string `json:"id"`
	PID int    `json:"pid"`
	// StartTicks is the process start time (clock ticks after boot, /proc/<pid>/stat field
	// 22): with PID it names one process of one boot, as long as the PID namespace is ours.
	StartTicks uint64    `json:"start_ticks"`
	PIDNS      string    `json:"pid_ns"` // "pid:[inode]" of the owner's PID namespace
	Started    time.Time `json:"started"`
	Command    string    `json:"command"`
}

// Owner is one run's identity. Its lock is held until Close (or until the process ends).
type Owner struct {
	Record
	f *os.File
}

// ID returns the owner ID that goes into names.
func (o *Owner) String() string { return o.ID }

var idRE = regexp.MustCompile(`^([1-9][0-9]{0,9})(_[0-9a-f]{6})?$`)

// ParseID checks an owner ID and returns its pid; legacy is true for a bare pid (a name
// made before runstate).
func ParseID(id string) (pid int, legacy bool, ok bool) {
	m := idRE.FindStringSubmatch(id)
	if m == nil {
		return 0, false, false
	}
	pid, err := strconv.Atoi(m[1])
	if err != nil {
		return 0, false, false
	}
	return pid, m[2] == "", true
}

var (
	selfMu sync.Mutex
	self   *Owner
)

// Self returns this process's owner, creating its record on first use. It lives as long as
// the process: the kernel releases the lock at exit and `kedge cleanup` removes the record.
func Self() (*Owner, error) {
	selfMu.Lock()
	defer selfMu.Unlock()
	if self != nil {
		return self, nil
	}
	o, err := NewOwner()
	if err != nil {
		return nil, err
	}
	self = o
	return o, nil
}

// SelfID returns Self's ID, or the legacy ID (the bare pid) when no owner record can be made
// (no writable Dir: not root). Names made with a legacy ID are judged by the old pid rule.
func SelfID() string {
	if o, err := Self(); err == nil {
		return o.ID
	}
	return strconv.Itoa(os.Getpid())
}

// NewOwner creates a new owner with its own record and lock. Most callers want Self; a
// second owner in one process is for a part that must be judged on its own (tests).
func NewOwner() (*Owner, error) {
	if err := os.MkdirAll(ownersDir(), 0o755); err != nil {
		return nil, fmt.Errorf("create owner directory: %w", err)
	}
	rec := Record{PID: os.Getpid(), Started: time.Now().UTC(), Command: strings.Join(os.Args, " ")}
	rec.StartTicks, _ = startTicks(0)
	rec.PIDNS, _ = os.Readlink("/proc/self/ns/pid")
	// The record is written and locked under a temporary name and then linked to its
	// final one, so no cleaner ever sees an unlocked record of a live run, and link's
	// EEXIST makes the ID unique among everyone sharing Dir.
	tmp, err := os.CreateTemp(ownersDir(), ".new-*")
	if err != nil {
		return nil, fmt.Errorf("create owner record: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := unix.Flock(int(tmp.Fd()), unix.LOCK_EX); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("lock owner record: %w", err)
	}
	for range 16 {
		var r [3]byte
		if _, err := rand.Read(r[:]); err != nil {
			tmp.Close()
			return nil, fmt.Errorf("owner id: %w", err)
		}
		rec.ID = fmt.Sprintf("%d_%s", rec.PID, hex.EncodeToString(r[:]))
		b, _ := json.Marshal(rec)
		if err := errors.Join(tmp.Truncate(0), writeAt0(tmp, append(b, '\n'))); err != nil {
			tmp.Close()
			return nil, fmt.Errorf("write owner record: %w", err)
		}
		err := os.Link(tmp.Name(), recordPath(rec.ID))
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			tmp.Close()
			return nil, fmt.Errorf("publish owner record: %w", err)
		}
		return &Owner{Record: rec, f: tmp}, nil
	}
	tmp.Close()
	return nil, errors.New("publish owner record: no free owner id after 16 tries")
}

func writeAt0(f *os.File, b []byte) error {
	_, err := f.WriteAt(b, 0)
	return err
}

// Close removes the owner's record and releases its lock: whatever still carries its ID is
// from then on judged dead. Closing Self is for tests only.
func (o *Owner) Close() error {
	if o == nil || o.f == nil {
		return nil
	}
	err := os.Remove(recordPath(o.ID))
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	err = errors.Join(err, o.f.Close())
	o.f = nil
	selfMu.Lock()
	if self == o {
		self = nil
	}
	selfMu.Unlock()
	return err
}

// CloseSelf closes this process's owner, if Self made one: for a run that ends cleanly,
// having removed everything it made, so that no record stays behind for `kedge cleanup` to
// report. A run that ends with an error keeps its record until the process exits: whatever
// its cleanup could not remove is then judged by the free lock, as after a kill.
func CloseSelf() error {
	selfMu.Lock()
	o := self
	selfMu.Unlock()
	return o.Close()
}

// startTicks reads field 22 (starttime) of /proc/<pid>/stat (pid 0: this process; in a
// PID namespace of its own /proc may be its parent's, so not by pid).
func startTicks(pid int) (uint64, error) {
	p := "/proc/self/stat"
	if pid != 0 {
		p = fmt.Sprintf("/proc/%d/stat", pid)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	// The command (field 2) is in parentheses and may hold spaces: count from the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("short stat")
	}
	return strconv.ParseUint(f[19], 10, 64) // fields 3.. start at index 0: 22 -> 19
}

// State is a verdict on an owner.
type State int

const (
	// Alive: the owner runs; nothing of it may be removed.
	Alive State = iota
	// Dead: the owner has certainly ended; its leftovers may be removed.
	Dead
	// Unknown: neither can be proven (no record here); its leftovers are kept and reported.
	Unknown
)

func (s State) String() string {
	return [...]string{"alive", "dead", "unknown"}[s]
}

// Verdict is a State with the reason, in words for the user.
type Verdict struct {
	State  State
	Reason string
}

// Judge decides whether the owner id is alive, dead or unknown.
func Judge(id string) Verdict {
	pid, legacy, ok := ParseID(id)
	switch {
	case !ok:
		return Verdict{Unknown, fmt.Sprintf("%q is not an owner id", id)}
	case legacy:
		return judgePID(pid)
	}
	selfMu.Lock()
	mine := self != nil && self.ID == id
	selfMu.Unlock()
	if mine {
		return Verdict{Alive, "owned by this process"}
	}
	f, err := os.Open(recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return Verdict{Unknown, fmt.Sprintf("no owner record %s (a run with another %s, or its record was deleted): kept - remove it by hand if you know its run has ended", recordPath(id), Dir)}
	}
	if err != nil {
		return Verdict{Unknown, fmt.Sprintf("open owner record: %v", err)}
	}
	defer f.Close()
	rec := readRecord(f)
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		return Verdict{Alive, fmt.Sprintf("its run holds the lock on %s (pid %d in %s)", recordPath(id), rec.PID, orUnknown(rec.PIDNS))}
	case err == nil:
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return Verdict{Dead, fmt.Sprintf("the lock on %s is free: its run (pid %d, started %s) has ended", recordPath(id), rec.PID, rec.Started.Format(time.RFC3339))}
	}
	// No flock here (an unusual file system): pid and start time decide, within our PID namespace.
	return judgeStart(rec, err)
}

func orUnknown(s string) string {
	if s == "" {
		return "an unknown PID namespace"
	}
	return s
}

func readRecord(f *os.File) Record {
	var rec Record
	b := make([]byte, 4096)
	n, _ := f.ReadAt(b, 0)
	_ = json.Unmarshal(b[:n], &rec)
	return rec
}

func judgeStart(rec Record, flockErr error) Verdict {
	own, _ := os.Readlink("/proc/self/ns/pid")
	if rec.PIDNS == "" || rec.PIDNS != own || rec.PID <= 0 {
		return Verdict{Unknown, fmt.Sprintf("cannot lock the owner record (%v) and its run is in another PID namespace (%s)", flockErr, orUnknown(rec.PIDNS))}
	}
	st, err := startTicks(rec.PID)
	if err == nil && st == rec.StartTicks {
		return Verdict{Alive, fmt.Sprintf("pid %d runs with the recorded start time (the record cannot be locked: %v)", rec.PID, flockErr)}
	}
	return Verdict{Dead, fmt.Sprintf("pid %d no longer runs with the recorded start time (the record cannot be locked: %v)", rec.PID, flockErr)}
}

// judgePID is the rule for legacy names: alive while a process of that pid exists here.
func judgePID(pid int) Verdict {
	if pid == os.Getpid() {
		return Verdict{Alive, "owned by this process"}
	}
	if ProcessAlive(pid) {
		return Verdict{Alive, fmt.Sprintf("legacy name: pid %d runs in this PID namespace", pid)}
	}
	return Verdict{Dead, fmt.Sprintf("legacy name: no pid %d in this PID namespace (old pid rule)", pid)}
}

// ProcessAlive reports whether pid names a process in this PID namespace (kill(pid, 0)).
func ProcessAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Records lists the owner records in Dir (IDs, sorted by name).
func Records() ([]string, error) {
	entries, err := readDir(ownersDir(), "owner records")
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".lock")
		if _, legacy, valid := ParseID(id); ok && valid && !legacy {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// readDir lists dir; a missing dir is empty.
func readDir(dir, what string) ([]os.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	return entries, nil
}

// ReadRecord returns the record of owner id.
func ReadRecord(id string) (Record, error) {
	f, err := os.Open(recordPath(id))
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	return readRecord(f), nil
}

// RemoveRecord removes the record of a dead owner, under its lock so that a concurrent
// Judge never sees it half-gone. It refuses (returns false) when the owner is alive.
func RemoveRecord(id string) (bool, error) {
	f, err := os.Open(recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open owner record: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, nil // held: alive (or a concurrent cleaner has it)
	}
	if err := os.Remove(recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("remove owner record: %w", err)
	}
	return true, nil
}

// StaleTemps lists temporary owner records (.new-*) older than a minute: made by runs killed
// between creating and publishing their record.
func StaleTemps() []string {
	entries, _ := os.ReadDir(ownersDir())
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".new-") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
			out = append(out, filepath.Join(ownersDir(), e.Name()))
		}
	}
	return out
}
