package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"time"

	"github.com/kedge-dev/kedge/internal/runstate"
)

// statusCapability names the agent's status file in runstate's directory:
// agent.<owner ID>.json, rewritten every few seconds and removed at exit (a killed agent's
// is removed by whoever finds it, as every run's).
const statusCapability = "agent"

// Status is the agent's status file: where it serves and what it runs. Other kedge commands
// (kedge hedge status) read it to point at the agent.
type Status struct {
	PID     int          `json:"pid"`
	Owner   string       `json:"owner"`
	Started time.Time    `json:"started"`
	Config  string       `json:"config"`
	Listen  string       `json:"listen"`
	Units   []UnitStatus `json:"units"`
}

// publishStatus writes the status file now and every interval until ctx ends, then
// removes it. Write errors are logged once, not fatal.
func (a *Agent) publishStatus(ctx context.Context, dir string, base Status, listen func() string, interval time.Duration) {
	id := runstate.SelfID()
	defer func() { _ = runstate.RemoveStatus(dir, statusCapability, id) }()
	failing := false
	for {
		st := base
		st.Owner, st.Listen, st.Units = id, listen(), a.Units()
		if err := runstate.WriteStatus(dir, statusCapability, id, st); err != nil && !failing {
			a.log.Warn("agent status file not written", "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// ReadStatuses returns the status of every running agent in dir ("" = runstate.Dir).
func ReadStatuses(dir string) ([]Status, error) {
	files, err := runstate.Statuses(dir, statusCapability)
	var out []Status
	errs := []error{err}
	for _, f := range files {
		if f.Temp || runstate.Judge(f.Owner).State != runstate.Alive {
			continue
		}
		b, err := os.ReadFile(f.Path)
		if err != nil {
			continue // gone meanwhile
		}
		var st Status
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int { return a.PID - b.PID })
	return out, errors.Join(errs...)
}
