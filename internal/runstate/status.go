package runstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Status files: each run of a capability publishes <Dir>/<capability>.<owner ID>.json
// (e.g. hedge.4242_9f3a1c.json), replaced atomically. Readers list them with Statuses; the
// built-in "status file" cleaner removes those of dead owners, for every capability, so a
// capability that publishes through here registers no cleaner for them.

var capabilityRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// StatusPath is the status file of the capability's run by owner id, in dir ("" = Dir).
func StatusPath(dir, capability, id string) string {
	if dir == "" {
		dir = Dir
	}
	return filepath.Join(dir, capability+"."+id+".json")
}

// WriteStatus replaces the status file of capability's run by owner id in dir ("" = Dir)
// with v as JSON (temporary file, then rename: readers never see half a file).
func WriteStatus(dir, capability, id string, v any) error {
	if !capabilityRE.MatchString(capability) {
		return fmt.Errorf("write status: capability name %q is not valid", capability)
	}
	if _, _, ok := ParseID(id); !ok {
		return fmt.Errorf("write status: %q is not an owner id", id)
	}
	if dir == "" {
		dir = Dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create status directory: %w", err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf(".%s.%s.*.tmp", capability, id))
	if err != nil {
		return fmt.Errorf("create status file: %w", err)
	}
	_, werr := f.Write(append(b, '\n'))
	if err := errors.Join(werr, f.Close(), os.Chmod(f.Name(), 0o644)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write status file: %w", err)
	}
	if err := os.Rename(f.Name(), StatusPath(dir, capability, id)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("publish status file: %w", err)
	}
	return nil
}

// RemoveStatus removes the status file of capability's run by owner id (a run's last act).
func RemoveStatus(dir, capability, id string) error {
	err := os.Remove(StatusPath(dir, capability, id))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove status file: %w", err)
	}
	return nil
}

// StatusFile is one status file found in a directory.
type StatusFile struct {
	Capability string
	Owner      string // owner ID (legacy: a bare pid)
	Path       string
	Temp       bool // a writer's temporary file
}

// parseStatusName parses <capability>.<id>.json and the temporary .<capability>.<id>.<random>.tmp.
func parseStatusName(name string) (StatusFile, bool) {
	sf := StatusFile{}
	rest, ok := strings.CutSuffix(name, ".json")
	if !ok {
		var tmp bool
		if rest, tmp = strings.CutSuffix(name, ".tmp"); !tmp || !strings.HasPrefix(rest, ".") {
			return sf, false
		}
		rest = rest[1:strings.LastIndexByte(rest, '.')]
		sf.Temp = true
	}
	capability, id, ok := strings.Cut(rest, ".")
	if !ok || !capabilityRE.MatchString(capability) {
		return sf, false
	}
	if _, _, valid := ParseID(id); !valid {
		return sf, false
	}
	sf.Capability, sf.Owner = capability, id
	return sf, true
}

// Statuses lists the status files (and temporary files) in dir ("" = Dir) of capability
// ("" = every capability). A missing dir holds none.
func Statuses(dir, capability string) ([]StatusFile, error) {
	if dir == "" {
		dir = Dir
	}
	entries, err := readDir(dir, "status files")
	if err != nil {
		return nil, err
	}
	var out []StatusFile
	for _, e := range entries {
		sf, ok := parseStatusName(e.Name())
		if !ok || (capability != "" && sf.Capability != capability) {
			continue
		}
		sf.Path = filepath.Join(dir, e.Name())
		out = append(out, sf)
	}
	return out, nil
}

func init() {
	Register(Cleaner{Kind: KindStatus, Order: 90, List: func(s Scope) ([]Leftover, error) {
		files, err := Statuses(s.StatusDir, "")
		var out []Leftover
		for _, f := range files {
			out = append(out, Leftover{Kind: KindStatus, Name: f.Path, Owner: f.Owner, Remove: func() error {
				if err := os.Remove(f.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
				return nil
			}})
		}
		return out, err
	}})
}
