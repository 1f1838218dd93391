#!/usr/bin/env bash
# The test suite behind `make test`: Go unit tests, BPF_PROG_TEST_RUN fixtures, netns
# integration tests with real processes, a short fuzz run of the parser, and the kernel
# matrix on one guest kernel that has netem and fq.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
go test -count=1 -timeout 20m ./...
go test -count=1 -run '^$' -fuzz FuzzParse -fuzztime 20s -fuzzminimizetime 5s ./internal/parsetest
