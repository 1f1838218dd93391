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
	"time"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// StatusDir is where each running `kedge hedge run` publishes its status file (runstate's
// directory): hedge.<owner ID>.json, rewritten every second and removed on exit. `kedge
// hedge status` and `kedge hedge stats` read them; one whose owner has ended is a killed
// run's and is removed by whoever finds it (those commands, the next `kedge hedge run`,
// `kedge cleanup`). Files named hedge.<pid>.json (kedge before owner records) are judged by
// their pid.
const StatusDir = "/run/kedge"

// capability keys hedge's status files in runstate.
const capability = "hedge"

// Status is the content of a status file.
type Status struct {
	PID        int       `json:"pid"`
	Owner      string    `json:"owner,omitempty"` // runstate owner ID (in the file name too)
	Started    time.Time `json:"started"`
	ConfigPath string    `json:"config_path,omitempty"` // empty when configured by flags
	Interface  string    `json:"interface"`
	// Netns names the client namespace: the --netns argument, the /run/netns name the
	// process runs in, or its net:[inode].
	Netns          string    `json:"netns"`
	DelayLineNetns string    `json:"delay_line_netns"`
	Snapshot       *Snapshot `json:"snapshot"`
}

// statusID is the owner ID a status of pid is filed under: this process's runstate owner,
// or (another process's, or without a writable run directory) the bare pid.
func statusID(pid int) string {
	if pid == os.Getpid() {
		return runstate.SelfID()
	}
	return strconv.Itoa(pid)
}

// StatusPath is the status file of the hedger with pid in dir: this process's under its
// owner ID, another's under the owner ID found in dir that starts with its pid, else the
// pid-named file.
func StatusPath(dir string, pid int) string {
	if pid != os.Getpid() {
		if m, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("%s.%d_*.json", capability, pid))); len(m) == 1 {
			return m[0]
		}
	}
	return runstate.StatusPath(dir, capability, statusID(pid))
}

// WriteStatus replaces st's status file in dir atomically (temporary file, then rename), so
// readers never see a half-written file. st.Owner is set to the ID it is filed under.
func WriteStatus(dir string, st *Status) error {
	id := statusID(st.PID)
	if _, legacy, _ := runstate.ParseID(id); !legacy {
		st.Owner = id
	}
	return runstate.WriteStatus(dir, capability, id, st)
}

// RemoveStaleStatuses removes from dir the status files of hedgers whose owner has ended
// (killed hedgers) and their temporary files, and returns the paths it removed. A missing
// dir holds nothing to remove. ReadStatuses calls it (`kedge cleanup` removes them through
// runstate's status-file cleaner).
func RemoveStaleStatuses(dir string) ([]string, error) {
	files, err := runstate.Statuses(dir, capability)
	var removed []string
	errs := []error{err}
	for _, f := range files {
		if runstate.Judge(f.Owner).State != runstate.Dead {
			continue
		}
		switch err := os.Remove(f.Path); {
		case err == nil:
			removed = append(removed, f.Path)
		case !errors.Is(err, os.ErrNotExist): // else removed concurrently
			errs = append(errs, fmt.Errorf("remove stale status file: %w", err))
		}
	}
	return removed, errors.Join(errs...)
}

// ReadStatuses returns the status of every running hedger in dir, by pid. Files of hedgers
// whose owner has ended (killed hedgers) and their temporary files are removed.
func ReadStatuses(dir string) ([]Status, error) {
	_, rerr := RemoveStaleStatuses(dir)
	files, err := runstate.Statuses(dir, capability)
	if err != nil {
		return nil, err
	}
	var out []Status
	errs := []error{rerr}
	for _, f := range files {
		if f.Temp || runstate.Judge(f.Owner).State != runstate.Alive {
			continue // a writer's temporary file, or one a killed hedger left that could not be removed
		}
		b, err := os.ReadFile(f.Path)
		if errors.Is(err, os.ErrNotExist) {
			continue // the hedger exited meanwhile
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read status file: %w", err))
			continue
		}
		var st Status
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, fmt.Errorf("parse status file %s: %w", f.Path, err))
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
