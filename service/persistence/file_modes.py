"""Owner-only files and directories for what the server keeps on disk.

The database, its WAL, artifacts and tokens are readable by their owner alone: files 0600
in directories 0700. Modes are set explicitly after creation, so a permissive umask (or a
directory made earlier by something else) does not widen them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can enter, created with its parents if needed.

    An existing directory of ours is tightened too, unless it is a shared sticky one (/tmp).
    """
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """`path` as an owner-only file, created empty if it does not exist (never truncated)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def open_private(path: Path) -> int:
    """A new owner-only file opened for writing (truncated if it exists): its descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def tighten_existing(path: Path) -> None:
    """Make an existing file owner-only (nothing happens if it does not exist)."""
    with contextlib.suppress(FileNotFoundError):
        _tighten(path, FILE_MODE)


def _tighten(path: Path, mode: int) -> None:
    # Only our own files, and never a shared sticky directory such as /tmp.
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & stat.S_ISVTX:
        return
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode)
