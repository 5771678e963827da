#!/usr/bin/env bash
# Pin a worker pool to an image by both of its names, in one step:
#
#     deploy/kubernetes/pin-image.sh OVERLAY IMAGE
#
# OVERLAY is a pool's overlay directory (deploy/kubernetes/overlays/gpu, or your copy of one);
# IMAGE the pushed image, by digest (REGISTRY/reprotrain-worker-gpu@sha256:..., as docker push
# printed it) or by the tag you pushed (REGISTRY/reprotrain-worker-gpu:0.1.0, resolved to its
# registry digest). Rewrites the overlay's image.yaml with `reference`, the registry digest
# pods are pulled by, and `id`, the same image's ID (docker image inspect --format '{{.Id}}',
# pulling the image first when this engine does not have it). The overlay copies both to
# every place that needs them, so the two can only change together. Needs the docker CLI
# ($DOCKER names another).
set -euo pipefail

say() { echo "pin-image.sh: $*" >&2; }
usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

(($# == 2)) || usage
overlay="${1%/}" image="$2"
docker_cli="${DOCKER:-docker}"

if [[ ! -f "$overlay/kustomization.yaml" ]]; then
    say "$overlay is not a kustomize overlay (it has no kustomization.yaml)"
    exit 2
fi
if ! grep -qs '^  name: reprotrain-worker-image$' "$overlay/image.yaml"; then
    say "$overlay has no image.yaml naming reprotrain-worker-image: start a pool from a copy" \
        "of deploy/kubernetes/overlays/gpu or overlays/cpu"
    exit 2
fi
if [[ ! "$image" =~ ^[a-z0-9][A-Za-z0-9._/:-]*(@sha256:[0-9a-f]{64})?$ ]]; then
    say "not an image reference: '$image' (REGISTRY/NAME@sha256:<64 hex> or REGISTRY/NAME:TAG)"
    exit 2
fi

# The repository: the reference without its digest, then without a tag (a ':' after the
# last '/'; one before it is a registry's port).
repository="${image%%@*}"
last="${repository##*/}"
[[ "$last" == *:* ]] && repository="${repository%:*}"

if ! "$docker_cli" image inspect "$image" >/dev/null 2>&1; then
    "$docker_cli" pull --quiet "$image" >/dev/null
fi

if [[ "$image" == *@sha256:* ]]; then
    reference="$repository@${image##*@}"
else
    # A tag names whatever was pushed last: take the digest this engine recorded for it.
    digests=()
    while read -r line; do
        [[ "$line" == "$repository@"* ]] && digests+=("$line")
    done < <("$docker_cli" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$image")
    if ((${#digests[@]} != 1)); then
        say "$image has ${#digests[@]} registry digests under $repository on this engine" \
            "(${digests[*]:-none: it was not pushed or pulled}); give the digest docker push printed:" \
            "$repository@sha256:..."
        exit 1
    fi
    reference="${digests[0]}"
fi
if [[ ! "$reference" =~ ^[^@[:space:]]+@sha256:[0-9a-f]{64}$ ]]; then
    say "could not resolve $image to a registry digest (got '$reference')"
    exit 1
fi

id="$("$docker_cli" image inspect --format '{{.Id}}' "$reference")"
if [[ ! "$id" =~ ^sha256:[0-9a-f]{64}$ ]]; then
    say "$reference has no image ID of the form sha256:<64 hex> on this engine (got '$id')"
    exit 1
fi

tmp="$(mktemp "$overlay/.image.yaml.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
cat >"$tmp" <<EOF
# This pool's image by its two names, written together by deploy/kubernetes/pin-image.sh (run
# it again for another image; never edit one line alone): \`reference\`, the registry digest
# pods are pulled by, and \`id\`, the same image's ID (config digest) the docker executor pins.
# The overlay's replacements copy both where they are needed; this object is never applied.
apiVersion: v1
kind: ConfigMap
metadata:
  name: reprotrain-worker-image
  annotations:
    config.kubernetes.io/local-config: "true"
data:
  reference: $reference
  id: $id
EOF
chmod 644 "$tmp"
mv "$tmp" "$overlay/image.yaml"
trap - EXIT
echo "pinned $overlay to $reference (image ID $id)"
