"""The embedded server's admin token, as `repro serve` keeps it on its own machine: what the
CLI and `Client()` use when no token is given and the API is on this machine."""

from __future__ import annotations

import os
from pathlib import Path

from .http import is_this_machine

ADMIN_TOKEN_FILE = "admin-token"


def data_dir() -> Path:
    """The embedded server's data directory: REPRO_DATA_DIR, else ~/.reprotrain."""
    return Path(os.environ.get("REPRO_DATA_DIR") or Path.home() / ".reprotrain")


def admin_token_path() -> Path:
    return data_dir() / ADMIN_TOKEN_FILE


def local_admin_token(url: str) -> str | None:
    """The local admin token, for an API on this machine only (it never leaves it)."""
    if not is_this_machine(url):
        return None
    try:
        return admin_token_path().read_text().strip() or None
    except OSError:
        return None
