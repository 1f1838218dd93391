package sg

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// StatusDir is where coordinators started by kedge publish sg.<pid>.json (rewritten every
// second, removed on exit; a killed run's file is removed by the next coordinator or
// `kedge sg stats`). The same directory as the hedger's status files.
const StatusDir = "/run/kedge"

// Status is a status file's content. Stats is pkg/sg's Stats as JSON.
type Status struct {
	PID       int             `json:"pid"`
	Started   time.Time       `json:"started"`
	Interface string          `json:"interface"`
	Netns     string          `json:"netns,omitempty"`
	Local     string          `json:"local"`
	Workers   int             `json:"workers"`
	Reduction string          `json:"reduction"`
	Tier      string          `json:"tier"`
	InFlight  int             `json:"in_flight"`
	Stats     json.RawMessage `json:"stats"`
}

func statusPath(dir string, pid int) string {
	return filepath.Join(dir, fmt.Sprintf("sg.%d.json", pid))
}

// WriteStatus replaces st's file atomically (temporary file, rename).
func WriteStatus(dir string, st *Status) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create status directory: %w", err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode sg status: %w", err)
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf(".sg.%d.*.tmp", st.PID))
	if err != nil {
		return fmt.Errorf("create sg status file: %w", err)
	}
	_, werr := f.Write(append(b, '\n'))
	if err := errors.Join(werr, f.Close(), os.Chmod(f.Name(), 0o644)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write sg status file: %w", err)
	}
	if err := os.Rename(f.Name(), statusPath(dir, st.PID)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("publish sg status file: %w", err)
	}
	return nil
}

// RemoveStatus removes pid's file.
func RemoveStatus(dir string, pid int) error {
	if err := os.Remove(statusPath(dir, pid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove sg status file: %w", err)
	}
	return nil
}

// filePID parses sg.<pid>.json and .sg.<pid>.<random>.tmp.
func filePID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(strings.TrimPrefix(name, "."), "sg.")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.SplitN(rest, ".", 2)[0])
	return pid, err == nil && pid > 0
}

// RemoveStaleStatuses removes the files of pids that no longer run and returns their paths.
func RemoveStaleStatuses(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list sg status files: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		pid, ok := filePID(e.Name())
		if !ok || lab.ProcessAlive(pid) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err == nil {
			removed = append(removed, p)
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// ReadStatuses returns the status of every running coordinator in dir (stale files removed).
func ReadStatuses(dir string) ([]Status, error) {
	_, rerr := RemoveStaleStatuses(dir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, rerr
	}
	if err != nil {
		return nil, fmt.Errorf("list sg status files: %w", err)
	}
	var out []Status
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "sg.") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // exited meanwhile
		}
		var st Status
		if err := json.Unmarshal(b, &st); err != nil {
			rerr = errors.Join(rerr, fmt.Errorf("read %s: %w", e.Name(), err))
			continue
		}
		out = append(out, st)
	}
	return out, rerr
}
