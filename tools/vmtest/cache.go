package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// envCache overrides the cache directory (default <repo>/.cache/vmtest).
const envCache = "KEDGE_VMTEST_CACHE"

// cacheDir returns the cache directory, creating it.
func cacheDir(repoRoot string) (string, error) {
	dir := os.Getenv(envCache)
	if dir == "" {
		dir = filepath.Join(repoRoot, ".cache", "vmtest")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create cache dir: %w", err)
	}
	return dir, nil
}

// lockCache takes an exclusive lock on the cache so concurrent runs do not download
// into each other; the returned function releases it.
func lockCache(ctx context.Context, dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open cache lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("lock cache: %w", err)
		}
		slog.Info("waiting for another vmtest run to release the cache", "dir", dir)
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// kernelImage is an unpacked kernel package in the cache.
type kernelImage struct {
	Kernel  Kernel
	Package debPackage
	Vmlinuz string
	Release string // uname -r
	Modules string // .../lib/modules/<release>
}

// fetchKernel resolves k's package in its suite and unpacks it into the cache unless it
// is there already. The package is unpacked with dpkg -x, never installed.
func fetchKernel(ctx context.Context, cache, mirror string, k Kernel, refresh bool) (*kernelImage, error) {
	apt, err := newAptSuite(cache, k.Suite, mirror)
	if err != nil {
		return nil, err
	}
	if err := apt.update(ctx, refresh); err != nil {
		return nil, err
	}
	pkg, err := apt.resolve(ctx, k.Package)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, "kernels", pkg.Name+"_"+pkg.Version)
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		if err := unpackKernel(ctx, apt, pkg, dir); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("stat kernel cache: %w", err)
	}
	img, err := inspectKernel(dir)
	if err != nil {
		return nil, err
	}
	img.Kernel, img.Package = k, pkg
	return img, nil
}

// unpackKernel downloads pkg and unpacks it into dir, atomically: a partial unpack is
// left under a temporary name and removed.
func unpackKernel(ctx context.Context, apt *aptSuite, pkg debPackage, dir string) error {
	start := time.Now()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create kernel cache: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".unpack-")
	if err != nil {
		return fmt.Errorf("create unpack dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	slog.Info("downloading kernel", "package", pkg.String(), "suite", apt.suite)
	deb, err := apt.download(ctx, pkg, tmp)
	if err != nil {
		return err
	}
	root := filepath.Join(tmp, "root")
	if out, err := exec.CommandContext(ctx, "dpkg", "-x", deb, root).CombinedOutput(); err != nil {
		return fmt.Errorf("unpack %s: %w: %s", deb, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(root, dir); err != nil {
		return fmt.Errorf("move unpacked kernel into cache: %w", err)
	}
	slog.Info("kernel unpacked", "package", pkg.String(), "dir", dir, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// inspectKernel finds the image and the module tree in an unpacked package (modules live
// under lib/ before Debian 13 and under usr/lib/ from Debian 13 on).
func inspectKernel(dir string) (*kernelImage, error) {
	images, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return nil, fmt.Errorf("inspect %s: want one boot/vmlinuz-*, found %d", dir, len(images))
	}
	var mods []string
	for _, base := range []string{"lib/modules", "usr/lib/modules"} {
		m, _ := filepath.Glob(filepath.Join(dir, base, "*"))
		mods = append(mods, m...)
	}
	if len(mods) != 1 {
		return nil, fmt.Errorf("inspect %s: want one lib/modules/<release>, found %d", dir, len(mods))
	}
	return &kernelImage{
		Vmlinuz: images[0],
		Release: filepath.Base(mods[0]),
		Modules: mods[0],
	}, nil
}
