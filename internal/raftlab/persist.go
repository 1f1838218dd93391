package raftlab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/runstate"
)

// LabRoot holds the directories of persistent lab clusters (`kedge raft lab up`);
// KEDGE_RAFT_LAB_ROOT overrides it (tests).
const LabRoot = "/run/kedge/raft-lab"

// KindCluster is the cleanup kind of a persistent lab cluster left by a dead supervisor.
const KindCluster = "raft lab cluster"

// LabDir is the directory of persistent lab cluster name.
func LabDir(name string) string {
	root := LabRoot
	if r := os.Getenv("KEDGE_RAFT_LAB_ROOT"); r != "" {
		root = r
	}
	return filepath.Join(root, name)
}

// readInfo reads a cluster directory's ready file.
func readInfo(dir string) (Info, error) {
	var info Info
	b, err := os.ReadFile(filepath.Join(dir, ReadyFile))
	if err != nil {
		return info, fmt.Errorf("read ready file: %w", err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("decode %s: %w", filepath.Join(dir, ReadyFile), err)
	}
	return info, nil
}

// ForceDown removes a persistent lab cluster whose supervisor is gone: it kills the node
// processes named in the ready file (only those whose command line is this cluster's
// `raft serve`), deletes the lab's namespaces and the directory. It returns the number of
// namespaces removed.
func ForceDown(name, dir string) (int, error) {
	var errs []error
	if info, err := readInfo(dir); err == nil {
		var killed []int
		for _, n := range info.Nodes {
			cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n.PID))
			if n.PID > 0 && err == nil && strings.Contains(string(cl), "raft\x00serve\x00--config\x00"+info.Config) {
				if err := syscall.Kill(n.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
					errs = append(errs, fmt.Errorf("kill node %d (pid %d): %w", n.ID, n.PID, err))
				} else {
					killed = append(killed, n.PID)
				}
			}
		}
		// What the killed nodes made themselves (their kernel heartbeats' pacer namespace)
		// goes once each is gone (a process still exiting holds its owner lock).
		for _, pid := range killed {
			for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond) // polling the process's end
			}
			if _, err := netnsx.CleanupStaleOf(pid); err != nil {
				errs = append(errs, err)
			}
		}
	}
	removed, err := lab.Down(name)
	if err != nil && !errors.Is(err, lab.ErrNotFound) {
		errs = append(errs, err)
	}
	errs = append(errs, os.RemoveAll(dir))
	return len(removed), errors.Join(errs...)
}

// The supervisor's owner ID is in its ready file: `kedge cleanup` removes the clusters of
// dead supervisors (nodes, namespaces, directory) and keeps live ones.
func init() {
	runstate.Register(runstate.Cleaner{Kind: KindCluster, Order: 25, List: func(runstate.Scope) ([]runstate.Leftover, error) {
		root := filepath.Dir(LabDir("x"))
		entries, err := os.ReadDir(root)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", root, err)
		}
		var out []runstate.Leftover
		for _, e := range entries {
			name, dir := e.Name(), filepath.Join(root, e.Name())
			info, err := readInfo(dir)
			if err != nil || info.Owner == "" {
				continue // being set up, or not ours: never guessed at
			}
			out = append(out, runstate.Leftover{Kind: KindCluster, Name: dir, Owner: info.Owner,
				Remove: func() error { _, err := ForceDown(name, dir); return err }})
		}
		return out, nil
	}})
}

// alive reports whether pid runs (a zombie does not: it holds nothing any more).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(b), ')')
	return err == nil && i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}
