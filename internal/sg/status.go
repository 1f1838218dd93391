package sg

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// Capability names sg's status files (runstate: <dir>/sg.<owner>.json).
const Capability = "sg"

// Status is a coordinator's status file. Stats is pkg/sg's Stats as JSON.
type Status struct {
	Owner     string          `json:"owner"`
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

// RemoveDeadStatuses removes the status files of coordinators whose owner is dead (what
// `kedge cleanup` also does for every capability).
func RemoveDeadStatuses(dir string) {
	files, err := runstate.Statuses(dir, Capability)
	if err != nil {
		return
	}
	for _, f := range files {
		if runstate.Judge(f.Owner).State == runstate.Dead {
			_ = os.Remove(f.Path)
		}
	}
}

// ReadStatuses returns the status of every running coordinator in dir ("" = runstate.Dir).
func ReadStatuses(dir string) ([]Status, error) {
	files, err := runstate.Statuses(dir, Capability)
	if err != nil {
		return nil, err
	}
	var out []Status
	var errs []error
	for _, f := range files {
		if f.Temp || runstate.Judge(f.Owner).State != runstate.Alive {
			continue
		}
		b, err := os.ReadFile(f.Path)
		if err != nil {
			continue // exited meanwhile
		}
		var st Status
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", f.Path, err))
			continue
		}
		out = append(out, st)
	}
	return out, errors.Join(errs...)
}
