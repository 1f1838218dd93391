package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/agent"
)

func init() { register(newAgentCmd) }

func newAgentCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "agent [--config FILE]",
		Short: "Run hedgers and latency monitors from one config file, as a node agent (systemd, Kubernetes)",
		Long: `Agent is kedge as a long-running service: it keeps the hedgers and pping monitors that
its config file declares attached - on several interfaces and network namespaces at
once - and serves one HTTP endpoint:

  /metrics   Prometheus metrics of everything it runs (kedge_hedge_*, kedge_pping_*,
             kedge_agent_*), labelled with netns and interface
  /healthz   200 while the agent's loop runs
  /readyz    200 once every configured hedger and monitor is attached, else 503 with
             the ones that are not and why

The config (default /etc/kedge/kedge.yaml; docs/deploy.md has every key):

  listen: 127.0.0.1:9464
  log: {level: info, format: json}
  hedge:
    - interface: eth0
      services:
        - {name: dns, address: 10.96.0.10:53, replicas: [10.244.1.5:53], request_id: {length: 2}}
  pping:
    - interface: eth0

On SIGHUP, and when the file's content changes, it reloads: hedgers and monitors added
or removed are attached or detached, a hedger's services are changed in place (the
other services, and every service that stays, keep their counters), and what did not
change is not touched. A config that does not validate is logged, counted
(kedge_agent_config_reloads_total{result="failure"}) and ignored: the running config
stays. What cannot attach yet (an interface or namespace that does not exist) is
retried every 'retry' (5s), and what loses its interface is detached and retried.

At start it removes what killed kedge runs left behind, a previous agent killed with
SIGKILL included (also from another container). SIGTERM or Ctrl-C detaches
everything and exits 0.

Exit codes: 0 stopped by a signal (everything detached), 1 runtime error, 2 the config
does not validate (see 'kedge agent check').`,
		Example: `  # validate a config (no root needed)
  kedge agent check /etc/kedge/kedge.yaml

  # run it in the foreground
  sudo kedge agent --config /etc/kedge/kedge.yaml

  # reload after editing the file (or just save it: the agent notices)
  sudo systemctl reload kedge-agent      # sends SIGHUP

  # is everything attached?
  curl -s 127.0.0.1:9464/readyz`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadAgentConfig(path)
			if err != nil {
				return err
			}
			handler := slog.Handler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))
			if cfg.Log.Format == "json" {
				handler = slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})
			}
			log := slog.New(handler)
			slog.SetDefault(log)
			if !verbose {
				l, _ := agent.ParseLevel(cfg.Log.Level)
				logLevel.Set(l)
			}
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			level := logLevel
			if verbose {
				level = nil // -v keeps debug whatever the file says
			}
			return rootHint(agent.Run(cmd.Context(), agent.Options{Path: path, Config: cfg, Log: log, Level: level, Reload: hup}))
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", agent.DefaultPath, "the agent's config file")
	cmd.AddCommand(newAgentCheckCmd())
	return cmd
}

// loadAgentConfig loads and validates the config; one that does not is bad usage (exit 2).
func loadAgentConfig(path string) (*agent.Config, error) {
	cfg, err := agent.Load(path)
	switch {
	case errors.Is(err, agent.ErrInvalid):
		return nil, usageError{Err: err}
	case errors.Is(err, os.ErrNotExist):
		return nil, usagef("%v (write one: 'kedge agent --help' shows the keys, docs/deploy.md an example)", err)
	}
	return cfg, err
}

func newAgentCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE",
		Short: "Validate an agent config file without running it (no root needed)",
		Long: `Check reads the agent's config file and validates everything that can be judged
without root and without the interfaces: keys (a typo is named, with the nearest valid
key), values and their ranges, and that no two hedgers or monitors share an interface.
It prints what the file declares.

Exit codes: 0 valid, 2 not valid or no such file (the message says what to change),
1 unreadable.`,
		Example: `  kedge agent check /etc/kedge/kedge.yaml
  kedge agent check kedge.yaml && sudo systemctl reload kedge-agent`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s needs one config file, got %d arguments (see '%s --help')", cmd.CommandPath(), len(args), cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadAgentConfig(args[0])
			if err != nil {
				return err
			}
			services := 0
			for _, h := range cfg.Hedge {
				services += len(h.Services)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: valid: %d hedger(s) with %d service(s), %d monitor(s); serves %s\n",
				args[0], len(cfg.Hedge), services, len(cfg.Pping), cfg.Listen)
			return err
		},
	}
}
