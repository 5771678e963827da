#!/usr/bin/env bash
# The compose stack's commands, with its settings kept in one file (deploy/compose/.env):
#
#     deploy/compose/stack.sh up [--gpu]        the first time, writes .env: a generated
#                                               database password, the Docker socket's group,
#                                               the compose files (--gpu adds compose.gpu.yaml)
#                                               and the project name; makes the workspace;
#                                               then starts the stack (`up -d`)
#     deploy/compose/stack.sh admin-token       prints the admin token the API created
#     deploy/compose/stack.sh down [--volumes]  stops the stack; --volumes also deletes its
#                                               volumes (database, artifacts, tokens) and
#                                               empties the host workspace
#     deploy/compose/stack.sh ARGS...           any other compose command: ps, logs, exec -T
#
# .env is written once and never overwritten: the database volume keeps the password it was
# created with, and a new one would lock the API out ("password authentication failed").
# Any other setting of compose.yaml (REPRO_API_PORT, REPRO_WORKSPACE, the images) can be added
# to it by hand. REPRO_COMPOSE_ENV_FILE names another file. Runs the `docker compose` plugin
# when the docker CLI has it, else docker-compose v1 (REPRO_COMPOSE picks one), and needs no
# terminal: exec is always -T.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
env_file="$(realpath -m "${REPRO_COMPOSE_ENV_FILE:-$here/.env}")"
say() { echo "stack.sh: $*" >&2; }

compose_cli() {
    if [[ -n "${REPRO_COMPOSE:-}" ]]; then
        read -r -a compose <<<"$REPRO_COMPOSE"
    elif docker compose version >/dev/null 2>&1; then
        compose=(docker compose)
    elif command -v docker-compose >/dev/null 2>&1; then
        compose=(docker-compose)
    else
        say "neither the docker compose plugin nor docker-compose is installed"
        exit 2
    fi
}

# The value of KEY in the env file (the last one, as compose reads it), or nothing.
setting() { [[ -f "$env_file" ]] && sed -n "s/^$1=//p" "$env_file" | tail -n 1 || true; }

write_env_once() {
    local gpu="$1" files="compose.yaml" gid=0
    [[ "$gpu" == 1 ]] && files="compose.yaml:compose.gpu.yaml"
    [[ -S /var/run/docker.sock ]] && gid="$(stat -c %g /var/run/docker.sock)"
    if [[ ! -f "$env_file" ]]; then
        (umask 077 && : >"$env_file")
        say "wrote $env_file: keep it, it holds the database password and the store's key"
    fi
    chmod 600 "$env_file"  # owner-only, also when the operator wrote it first
    # Only what is missing is added; nothing already there is changed.
    (
        umask 077
        if [[ -z "$(setting REPRO_POSTGRES_PASSWORD)" ]]; then
            # Letters and digits only: it goes into a URL. An exported one (a stack made by
            # hand before) is kept rather than replaced.
            echo "REPRO_POSTGRES_PASSWORD=${REPRO_POSTGRES_PASSWORD:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}"
        fi
        # The object store's secret key, between the API and the store only.
        [[ -n "$(setting REPRO_S3_SECRET_KEY)" ]] ||
            echo "REPRO_S3_SECRET_KEY=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
        [[ -n "$(setting REPRO_DOCKER_GID)" ]] || echo "REPRO_DOCKER_GID=$gid"
        [[ -n "$(setting COMPOSE_FILE)" ]] || echo "COMPOSE_FILE=$files"
        [[ -n "$(setting COMPOSE_PROJECT_NAME)" ]] || echo "COMPOSE_PROJECT_NAME=reprotrain"
    ) >>"$env_file"
    if [[ "$gpu" == 1 && "$(setting COMPOSE_FILE)" != *compose.gpu.yaml* ]]; then
        say "$env_file names $(setting COMPOSE_FILE): add compose.gpu.yaml to COMPOSE_FILE there"
        exit 2
    fi
}

# An exported password wins over .env in compose: refuse one that is not the volume's.
check_password() {
    local kept
    kept="$(setting REPRO_POSTGRES_PASSWORD)"
    if [[ -n "${REPRO_POSTGRES_PASSWORD:-}" && -n "$kept" && "$REPRO_POSTGRES_PASSWORD" != "$kept" ]]; then
        say "REPRO_POSTGRES_PASSWORD in your environment is not the one in $env_file, which" \
            "the database was created with: unset it (the stack reads $env_file)"
        exit 2
    fi
}

run_compose() {
    local project files file args=()
    project="$(setting COMPOSE_PROJECT_NAME)"
    files="$(setting COMPOSE_FILE)"
    [[ -n "$project" ]] && args+=(-p "$project")
    IFS=: read -r -a file_list <<<"${files:-compose.yaml}"
    for file in "${file_list[@]}"; do
        [[ "$file" == /* ]] || file="$here/$file"
        args+=(-f "$file")
    done
    (cd "$here" && "${compose[@]}" --env-file "$env_file" --project-directory "$here" \
        "${args[@]}" "$@")
}

make_workspace() {
    local workspace
    workspace="$(setting REPRO_WORKSPACE)"
    workspace="${workspace:-/var/lib/reprotrain/workspace}"
    [[ -d "$workspace" ]] && return 0
    if [[ "$(id -u)" -eq 0 ]]; then
        install -d -o 10001 -g 10001 "$workspace"
    else
        say "create the workspace first: sudo install -d -o 10001 -g 10001 $workspace"
        exit 2
    fi
}

# The job containers the worker started write into the workspace as other users: empty it
# from a container of the worker image, as root there, whoever runs this script.
empty_workspace() {
    local workspace
    workspace="$(setting REPRO_WORKSPACE)"
    workspace="${workspace:-/var/lib/reprotrain/workspace}"
    [[ -d "$workspace" ]] || return 0
    run_compose run --rm --no-deps -T --user 0 --entrypoint /bin/sh worker \
        -c 'find "$REPRO_WORKSPACE" -mindepth 1 -delete'
}

compose_cli
case "${1:-}" in
    up)
        gpu=0
        [[ "${2:-}" == --gpu ]] && gpu=1
        write_env_once "$gpu"
        check_password
        make_workspace
        run_compose up -d
        ;;
    admin-token)
        check_password
        run_compose exec -T api-1 cat /var/lib/reprotrain/admin-token
        ;;
    down)
        check_password
        if [[ "${2:-}" == --volumes ]]; then
            # The worker first: a running agent marks the workspace as it idles, so emptying
            # it under a live worker can leave a file behind.
            run_compose stop worker
            empty_workspace
            run_compose down -v --remove-orphans
        else
            run_compose down --remove-orphans
        fi
        ;;
    "" | -h | --help)
        sed -n '2,20p' "$0"
        ;;
    *)
        check_password
        [[ -f "$env_file" ]] || { say "no $env_file yet: run '$0 up' first"; exit 2; }
        run_compose "$@"
        ;;
esac
