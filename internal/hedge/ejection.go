package hedge

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// EjectionSpec is a service's replica judgement (docs/hedging.md, Replica judgement): a
// replica that has not answered its last After hedges (the last of them sent over twice the
// delay ago, at least 10 ms), or whose median latency is above the delay and SlowFactor times
// the best other hedge target's (not the service's own address), gets no hedges for Backoff,
// doubled with each ejection in a row up to MaxBackoff. `ejection: off` turns it off.
type EjectionSpec struct {
	Off        bool
	After      int
	SlowFactor int
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// Ejection defaults (Envoy's outlier detection ejects after 5 consecutive errors for 30 s,
// growing; hedges are rarer than requests, so fewer misses and a shorter start).
const (
	DefaultEjectAfter      = 3
	DefaultSlowFactor      = 10
	DefaultEjectBackoff    = time.Second
	DefaultEjectMaxBackoff = 30 * time.Second
	// minJudge is the least time the last of After hedges has to be answered.
	minJudge = 10 * time.Millisecond
)

type ejectionYAML struct {
	After      int      `yaml:"after"`
	SlowFactor int      `yaml:"slow_factor"`
	Backoff    Duration `yaml:"backoff"`
	MaxBackoff Duration `yaml:"max_backoff"`
}

// YAMLShape gives strictyaml the keys of an ejection mapping.
func (EjectionSpec) YAMLShape() any { return ejectionYAML{} }

func (e *EjectionSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		if n.Value == "off" || n.Value == "false" {
			*e = EjectionSpec{Off: true}
			return nil
		}
		return fmt.Errorf("line %d: ejection %q: use off, or {after, slow_factor, backoff, max_backoff}", n.Line, n.Value)
	}
	var raw ejectionYAML
	if err := n.Decode(&raw); err != nil {
		return err
	}
	*e = EjectionSpec{After: raw.After, SlowFactor: raw.SlowFactor, Backoff: time.Duration(raw.Backoff), MaxBackoff: time.Duration(raw.MaxBackoff)}
	return nil
}

func (e *EjectionSpec) validate() error {
	if e.Off {
		return nil
	}
	if e.After == 0 {
		e.After = DefaultEjectAfter
	}
	if e.SlowFactor == 0 {
		e.SlowFactor = DefaultSlowFactor
	}
	if e.Backoff == 0 {
		e.Backoff = DefaultEjectBackoff
	}
	if e.MaxBackoff == 0 {
		e.MaxBackoff = max(DefaultEjectMaxBackoff, e.Backoff)
	}
	switch {
	case e.After < 1 || e.After > 1000:
		return fmt.Errorf("ejection.after %d: use 1..1000 unanswered hedges (or ejection: off)", e.After)
	case e.SlowFactor < 2 || e.SlowFactor > 1000:
		return fmt.Errorf("ejection.slow_factor %d: use 2..1000 (a replica's median this many times the best other's)", e.SlowFactor)
	case e.Backoff < 10*time.Millisecond || e.Backoff > time.Hour:
		return fmt.Errorf("ejection.backoff %v: use 10ms..1h", e.Backoff)
	case e.MaxBackoff < e.Backoff || e.MaxBackoff > 24*time.Hour:
		return fmt.Errorf("ejection.max_backoff %v: use backoff (%v)..24h", e.MaxBackoff, e.Backoff)
	}
	return nil
}

// String renders the judgement as `kedge hedge status` shows it.
func (e EjectionSpec) String() string {
	if e.Off {
		return "off"
	}
	return fmt.Sprintf("after %d unanswered or %dx slower, back-off %v..%v", e.After, e.SlowFactor, e.Backoff, e.MaxBackoff)
}

// judgeWait is how long the last of After hedges may go unanswered: twice the longest delay,
// at least minJudge.
func (s *ServiceConfig) judgeWait() time.Duration {
	return max(2*s.maxDelay(), minJudge)
}
