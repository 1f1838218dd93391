#!/usr/bin/env bash
# The test suite behind `make test`: Go unit tests, BPF_PROG_TEST_RUN fixtures, netns
# integration tests with real processes, every benchmark once, a short fuzz run of the parser, and the kernel
# matrix on one guest kernel that has netem and fq (Debian's 6.12 under qemu), where the
# hedger's edt and netem delay lines run the scenario the host runs with the conveyor.
# `make test-kernels` runs the whole matrix (5.10, 6.1, 6.12).
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
# No test attaches the kernel RTT source (a sock_ops program) to the cgroup2 root, which
# would run it for every process of this host: the monitor refuses while this is set.
export KEDGE_FORBID_ROOT_CGROUP=1
go test -count=1 -timeout 20m ./...
# Every Go benchmark once (-benchtime=1x): they compile and run, their figures mean nothing
# here (figures come from quiet-machine runs, see docs/benchmarks.md).
go test -count=1 -timeout 20m -run '^$' -bench . -benchtime=1x ./...
# The Helm chart, rendered with Helm's library and decoded into the Kubernetes API types: a
# module of its own (deploy/helm/chartcheck), so Helm is no dependency of kedge.
(cd deploy/helm/chartcheck && go test -count=1 -timeout 20m ./...)
# Fuzz budgets are execution counts, not durations: with a duration, Go 1.26's fuzz
# coordinator can report "context deadline exceeded" (no failing input) when a loaded
# worker is mid-run at the deadline (golang/go#75804, fixed in Go 1.27); seen here once in
# FuzzGather. The counts are what each target runs in ~10-20 s on this 2-CPU machine.
go test -count=1 -run '^$' -fuzz FuzzParse -fuzztime 300000x -fuzzminimizetime 5s ./internal/parsetest
go test -count=1 -run '^$' -fuzz FuzzDecode -fuzztime 200000x -fuzzminimizetime 5s ./internal/raft/wire
go test -count=1 -run '^$' -fuzz FuzzReplay -fuzztime 200000x -fuzzminimizetime 5s ./internal/raft/storage
go test -count=1 -run '^$' -fuzz FuzzGather -fuzztime 150000x -fuzzminimizetime 5s ./internal/sg
go run ./tools/vmtest -kernels 6.12 -timeout 900s -pkgs ./internal/hedge,./internal/parsetest,./internal/pacer,./internal/raft/offload,./internal/raft/wire
# sg's BPF fixtures on 6.1: an older verifier (bounds it loses on 32-bit compares) and clsact.
go run ./tools/vmtest -kernels 6.1 -timeout 600s -pkgs ./internal/sg -run 'TestLoadTiers|TestGather|TestScatter|TestSweep'
