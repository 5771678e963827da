"""Debian's Chromium for the browser tests, driven by playwright through `executable_path`
(playwright's own browser download is never used)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def playwright_or_skip() -> Any:
    """`playwright.sync_api`; skips the calling test module where Chromium or playwright is
    missing (under CI a skip fails the run)."""
    if not CHROMIUM.exists():
        pytest.skip(
            "Debian's chromium is not installed (.ci/browser-deps.sh)", allow_module_level=True
        )
    return pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (.ci/browser-deps.sh)"
    )
