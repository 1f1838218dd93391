package hedge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
)

// StatusDir is where each running `kedge hedge run` publishes its status file,
// hedge.<pid>.json, rewritten every second and removed on exit. `kedge hedge status` and
// `kedge hedge stats` read them; a file whose pid no longer runs is a killed run's and is
// removed by whoever finds it (those commands, the next `kedge hedge run`, `kedge cleanup`).
const StatusDir = "/run/kedge"

// Status is the content of a status file.
type Status struct {
	PID        int       `json:"pid"`
	Started    time.Time `json:"started"`
	ConfigPath string    `json:"config_path,omitempty"` // empty when configured by flags
	Interface  string    `json:"interface"`
	// Netns names the client namespace: the --netns argument, the /run/netns name the
	// process runs in, or its net:[inode].
	Netns          string    `json:"netns"`
	DelayLineNetns string    `json:"delay_line_netns"`
	Snapshot       *Snapshot `json:"snapshot"`
}

// StatusPath is the status file of pid in dir.
func StatusPath(dir string, pid int) string {
	return filepath.Join(dir, fmt.Sprintf("hedge.%d.json", pid))
}

// statusPID parses the pid from a status file name; ok is false for other files.
func statusPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "hedge.")
	if !ok {
		return 0, false
	}
	rest, ok = strings.CutSuffix(rest, ".json")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(rest)
	return pid, err == nil && pid > 0
}

// tmpPID parses the pid from a temporary status file name (.hedge.<pid>.<random>.tmp).
func tmpPID(name string) (int, bool) {
	parts := strings.Split(name, ".")
	if len(parts) != 5 || parts[0] != "" || parts[1] != "hedge" || parts[4] != "tmp" {
		return 0, false
	}
	pid, err := strconv.Atoi(parts[2])
	return pid, err == nil && pid > 0
}

// WriteStatus replaces st's status file in dir atomically (temporary file, then rename), so
// readers never see a half-written file.
func WriteStatus(dir string, st *Status) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create status directory: %w", err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf(".hedge.%d.*.tmp", st.PID))
	if err != nil {
		return fmt.Errorf("create status file: %w", err)
	}
	_, werr := f.Write(append(b, '\n'))
	cerr := f.Close()
	if err := errors.Join(werr, cerr, os.Chmod(f.Name(), 0o644)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write status file: %w", err)
	}
	if err := os.Rename(f.Name(), StatusPath(dir, st.PID)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("publish status file: %w", err)
	}
	return nil
}

// listStatusDir lists dir; a missing dir is empty (no hedger has run yet).
func listStatusDir(dir string) ([]os.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list status files: %w", err)
	}
	return entries, nil
}

// RemoveStaleStatuses removes from dir the status files of pids that no longer run (killed
// hedgers) and their temporary files, and returns the paths it removed. A missing dir holds
// nothing to remove. `kedge cleanup` calls it; so does every ReadStatuses.
func RemoveStaleStatuses(dir string) ([]string, error) {
	entries, err := listStatusDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		pid, ok := statusPID(e.Name())
		if !ok {
			// A temporary file of a writer killed between create and rename.
			pid, ok = tmpPID(e.Name())
		}
		if !ok || lab.ProcessAlive(pid) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		switch err := os.Remove(path); {
		case err == nil:
			removed = append(removed, path)
		case !errors.Is(err, os.ErrNotExist): // else removed concurrently
			errs = append(errs, fmt.Errorf("remove stale status file: %w", err))
		}
	}
	return removed, errors.Join(errs...)
}

// ReadStatuses returns the status of every running hedger in dir, by pid. Files of pids
// that no longer run (killed hedgers) and their temporary files are removed.
func ReadStatuses(dir string) ([]Status, error) {
	_, rerr := RemoveStaleStatuses(dir)
	entries, err := listStatusDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Status
	errs := []error{rerr}
	for _, e := range entries {
		pid, ok := statusPID(e.Name())
		if !ok || !lab.ProcessAlive(pid) {
			continue // not a status file, or one a killed hedger left that could not be removed
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // the hedger exited meanwhile
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read status file: %w", err))
			continue
		}
		var st Status
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, fmt.Errorf("parse status file %s: %w", path, err))
			continue
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int { return a.PID - b.PID })
	return out, errors.Join(errs...)
}

// DelayLineNetns is the name of the kedge-owned namespace holding the delay line.
func (h *Hedger) DelayLineNetns() string {
	if h.pacer == nil {
		return ""
	}
	return h.pacer.Namespace()
}

// PublishStatus writes base, with a fresh Snapshot, to base.PID's status file in dir now and
// then every interval until ctx ends; then it removes the file. Write errors are logged,
// not fatal: the hedger keeps hedging without its status file.
func (h *Hedger) PublishStatus(ctx context.Context, dir string, base Status, interval time.Duration) {
	h.publishStatus(ctx, dir, base, interval, h.Stats)
}

func (h *Hedger) publishStatus(ctx context.Context, dir string, base Status, interval time.Duration, stats func() (*Snapshot, error)) {
	path := StatusPath(dir, base.PID)
	defer func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			h.log.Warn("remove status file", "path", path, "err", err)
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		st := base
		snap, err := stats()
		if err == nil {
			st.Snapshot = snap
			err = WriteStatus(dir, &st)
		}
		switch {
		case err != nil && !failing:
			h.log.Warn("status file not updated", "path", path, "err", err)
			failing = true
		case err == nil && failing:
			h.log.Info("status file updated again", "path", path)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
