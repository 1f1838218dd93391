package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/cleanup"
)

// ParseLevel parses a log level: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil || !strings.EqualFold(l.String(), s) && !strings.EqualFold(s, "warning") {
		return 0, fmt.Errorf("log.level %q: use debug, info, warn or error", s)
	}
	return l, nil
}

// Options are what `kedge agent` gives Run besides the config file.
type Options struct {
	// Path is the config file; Config is its content, loaded and validated by the caller.
	Path   string
	Config *Config
	Log    *slog.Logger
	// Level is the log level the handler of Log reads; reloads set it.
	Level *slog.LevelVar
	// Reload delivers SIGHUP (nil: none).
	Reload <-chan os.Signal
	// Poll is how often the file is read to see whether it changed (default 2s): a
	// Kubernetes ConfigMap changes by a symlink swap, an editor by a rename, so the content
	// is compared, not inotify events.
	Poll time.Duration
	// Listening is called once the HTTP listener is open (tests, with port 0).
	Listening func(net.Addr)
	// StatusDir holds the agent's status file ("" = runstate.Dir).
	StatusDir string
}

// Run is `kedge agent`: it removes what killed runs left, attaches the config's units,
// serves /metrics, /healthz and /readyz, applies a changed config on SIGHUP or when the
// file's content changes (a config that does not validate is logged, counted and ignored:
// the running one stays), retries what is not attached, and detaches everything when ctx
// ends.
func Run(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Poll == 0 {
		o.Poll = 2 * time.Second
	}
	cfg := o.Config
	srv, err := Listen(cfg.Listen)
	if err != nil {
		return err
	}
	defer srv.Close()
	if o.Listening != nil {
		o.Listening(srv.Addr())
	}
	cleanStale(o.Log, cfg)

	a := New(o.Log)
	defer a.Close()
	a.listenAddr.Store(srv.Addr().String())
	a.lastLoop.Store(time.Now().UnixNano())
	a.healthWindow.Store(int64(3*time.Duration(cfg.Retry) + 30*time.Second))
	srv.Serve(a)
	o.Log.Info("agent serving", "url", "http://"+srv.Addr().String(), "endpoints", "/metrics /healthz /readyz", "config", o.Path)
	statusCtx, stopStatus := context.WithCancel(context.Background())
	published := make(chan struct{})
	go func() {
		defer close(published)
		a.publishStatus(statusCtx, o.StatusDir, Status{PID: os.Getpid(), Started: time.Now(), Config: o.Path},
			func() string { return a.listenAddr.Load().(string) }, 2*time.Second)
	}()
	defer func() { stopStatus(); <-published }()
	if len(cfg.Hedge)+len(cfg.Pping) == 0 {
		o.Log.Warn("the config declares nothing to run: add hedgers under 'hedge' or monitors under 'pping', then reload", "config", o.Path)
	}
	if err := a.Apply(cfg); err != nil {
		o.Log.Warn("not everything is attached yet; retrying every "+time.Duration(cfg.Retry).String(), "err", err)
	}
	a.metrics.reloaded(true)
	hash := fileHash(o.Path)

	reload := func(why string) {
		b, err := os.ReadFile(o.Path)
		if err == nil {
			var next *Config
			if next, err = Parse(o.Path, b); err == nil {
				err = a.reload(&srv, cfg, next, o)
				if err == nil {
					cfg = next
				}
			}
		}
		if err != nil {
			a.metrics.reloaded(false)
			o.Log.Error("config rejected; the running config stays", "why", why, "err", err)
			return
		}
		a.metrics.reloaded(true)
		o.Log.Info("config applied", "why", why)
	}
	retry := time.NewTimer(time.Duration(cfg.Retry))
	defer retry.Stop()
	poll := time.NewTicker(o.Poll)
	defer poll.Stop()
	for {
		a.lastLoop.Store(time.Now().UnixNano())
		a.healthWindow.Store(int64(3*time.Duration(cfg.Retry) + 30*time.Second))
		select {
		case <-ctx.Done():
			o.Log.Info("detaching everything")
			return nil
		case <-o.Reload:
			hash = fileHash(o.Path)
			reload("SIGHUP")
		case <-poll.C:
			if h := fileHash(o.Path); !bytes.Equal(h, hash) {
				hash = h
				reload("the file changed")
			}
		case <-retry.C:
			a.check()
			retry.Reset(time.Duration(cfg.Retry))
		}
	}
}

// reload applies next (validated): the listener moves when listen changed (if the new
// address cannot be opened the reload fails and nothing changes), the log level follows,
// and the units are applied.
func (a *Agent) reload(srv **Server, cur, next *Config, o Options) error {
	if next.Listen != cur.Listen {
		ns, err := Listen(next.Listen)
		if err != nil {
			return err
		}
		old := *srv
		*srv = ns
		ns.Serve(a)
		_ = old.Close()
		a.listenAddr.Store(ns.Addr().String())
		if o.Listening != nil {
			o.Listening(ns.Addr())
		}
		o.Log.Info("agent serving", "url", "http://"+ns.Addr().String())
	}
	if o.Level != nil {
		l, _ := ParseLevel(next.Log.Level)
		o.Level.Set(l)
	}
	if next.Log.Format != cur.Log.Format {
		o.Log.Warn("log.format changes at the next start", "running", cur.Log.Format, "configured", next.Log.Format)
	}
	if err := a.Apply(next); err != nil {
		o.Log.Warn("not everything is attached yet; retrying every "+time.Duration(next.Retry).String(), "err", err)
	}
	return nil
}

// alive is /healthz: the agent's loop ran recently (it runs at least every retry interval;
// a unit operation that hangs stops it).
func (a *Agent) alive() error {
	if age := time.Since(time.Unix(0, a.lastLoop.Load())); age > time.Duration(a.healthWindow.Load()) {
		return fmt.Errorf("the agent's loop last ran %v ago", age.Round(time.Second))
	}
	return nil
}

// fileHash is the SHA-256 of the file's content (nil when it cannot be read).
func fileHash(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	h := sha256.Sum256(b)
	return h[:]
}

// cleanStale removes what killed runs left behind - a previous agent killed with SIGKILL
// included, also one that ran in another PID namespace (a container): its namespaces,
// status files, pins, and tc filters in every namespace the config names. What stays is
// logged, not fatal.
func cleanStale(log *slog.Logger, cfg *Config) {
	spaces := map[string]bool{"": true}
	for _, h := range cfg.Hedge {
		spaces[h.Netns] = true
	}
	for _, p := range cfg.Pping {
		spaces[p.Netns] = true
	}
	for arg := range spaces {
		ns, err := openNetns(arg)
		if err != nil {
			continue // not there (yet): nothing of ours in it
		}
		cleanup.BeforeRun(log, ns, "")
		if arg != "" {
			ns.Close()
		}
	}
}
