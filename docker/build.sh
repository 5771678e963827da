#!/usr/bin/env bash
# Build Reprotrain's images from docker/ (the build context is the repository root).
#
#     docker/build.sh --base IMAGE [api] [cpu] [gpu] [postgres] [s3] [proxy] (default: api cpu)
#     docker/build.sh user --requirements FILE [--from IMAGE] [--tag NAME:TAG]
#
#   api       reprotrain-api:VERSION         the API server, no TensorFlow
#   cpu       reprotrain-worker-cpu:VERSION  worker + tensorflow-cpu
#   gpu       reprotrain-worker-gpu:VERSION  worker + tensorflow and the CUDA 12.5 / cuDNN 9.3 wheels
#   postgres  reprotrain-postgres:15         Debian's PostgreSQL 15 (for the compose stack)
#   s3        reprotrain-s3:4.48             SeaweedFS's S3-compatible store (for the compose stack)
#   proxy     reprotrain-proxy:2.6           HAProxy in front of the API replicas (compose stack)
#   user      reprotrain-worker-user:LOCK    a derived worker image (docker/user.Dockerfile):
#             --from IMAGE (default reprotrain-worker-cpu:VERSION) plus the packages of FILE,
#             a hashed lock installed with pip --require-hashes --no-deps; tagged with the
#             first 12 hex digits of FILE's SHA-256 unless --tag names it. Needs no --base.
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
requirements="" from_image="" user_tag=""
targets=()
while (($#)); do
    case "$1" in
        --base) base="$2"; shift 2 ;;
        --base=*) base="${1#--base=}"; shift ;;
        --requirements) requirements="$2"; shift 2 ;;
        --from) from_image="$2"; shift 2 ;;
        --tag) user_tag="$2"; shift 2 ;;
        -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
        api | cpu | gpu | postgres | s3 | proxy | user) targets+=("$1"); shift ;;
        *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
((${#targets[@]})) || targets=(api cpu)
if [[ " ${targets[*]} " == *" user "* && ! -s "$requirements" ]]; then
    echo "build.sh: user needs --requirements FILE, a hashed lock (see docker/user.Dockerfile)" >&2
    exit 2
fi
if [[ -z "$base" && " ${targets[*]} " != " user " ]]; then
    echo "build.sh: name the Debian bookworm base image with --base (or REPRO_BASE_IMAGE)" >&2
    exit 2
fi

version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
revision_dirty=unknown
if [[ "$revision" != unknown ]]; then
    # Uncommitted changes reach the image (the context is the work tree): say so.
    if [[ -n "$(git status --porcelain 2>/dev/null)" ]]; then revision_dirty=true; else revision_dirty=false; fi
fi
# The OCI source label, only for a repository URL (REPRO_SOURCE_URL, else the origin remote);
# a local path or no remote leaves it out.
source_url="$(bash docker/source_url.sh ${REPRO_SOURCE_URL:+"$REPRO_SOURCE_URL"})"
source_label=()
[[ -n "$source_url" ]] && source_label=(--label "org.opencontainers.image.source=$source_url")
base_digest=""
if [[ -n "$base" ]]; then
    if ! "$DOCKER" image inspect "$base" >/dev/null 2>&1; then
        "$DOCKER" pull "$base" >/dev/null
    fi
    # A registry image is known by its digest; a local one (imported, built) only by its ID.
    base_digest="$("$DOCKER" image inspect --format '{{if .RepoDigests}}{{index .RepoDigests 0}}{{else}}{{.Id}}{{end}}' "$base")"
fi
ca="${REPRO_BUILD_CA-/etc/ssl/certs/ca-certificates.crt}"
secret=()
[[ -n "$ca" && -s "$ca" ]] && secret=(--secret "id=ca,src=$ca")

build() {
    local tag="$1" file="$2"
    shift 2
    DOCKER_BUILDKIT=1 "$DOCKER" build --quiet --file "$file" --tag "$tag" \
        --build-arg "BASE_IMAGE=$base" --build-arg "BASE_DIGEST=$base_digest" \
        --build-arg "REVISION=$revision" --build-arg "REVISION_DIRTY=$revision_dirty" \
        --build-arg "VERSION=$version" "${source_label[@]}" "${secret[@]}" "$@" . >/dev/null
    echo "${tag%%:*} ${tag##*:} $("$DOCKER" image inspect --format '{{.Id}}' "$tag")"
}

# The derived image: its context is a directory holding only the lock, and it must sit on
# top of the worker image it names (every layer of that image, in order), or it is refused.
build_user() {
    local from="${from_image:-reprotrain-worker-cpu:$version}" from_id lock_digest tag context
    if ! from_id="$("$DOCKER" image inspect --format '{{.Id}}' "$from" 2>/dev/null)"; then
        echo "build.sh: the worker image $from is not on this engine: build it first" >&2
        return 1
    fi
    lock_digest="sha256:$(sha256sum "$requirements" | cut -d ' ' -f 1)"
    tag="${user_tag:-reprotrain-worker-user:${lock_digest:7:12}}"
    context="$(mktemp -d)"
    cp "$requirements" "$context/requirements.txt"
    cp docker/user.Dockerfile "$context/Dockerfile"
    if ! DOCKER_BUILDKIT=1 "$DOCKER" build --quiet --tag "$tag" \
        --build-arg "WORKER_IMAGE=$from" --build-arg "WORKER_REFERENCE=$from" \
        --build-arg "WORKER_ID=$from_id" --build-arg "LOCK_DIGEST=$lock_digest" \
        "${secret[@]}" "$context" >/dev/null; then
        rm -rf "$context"
        return 1
    fi
    rm -rf "$context"
    local layers_from layers_tag
    layers_from="$("$DOCKER" image inspect --format '{{join .RootFS.Layers ","}}' "$from_id")"
    layers_tag="$("$DOCKER" image inspect --format '{{join .RootFS.Layers ","}}' "$tag")"
    if [[ "$layers_tag" != "$layers_from,"* ]]; then
        echo "build.sh: $tag is not built on $from ($from_id): it changed during the build" >&2
        "$DOCKER" image rm "$tag" >/dev/null 2>&1 || true
        return 1
    fi
    echo "${tag%%:*} ${tag##*:} $("$DOCKER" image inspect --format '{{.Id}}' "$tag")"
}

build_target() {
    case "$1" in
        api) build "reprotrain-api:$version" docker/Dockerfile --target api --build-arg LOCK=api ;;
        cpu) build "reprotrain-worker-cpu:$version" docker/Dockerfile --target worker --build-arg LOCK=cpu ;;
        gpu) build "reprotrain-worker-gpu:$version" docker/Dockerfile --target worker --build-arg LOCK=gpu ;;
        postgres) build "reprotrain-postgres:15" docker/postgres.Dockerfile ;;
        s3) build "reprotrain-s3:4.48" docker/s3.Dockerfile ;;
        proxy) build "reprotrain-proxy:2.6" docker/proxy.Dockerfile ;;
    esac
}

# Concurrently: the builds mostly wait on downloads, and BuildKit shares their common
# stages. Each one's output is kept apart and shown in order.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
# A derived image is built last, on the worker image this run may have just rebuilt.
derive=0
if [[ " ${targets[*]} " == *" user "* ]]; then
    derive=1
    mapfile -t targets < <(printf '%s\n' "${targets[@]}" | grep -vx user || true)
fi
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
if ((derive && !failed)); then
    build_user || { echo "build.sh: FAILED to build user (output above)" >&2; failed=1; }
fi
exit "$failed"
