#!/usr/bin/env bash
# The README's screenshots, taken again from the current pages: the browser walk of the
# dashboard (tests/e2e/test_dashboard_browser.py) trains its runs against `repro serve` and
# writes them here when REPRO_WRITE_SCREENSHOTS=1. Needs Debian's chromium (.ci/browser-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPRO_WRITE_SCREENSHOTS=1 .venv/bin/python -m pytest -q -n 0 -p no:randomly \
  tests/e2e/test_dashboard_browser.py
git status --short examples/screenshots
