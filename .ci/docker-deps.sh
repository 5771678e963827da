#!/usr/bin/env bash
# The Docker engine and the project's images, for the tests that run containers
# (the Docker executor, the compose stack).
#
# Idempotent: installs docker.io, docker-compose (v1), the `docker compose` plugin (v2) where
# an apt source offers it (Docker's own repository; Debian bookworm's has v1 only, and
# deploy/compose/stack.sh runs either) and debootstrap when missing, starts
# dockerd when no engine answers, makes the Debian base image once (no registry is needed:
# debootstrap + `docker import`), then builds the CPU worker, API, PostgreSQL, S3 and proxy images
# through docker/build.sh (the build cache makes a repeat cheap). Not root: does nothing
# and the Docker tests skip (and fail under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "docker-deps: $*"; }
start=$SECONDS

# Debian's client: the one that builds with BuildKit here (another `docker` earlier on PATH
# may lack buildx).
DOCKER=/usr/bin/docker
BASE_IMAGE="${REPRO_BASE_IMAGE:-reprotrain-base:bookworm}"

if [[ "$(id -u)" -ne 0 ]]; then
    say "not root, so not installing or starting Docker; the Docker tests will skip"
    exit 0
fi

# The plugin, when the docker CLI lacks it and the apt lists have a candidate for it.
plugin_available() {
    ! "$DOCKER" compose version >/dev/null 2>&1 &&
        apt-cache policy docker-compose-plugin 2>/dev/null |
        grep '^  Candidate: [^(]' >/dev/null  # not -q: apt-cache must not get SIGPIPE
}

missing=()
[[ -x /usr/sbin/dockerd ]] || missing+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
plugin_available && missing+=(docker-compose-plugin)
if ((${#missing[@]})); then
    log="$(mktemp)"
    if ! {
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            { [[ " ${missing[*]} " == *" docker-compose-plugin "* ]] || ! plugin_available ||
                missing+=(docker-compose-plugin); } &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                "${missing[@]}"
    } >"$log" 2>&1; then
        cat "$log" >&2
        say "FAILED to install ${missing[*]} (apt output above)" >&2
        exit 1
    fi
    rm -f "$log"
    say "installed ${missing[*]}"
fi
if ! "$DOCKER" compose version >/dev/null 2>&1; then
    say "no apt source here offers the docker compose plugin: docker-compose v1 only"
fi

if ! "$DOCKER" info >/dev/null 2>&1; then
    # A pid file left by a daemon of an earlier boot may name another process now: dockerd
    # would wait on it as its containerd and time out. Only files of processes gone, or no
    # longer docker's, are removed.
    for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile" 2>/dev/null || true)
        comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
        if [[ $comm != dockerd && $comm != containerd ]]; then
            rm -f "$pidfile"
        fi
    done
    # No init system starts services here; the daemon outlives this script on purpose
    # so the tests (and later runs) find it.
    nohup /usr/sbin/dockerd >/var/log/dockerd.log 2>&1 &
    for _ in $(seq 1 60); do
        if "$DOCKER" info >/dev/null 2>&1; then break; fi
        sleep 1
    done
    if ! "$DOCKER" info >/dev/null 2>&1; then
        tail -n 40 /var/log/dockerd.log >&2 || true
        say "FAILED: dockerd did not answer within 60 s (log above)" >&2
        exit 1
    fi
    say "started dockerd"
fi

if ! "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    rootfs="$(mktemp -d)"
    trap 'rm -rf "$rootfs"' EXIT
    log="$(mktemp)"
    if ! debootstrap --variant=minbase bookworm "$rootfs" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        say "FAILED: debootstrap bookworm (log above)" >&2
        exit 1
    fi
    rm -f "$log"
    # Smaller and free of the host's apt lists; the images run apt-get update themselves.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | "$DOCKER" import \
        --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    say "made the base image $BASE_IMAGE with debootstrap ($((SECONDS - start)) s so far)"
fi

bash docker/build.sh --base "$BASE_IMAGE" cpu api postgres s3 proxy
say "done in $((SECONDS - start)) s"
