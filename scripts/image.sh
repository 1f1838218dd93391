#!/usr/bin/env bash
# make image: kedge's OCI image, FROM scratch (nothing is pulled: the build works offline),
# holding bin/kedge and the default config, labelled with the commit. It is tagged
# localhost/kedge:<commit> and localhost/kedge:latest in podman's store, and saved as
#   bin/kedge-image.oci.tar     OCI archive   (podman load, skopeo, containerd: ctr import)
#   bin/kedge-image.docker.tar  docker archive (docker load, podman load)
# Tests point KEDGE_BIN, IMAGE_TAG, OUT_DIR and COMMIT elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${COMMIT:-$(git describe --always --dirty --abbrev=40 --match=NeVeR 2>/dev/null || echo unknown)}
bin=${KEDGE_BIN:-bin/kedge}
out=${OUT_DIR:-bin}
tags=(-t "${IMAGE_TAG:-localhost/kedge:${commit:0:12}}")
[ -n "${IMAGE_TAG:-}" ] || tags+=(-t localhost/kedge:latest)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$bin" "$ctx/kedge"
cp deploy/kedge.yaml "$ctx/kedge.yaml"
podman build --quiet --format oci --build-arg REVISION="$commit" -f deploy/image/Containerfile \
	"${tags[@]}" "$ctx" >/dev/null
tag=${tags[1]}
rm -f "$out/kedge-image.oci.tar" "$out/kedge-image.docker.tar"
podman save --quiet --format oci-archive -o "$out/kedge-image.oci.tar" "$tag"
podman save --quiet --format docker-archive -o "$out/kedge-image.docker.tar" "$tag"
echo "image $tag (revision $commit): $out/kedge-image.oci.tar, $out/kedge-image.docker.tar"
