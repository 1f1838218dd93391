#!/usr/bin/env bash
# Installs what building and testing kedge needs on Debian 12, idempotently and quietly.
# Called by `make deps` (and so by `make test` and `make demo`). Prints only what it installs.
set -euo pipefail

# podman + runc: the image and its test (make image); dnsmasq-base: real DNS replicas in the
# agent's container test (the binary only, no service on the host); systemd: systemd-analyze
# verify of the unit (with man-db for its Documentation=); make deb needs only dpkg-deb.
# etcd-server: the peer of `kedge bench raft --peer etcd` and its lab test (the lab runs its
# own etcd processes in namespaces; on a host booted with systemd the package also enables
# an etcd service on localhost, which kedge neither needs nor touches).
# python3-venv: pping's QUIC test runs aioquic from a virtual environment (below).
# memcached: real memcached replicas in the hedger's memcached-udp lab test and in
# `kedge bench hedge --scenario memcached` (the lab runs its own processes in namespaces; the
# package's host service is not used); php-cli + php-memcache and libmemcached-tools: that
# scenario's real clients (PHP's pecl memcache gets over UDP; memcslap's UDP sets).
pkgs=(clang-19 llvm-19 libbpf-dev bpftool iproute2 ethtool python3 python3-venv busybox-static cpio
      qemu-system-x86 dnsutils iperf3 ca-certificates podman runc dnsmasq-base systemd man-db
      etcd-server memcached php-cli php-memcache libmemcached-tools)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: missing packages: ${missing[*]} - run as root (kedge's tests need root anyway)" >&2
		exit 1
	fi
	echo "deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v go >/dev/null 2>&1; then
	echo "deps: Go is not installed; install Go >= 1.24 (https://go.dev/doc/install) and re-run" >&2
	exit 1
fi
go mod download
# The Helm chart's tests (and make helm) are a module of their own: Helm and the Kubernetes
# API types come from the module proxy.
(cd "$(dirname "$0")/../deploy/helm/chartcheck" && go mod download)
# A real QUIC client and server for pping's QUIC test (internal/pping/quic_test.go): aioquic
# from PyPI, pinned, in a virtual environment of its own (never the system's Python).
quic_venv="${XDG_CACHE_HOME:-$HOME/.cache}/kedge/quic-venv"
if ! "$quic_venv/bin/python3" -c 'import sys, aioquic; sys.exit(aioquic.__version__ != "1.7.2")' 2>/dev/null; then
	echo "deps: installing aioquic 1.7.2 into $quic_venv"
	python3 -m venv "$quic_venv"
	"$quic_venv/bin/pip" install -q aioquic==1.7.2
fi
