#!/usr/bin/env bash
# Build Reprotrain's images from docker/ (the build context is the repository root).
#
#     docker/build.sh --base IMAGE [api] [cpu] [gpu] [postgres]     (default: api cpu)
#
#   api       reprotrain-api:VERSION         the API server, no TensorFlow
#   cpu       reprotrain-worker-cpu:VERSION  worker + tensorflow-cpu
#   gpu       reprotrain-worker-gpu:VERSION  worker + tensorflow and the CUDA 12.5 / cuDNN 9.3 wheels
#   postgres  reprotrain-postgres:15         Debian's PostgreSQL 15 (for the compose stack)
#
# --base (or REPRO_BASE_IMAGE) names a Debian bookworm image: in production a registry
# image by digest (debian:bookworm-slim@sha256:...); on a machine without a registry the
# image .ci/docker-deps.sh makes with debootstrap. Its digest (or, for a local image, its
# image ID) is recorded in each image's labels and build info. Prints one line per image:
# name, tag, image ID. Uses BuildKit through Debian's docker client; a CA bundle at
# $REPRO_BUILD_CA (default: the system bundle, when present) goes to pip as a build secret.
set -euo pipefail
cd "$(dirname "$0")/.."

DOCKER="${DOCKER:-/usr/bin/docker}"
[[ -x "$DOCKER" ]] || DOCKER=docker
base="${REPRO_BASE_IMAGE:-}"
targets=()
while (($#)); do
    case "$1" in
        --base) base="$2"; shift 2 ;;
        --base=*) base="${1#--base=}"; shift ;;
        -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
        api | cpu | gpu | postgres) targets+=("$1"); shift ;;
        *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
((${#targets[@]})) || targets=(api cpu)
if [[ -z "$base" ]]; then
    echo "build.sh: name the Debian bookworm base image with --base (or REPRO_BASE_IMAGE)" >&2
    exit 2
fi

version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
source_url="${REPRO_SOURCE_URL:-$(git remote get-url origin 2>/dev/null || echo unknown)}"
if ! "$DOCKER" image inspect "$base" >/dev/null 2>&1; then
    "$DOCKER" pull "$base" >/dev/null
fi
# A registry image is known by its digest; a local one (imported, built) only by its ID.
base_digest="$("$DOCKER" image inspect --format '{{if .RepoDigests}}{{index .RepoDigests 0}}{{else}}{{.Id}}{{end}}' "$base")"
ca="${REPRO_BUILD_CA-/etc/ssl/certs/ca-certificates.crt}"
secret=()
[[ -n "$ca" && -s "$ca" ]] && secret=(--secret "id=ca,src=$ca")

build() {
    local tag="$1" file="$2"
    shift 2
    DOCKER_BUILDKIT=1 "$DOCKER" build --quiet --file "$file" --tag "$tag" \
        --build-arg "BASE_IMAGE=$base" --build-arg "BASE_DIGEST=$base_digest" \
        --build-arg "REVISION=$revision" --build-arg "VERSION=$version" \
        --build-arg "SOURCE=$source_url" "${secret[@]}" "$@" . >/dev/null
    echo "${tag%%:*} ${tag##*:} $("$DOCKER" image inspect --format '{{.Id}}' "$tag")"
}

build_target() {
    case "$1" in
        api) build "reprotrain-api:$version" docker/Dockerfile --target api --build-arg LOCK=api ;;
        cpu) build "reprotrain-worker-cpu:$version" docker/Dockerfile --target worker --build-arg LOCK=cpu ;;
        gpu) build "reprotrain-worker-gpu:$version" docker/Dockerfile --target worker --build-arg LOCK=gpu ;;
        postgres) build "reprotrain-postgres:15" docker/postgres.Dockerfile ;;
    esac
}

# Concurrently: the builds mostly wait on downloads, and BuildKit shares their common
# stages. Each one's output is kept apart and shown in order.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
pids=()
for target in "${targets[@]}"; do
    build_target "$target" >"$logs/$target.out" 2>"$logs/$target.err" &
    pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
    if wait "${pids[$i]}"; then
        cat "$logs/${targets[$i]}.out"
    else
        cat "$logs/${targets[$i]}.err" >&2
        echo "build.sh: FAILED to build ${targets[$i]} (output above)" >&2
        failed=1
    fi
done
exit "$failed"
