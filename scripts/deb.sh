#!/usr/bin/env bash
# make deb: the Debian package kedge_<version>_<arch>.deb in bin/, built offline with dpkg-deb:
#   /usr/bin/kedge                            the static binary
#   /lib/systemd/system/kedge-agent.service   the agent's unit (deploy/systemd)
#   /etc/kedge/kedge.yaml                     the default config (a conffile; declares nothing)
#   /usr/share/man/man1/kedge*.1.gz           man pages, from the commands' --help
#   /usr/share/doc/kedge/                     deploy.md
# Tests point KEDGE_BIN, OUT_DIR and COMMIT elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${COMMIT:-$(git describe --always --dirty --abbrev=40 --match=NeVeR 2>/dev/null || echo unknown)}
bin=${KEDGE_BIN:-bin/kedge}
out=${OUT_DIR:-bin}
arch=$(dpkg --print-architecture)
# Debian version: 0~<commit date>.<short commit> sorts by time, as snapshots do.
date=$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null || date -u +%Y%m%d%H%M%S)
version=0~${date}.${commit:0:12}
version=${version//-/.}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$bin" "$root/usr/bin/kedge"
install -D -m 0644 deploy/systemd/kedge-agent.service "$root/lib/systemd/system/kedge-agent.service"
install -D -m 0644 deploy/kedge.yaml "$root/etc/kedge/kedge.yaml"
install -D -m 0644 docs/deploy.md "$root/usr/share/doc/kedge/deploy.md"
mkdir -p "$root/usr/share/man/man1"
"$bin" gen-man "$root/usr/share/man/man1"
gzip -9n "$root"/usr/share/man/man1/*.1
mkdir -p "$root/DEBIAN"
install -m 0755 deploy/deb/postinst deploy/deb/prerm deploy/deb/postrm "$root/DEBIAN/"
echo /etc/kedge/kedge.yaml > "$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: kedge
Version: $version
Architecture: $arch
Maintainer: kedge developers <kedge@localhost>
Installed-Size: $size
Section: net
Priority: optional
Recommends: iproute2
Description: kernel-resident communication patterns for distributed systems (eBPF)
 kedge moves communication patterns of distributed systems into the Linux kernel:
 transparent UDP request hedging, passive latency monitoring (ePPing-style RTTs),
 scatter-gather and a raft key-value store. This package holds the static kedge
 binary, its man pages and the kedge-agent systemd unit, which keeps the hedgers
 and latency monitors of /etc/kedge/kedge.yaml attached and serves Prometheus
 metrics, /healthz and /readyz. Revision $commit.
CONTROL
deb="$out/kedge_${version}_${arch}.deb"
rm -f "$out"/kedge_*_"$arch".deb
dpkg-deb --root-owner-group -Zxz -z3 --build "$root" "$deb" >/dev/null
echo "$deb"
