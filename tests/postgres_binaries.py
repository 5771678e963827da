"""Finding the PostgreSQL server binaries, and saying why a test server cannot start here.

Used by the test server helper and by anything that only needs to know where the binaries
are or whether PostgreSQL is usable on this machine.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from pathlib import Path

SERVER_USER = "postgres"
MISSING_BINARIES = "PostgreSQL server binaries not found (install the Debian package 'postgresql')"


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _major_key(path: Path) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in path.name.split("."))
    except ValueError:
        return (-1,)


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


@functools.cache
def find_bindir() -> Path | None:
    """The directory holding initdb/pg_ctl/postgres, newest Debian major version first."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*"), key=_major_key, reverse=True)
    bindirs = [major / "bin" for major in candidates]
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                bindirs.append(Path(out))
    initdb = shutil.which("initdb")
    if initdb is not None:
        bindirs.append(Path(initdb).resolve().parent)
    return next((bindir for bindir in bindirs if _has_server_binaries(bindir)), None)


def postgres_unavailable_reason() -> str | None:
    """Why a test server cannot be started here, or None if it can."""
    if find_bindir() is None:
        return MISSING_BINARIES
    if running_as_root():
        # initdb and pg_ctl refuse to run as root, so root has to hand them to this user.
        import pwd

        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return (
                f"running as root, but there is no {SERVER_USER!r} OS user to run the "
                "PostgreSQL server as (install the Debian package 'postgresql', which "
                "creates it)"
            )
        if shutil.which("runuser") is None:
            return "running as root, but 'runuser' (util-linux) is not installed"
    return None
