// Command vmtest runs kedge's Go tests inside Debian stock kernels booted under qemu
// (TCG), one guest per kernel, and summarises the results. See docs/kernels.md.
//
// Exit codes: 0 every guest ran and every test passed or skipped; 1 a test failed, a
// binary exited non-zero, or a guest crashed or timed out; 2 bad usage; 3 the matrix
// could not be set up (kernel download, test build, initramfs).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
	exitSetup = 3
)

const (
	guestCPUs = 2
	// guestcheckPkg checks the guest itself (kernel, modules, BTF, netns, netem, BPF);
	// it runs first on every kernel unless -guestcheck=false.
	guestcheckPkg = "./tools/vmtest/guestcheck"
)

type options struct {
	kernels    string
	all        bool
	pkgs       string
	run        string
	timeout    time.Duration
	keep       bool
	guestcheck bool
	refresh    bool
	shell      bool
	list       bool
	verbose    bool
}

const usageText = `Usage: go run ./tools/vmtest [flags]

Boots Debian kernels under qemu (TCG) and runs Go test binaries inside each guest.
Kernels are downloaded with apt-get and unpacked into the cache (.cache/vmtest or
$KEDGE_VMTEST_CACHE); nothing is installed on the host.

Examples:
  go run ./tools/vmtest -list
  go run ./tools/vmtest -kernels 6.1,6.12
  go run ./tools/vmtest -all
  go run ./tools/vmtest -kernels 5.10 -pkgs ./internal/lab -run 'TestBridge$'
  go run ./tools/vmtest -kernels 6.12 -pkgs ./internal/lab -shell

Flags:
`

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("vmtest", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.kernels, "kernels", "", "comma-separated kernels from the table, e.g. 6.1,6.12 (default "+defaultKernel+"; -list shows the table)")
	fs.BoolVar(&o.all, "all", false, "run every kernel in the table")
	fs.StringVar(&o.pkgs, "pkgs", "./internal/...,./pkg/...,./examples/...", "comma-separated package patterns; packages without tests are skipped")
	fs.StringVar(&o.run, "run", "", "only run tests matching this regexp (go test -run) in the -pkgs packages")
	fs.DurationVar(&o.timeout, "timeout", 300*time.Second, "per-kernel limit for boot plus tests; qemu is killed after it")
	fs.BoolVar(&o.keep, "keep", false, "keep the work dir (test binaries, initramfs, console logs) and print its path")
	fs.BoolVar(&o.guestcheck, "guestcheck", true, "run "+guestcheckPkg+" (checks of the guest itself) first on every kernel")
	fs.BoolVar(&o.refresh, "refresh", false, "run apt-get update even if the cached package lists are recent")
	fs.BoolVar(&o.shell, "shell", false, "after the tests, open an interactive shell in the guest (one kernel only, no timeout)")
	fs.BoolVar(&o.list, "list", false, "print the kernel table and exit")
	fs.BoolVar(&o.verbose, "v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q (flags only)", fs.Args())
	}
	if o.all && o.kernels != "" {
		return o, errors.New("-all and -kernels exclude each other")
	}
	if o.timeout <= 0 {
		return o, errors.New("-timeout must be positive")
	}
	return o, nil
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	o, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "vmtest: %v\n", err)
		return exitUsage
	}
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	if o.list {
		printKernelTable()
		return exitOK
	}
	sel, err := selectKernels(o.kernels, o.all)
	if err == nil && o.shell && len(sel) != 1 {
		err = errors.New("-shell needs exactly one kernel")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmtest: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := runMatrix(ctx, o, sel)
	if err != nil {
		slog.Error("vmtest setup failed", "err", err)
		return exitSetup
	}
	printSummary(os.Stdout, results)
	for _, r := range results {
		if r.Failed() {
			return exitFail
		}
	}
	if len(results) < len(sel) {
		return exitFail // interrupted
	}
	return exitOK
}

// runMatrix builds the test binaries, fetches the kernels and runs one guest per kernel.
func runMatrix(ctx context.Context, o options, sel []Kernel) ([]*kernelResult, error) {
	root, err := repoRoot(ctx)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "vmtest-")
	if err != nil {
		return nil, fmt.Errorf("create work dir: %w", err)
	}
	if o.keep {
		defer slog.Info("work dir kept", "dir", work)
	} else {
		defer os.RemoveAll(work)
	}
	tests, err := buildTests(ctx, root, o, work)
	if err != nil {
		return nil, err
	}
	images, err := fetchKernels(ctx, root, sel, o.refresh)
	if err != nil {
		return nil, err
	}
	var results []*kernelResult
	for _, img := range images {
		if ctx.Err() != nil {
			slog.Warn("interrupted, not booting the remaining kernels")
			break
		}
		r, err := runKernel(ctx, o, img, tests, work)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// buildTests compiles the guestcheck and -pkgs test binaries and says how to run them.
func buildTests(ctx context.Context, root string, o options, work string) (_ []guestTest, err error) {
	var pkgs []testPackage
	if patterns := splitList(o.pkgs); len(patterns) > 0 {
		if pkgs, err = listTestPackages(ctx, root, patterns); err != nil {
			return nil, err
		}
	}
	if len(pkgs) == 0 {
		slog.Warn("no package with tests matches -pkgs", "pkgs", o.pkgs)
	}
	var check []testPackage
	if o.guestcheck {
		if check, err = listTestPackages(ctx, root, []string{guestcheckPkg}); err != nil {
			return nil, err
		}
	}
	binDir := filepath.Join(work, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, fmt.Errorf("create bin dir: %w", err)
	}
	base := []string{"-test.v", "-test.count=1", "-test.timeout=" + binaryTimeout(o.timeout).String()}
	var tests []guestTest
	seen := map[string]bool{}
	add := func(p testPackage, args []string) error {
		if seen[p.ImportPath] {
			return nil
		}
		seen[p.ImportPath] = true
		bin, err := buildTest(ctx, root, p, binDir)
		if err != nil {
			return err
		}
		tests = append(tests, guestTest{Pkg: p.Rel, Binary: bin, SrcDir: p.Dir, Args: args})
		return nil
	}
	start := time.Now()
	for _, p := range check {
		if err := add(p, base); err != nil {
			return nil, err
		}
	}
	userArgs := base
	if o.run != "" {
		userArgs = append(append([]string{}, base...), "-test.run="+o.run)
	}
	for _, p := range pkgs {
		if err := add(p, userArgs); err != nil {
			return nil, err
		}
	}
	if len(tests) == 0 && !o.shell {
		return nil, errors.New("nothing to run: no test packages selected and -guestcheck=false")
	}
	slog.Info("test binaries built", "count", len(tests), "took", time.Since(start).Round(time.Millisecond))
	return tests, nil
}

// binaryTimeout is each binary's -test.timeout: shorter than the guest's limit, so a
// hanging test panics with its goroutines dumped instead of the guest being killed.
func binaryTimeout(guest time.Duration) time.Duration {
	if guest > 40*time.Second {
		return guest - 20*time.Second
	}
	return guest / 2
}

// fetchKernels resolves, downloads and unpacks the selected kernels (cached).
func fetchKernels(ctx context.Context, root string, sel []Kernel, refresh bool) ([]*kernelImage, error) {
	cache, err := cacheDir(root)
	if err != nil {
		return nil, err
	}
	unlock, err := lockCache(ctx, cache)
	if err != nil {
		return nil, err
	}
	defer unlock()
	mirror, err := hostMirror()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(archiveKeyring); err != nil {
		return nil, fmt.Errorf("find the Debian archive keyring: %w - apt-get install debian-archive-keyring", err)
	}
	var images []*kernelImage
	for _, k := range sel {
		img, err := fetchKernel(ctx, cache, mirror, k, refresh)
		if err != nil {
			return nil, fmt.Errorf("fetch kernel %s: %w", k.Name, err)
		}
		slog.Info("kernel ready", "kernel", k.Name, "package", img.Package.String(), "release", img.Release)
		images = append(images, img)
	}
	return images, nil
}

// runKernel builds img's initramfs and boots it.
func runKernel(ctx context.Context, o options, img *kernelImage, tests []guestTest, work string) (*kernelResult, error) {
	tree, err := loadModuleTree(img.Modules)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", img.Kernel.Name, err)
	}
	mods, err := tree.closure(guestModules)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", img.Kernel.Name, err)
	}
	initrd := filepath.Join(work, "initramfs-"+img.Kernel.Name+".cpio")
	if err := writeInitramfs(initrd, guestImage{Kernel: img, Modules: mods, Tests: tests, Shell: o.shell}); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", img.Kernel.Name, err)
	}
	st, err := os.Stat(initrd)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", img.Kernel.Name, err)
	}
	logf, err := os.Create(filepath.Join(work, "console-"+img.Kernel.Name+".log"))
	if err != nil {
		return nil, fmt.Errorf("create console log: %w", err)
	}
	defer logf.Close()
	timeout := o.timeout
	if o.shell {
		timeout = 24 * time.Hour
	}
	var panics []string
	var r *kernelResult
	for attempt := 1; ; attempt++ {
		slog.Info("booting", "kernel", img.Kernel.Name, "package", img.Package.String(), "modules", len(mods), "timeout", timeout, "attempt", attempt)
		r = runGuest(ctx, img, initrd, qemuConfig{
			Timeout: timeout, Memory: guestMemory(st.Size()), CPUs: guestCPUs, Shell: o.shell,
			Out: os.Stdout, Log: logf,
		})
		if o.shell || attempt >= bootAttempts || ctx.Err() != nil || !r.panickedBeforeTests() {
			break
		}
		panics = append(panics, r.KernelBugs[0])
		slog.Warn("guest kernel panicked before any test started; booting it again", "kernel", img.Kernel.Name, "bug", r.KernelBugs[0], "attempt", attempt, "of", bootAttempts)
	}
	r.BootPanics = panics
	slog.Info("guest finished", "kernel", img.Kernel.Name, "status", r.Status(), "boot", seconds(r.BootTime), "total", seconds(r.Duration))
	return r, nil
}

// bootAttempts bounds the boots of one kernel when each panics before any test starts
// (kernelResult.panickedBeforeTests); the last attempt's result is the kernel's.
const bootAttempts = 3

// guestMemory sizes the guest for an initramfs of initrdBytes: the kernel keeps the archive
// in memory while it unpacks it into rootfs (a tmpfs that may fill half the memory), and the
// tests need room beside both. At least 1 GiB; larger in steps of 256 MiB as the test
// binaries grow (with too little, the kernel logs "Initramfs unpacking failed" and the
// packages past the cut are missing).
func guestMemory(initrdBytes int64) string {
	const mib = 1 << 20
	need := (2*initrdBytes + 512*mib + 256*mib - 1) / (256 * mib) * 256
	return fmt.Sprintf("%dM", max(need, 1024))
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func printKernelTable() {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSUITE\tPACKAGE")
	for _, k := range kernels {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", k.Name, k.Suite, k.Package)
	}
	tw.Flush()
}
