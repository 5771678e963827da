#!/usr/bin/env bash
# Debian's Chromium, for the dashboard's browser tests (tests/e2e/test_dashboard_browser.py).
#
# Idempotent: installs the `chromium` package when /usr/bin/chromium is missing. The tests
# drive it through the `playwright` Python package (in the `test` extra) and its
# `executable_path`; playwright's own browser download is never used. Not root: installs nothing, and the browser tests skip
# (and so fail under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "browser-deps: $*"; }

if [[ ! -x /usr/bin/chromium ]]; then
    if [[ "$(id -u)" -ne 0 ]]; then
        say "not root and /usr/bin/chromium is missing; the browser tests will skip"
        exit 0
    fi
    say "installing chromium"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
fi
say "$(/usr/bin/chromium --version 2>/dev/null || echo 'chromium present')"

say "ready"
