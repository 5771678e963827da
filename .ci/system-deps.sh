#!/usr/bin/env bash
# System packages the test suite needs, installed before any Python package.
#
# The PostgreSQL tests start a private server of their own in a temporary directory
# (tests/postgres.py), so all they need are the server binaries and, when run as root, the
# `postgres` OS user to run them as. The distribution's own service must stay off: nothing
# may depend on it, and a machine-wide server would hide a test that forgot its fixture.
# The same holds for HAProxy, which the tests of several API replicas start in front of
# them with the compose stack's own configuration (tests/api_proxy.py).
# Idempotent: a machine that already has the binaries is left alone.
set -euo pipefail

say() { echo "system-deps: $*"; }

find_initdb() {
    local found
    # Newest major version last; an unmatched glob stays literal and fails -x.
    for found in /usr/lib/postgresql/*/bin/initdb; do
        if [[ -x "$found" ]]; then echo "$found"; fi
    done | sort -V | tail -n 1
}

user_note=""
ensure_postgres_user() {
    if id -u postgres >/dev/null 2>&1; then return 0; fi
    # The package normally creates it; binaries from elsewhere may come without one.
    useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
    user_note="; created the postgres user"
}

initdb="$(find_initdb)"
missing=()
[[ -n "$initdb" ]] || missing+=(postgresql)
command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)

if [[ "$(id -u)" -ne 0 ]]; then
    if ((${#missing[@]} == 0)); then
        say "PostgreSQL server ($(dirname "$initdb")) and HAProxy present; not root, nothing to do"
    else
        say "not root, so not installing the Debian packages: ${missing[*]};" \
            "the tests that need them will skip (and fail under CI=true)"
    fi
    exit 0
fi

if ((${#missing[@]} == 0)); then
    ensure_postgres_user
    say "PostgreSQL server ($(dirname "$initdb")) and HAProxy already present$user_note"
    exit 0
fi

log="$(mktemp)"
created_policy=""
cleanup() {
    rm -f "$log"
    [[ -z "$created_policy" ]] || rm -f /usr/sbin/policy-rc.d
}
trap cleanup EXIT

# invoke-rc.d asks policy-rc.d before starting a service; 101 means "not allowed", so the
# package's postinst installs the server without starting it.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    created_policy=1
fi

if ! {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
} >"$log" 2>&1; then
    cat "$log" >&2
    say "FAILED to install the Debian packages ${missing[*]} (apt output above)" >&2
    exit 1
fi

# Belt and braces for init systems that ignore policy-rc.d; also undo systemd's enable so
# a reboot does not bring the service up either.
for unit in postgresql haproxy; do
    if command -v service >/dev/null 2>&1; then
        service "$unit" stop >/dev/null 2>&1 || true
    fi
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        systemctl disable --now "$unit" >/dev/null 2>&1 || true
    fi
done

initdb="$(find_initdb)"
if [[ -z "$initdb" ]]; then
    cat "$log" >&2
    say "FAILED: installed 'postgresql' but found no /usr/lib/postgresql/*/bin/initdb" >&2
    exit 1
fi
ensure_postgres_user
say "installed the Debian packages ${missing[*]} (PostgreSQL in $(dirname "$initdb"));" \
    "system services not started$user_note"
