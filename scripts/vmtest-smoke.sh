#!/usr/bin/env bash
# Self-test of tools/vmtest on one kernel: a clean guest passes, and a failing test, skips
# (with and without a reason), a guest kernel panic, a hang and a bad flag are each
# reported with the right status and exit code. Fixtures: tools/vmtest/testdata/fixtures.
# Usage: scripts/vmtest-smoke.sh [kernel]   (default 6.12; takes about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
kernel=${1:-6.12}
fx=./tools/vmtest/testdata/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/out
# Built once and run directly: go run folds every non-zero exit code into 1.
go build -o "$tmp/vmtest" ./tools/vmtest
passed=0 failed=0

# check <name> <want-exit> <grep-pattern>... -- <vmtest flags>...
check() {
	local name=$1 want=$2
	shift 2
	local patterns=()
	while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
	shift
	local rc=0
	"$tmp/vmtest" -kernels "$kernel" "$@" >"$out" 2>&1 || rc=$?
	local ok=1
	[ "$rc" -eq "$want" ] || { echo "vmtest-smoke: $name: exit $rc, want $want"; ok=0; }
	for p in "${patterns[@]}"; do
		grep -qF -- "$p" "$out" || { echo "vmtest-smoke: $name: output lacks: $p"; ok=0; }
	done
	if [ "$ok" = 1 ]; then
		echo "vmtest-smoke: $name: ok"
		passed=$((passed + 1))
	else
		sed 's/^/    /' "$out" | tail -40
		failed=$((failed + 1))
	fi
}

check "guest checks pass" 0 "0 failed" -- -pkgs ''
check "pass, fail and skips are counted" 1 "1 passed, 1 failed, 2 skipped" "(no reason given)" \
	"fixture: skipped on purpose" "failed: TestFails" -- -guestcheck=false -pkgs "$fx/mixed"
check "guest kernel panic" 1 "KERNEL-BUG" "Kernel panic" "while tools/vmtest/testdata/fixtures/crash was running" \
	-- -guestcheck=false -pkgs "$fx/crash"
check "guest timeout kills qemu" 1 "TIMEOUT" "qemu was killed" -- -guestcheck=false -timeout 8s -pkgs "$fx/hang"
check "unknown kernel is a usage error" 2 "unknown kernel" -- -kernels no-such-kernel

echo "vmtest-smoke: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
