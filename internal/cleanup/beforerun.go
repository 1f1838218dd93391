package cleanup

import (
	"log/slog"

	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/netnsx"
)

// BeforeRun removes what killed runs left behind before a long-running command starts:
// namespaces, tc filters in ns (the namespace it attaches in; TCX links die with their
// process), pins, veths and status files in statusDir ("" = runstate.Dir). What it
// removes is logged, what stays is logged as a warning; nothing is fatal.
func BeforeRun(log *slog.Logger, ns netns.NsHandle, statusDir string) {
	res, err := Run(Options{FilterNetns: &netnsx.Netns{Handle: ns}, StatusDir: statusDir})
	if err != nil {
		log.Warn("look for leftovers of killed runs", "err", err)
	}
	if res == nil {
		return
	}
	for _, it := range res.Items {
		switch it.Action {
		case Removed:
			log.Info("removed a killed run's leftover", "kind", it.Kind, "name", it.Name, "why", it.Reason)
		case Failed:
			log.Warn("cannot remove a killed run's leftover", "kind", it.Kind, "name", it.Name, "err", it.Error)
		}
	}
}
