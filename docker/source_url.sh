#!/usr/bin/env bash
# The repository URL for an image's org.opencontainers.image.source label, on stdout:
#
#     docker/source_url.sh [URL]      (default: this checkout's `origin` remote)
#
# Prints an https URL anyone can fetch the source from, or nothing: a local path (a clone of
# a clone), a file:// URL or no remote leaves the label out rather than name a path on the
# build machine. An ssh remote (git@host:org/repo.git) becomes its https form; a URL with
# credentials in it (https://user:token@host/...) is never printed, since labels are public.
set -euo pipefail
url="${1-$(git remote get-url origin 2>/dev/null || true)}"
case "$url" in
    git@*:*) rest="${url#git@}"; url="https://${rest/://}" ;;
    ssh://git@*) url="https://${url#ssh://git@}" ;;
esac
if [[ "$url" =~ ^https?://[A-Za-z0-9.-]+(:[0-9]+)?/[^[:space:]@]+$ ]]; then
    printf '%s\n' "$url"
fi
