#!/usr/bin/env bash
# Regenerates the bpf2go bindings (Go + .o) byte for byte, wherever the checkout lives.
#
# clang-19's BTF emission orders types and strings in a way that depends on the absolute
# paths it is given (a clone under a longer path gave a .o with the same code but a
# reordered .BTF string table). So the sources are compiled from one fixed directory and
# only the generated files are copied back. Called by `make generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=/tmp/kedge-generate   # fixed on purpose: see above

# Concurrent runs (several work trees on one machine) take turns on the fixed directory.
exec 9>"$build.lock"
flock 9
rm -rf "$build"
mkdir -p "$build"
trap 'rm -rf "$build"' EXIT
# Tracked and untracked (not ignored) files, so uncommitted edits are built too.
git ls-files -z --cached --others --exclude-standard |
	while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
	tar -c --null -T - | tar -x -C "$build"
(cd "$build" && go generate ./...)
(cd "$build" && find internal -name '*_bpfel.go' -o -name '*_bpfel.o' -o -name '*_bpfel_test.go' -o -name '*_bpfel_test.o') | while read -r f; do
	cmp -s "$build/$f" "$repo/$f" || cp "$build/$f" "$repo/$f"
done
