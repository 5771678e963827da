"""A training script's directory as a code bundle, for `repro run train.py`.

The directory's files go into a wheel as they are, with one entry point in the group
`reprotrain.scripts` naming the file that runs. The wheel is built byte for byte the same
from the same files on any machine (sorted members, fixed times and modes, stored without
compression), so the same directory always has the same digest, and a run of it the same
spec hash. Left out: hidden files and directories (`.git`, `.venv`, ...), `__pycache__`
and compiled `*.pyc`, and the local run records in `reprotrain-runs/`. Symbolic links are
refused: a run must not depend on what lies outside its directory.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

SCRIPT_GROUP = "reprotrain.scripts"
DIST_NAME = "reprotrain_script"
DIST_VERSION = "0"
WHEEL_NAME = f"{DIST_NAME}-{DIST_VERSION}-py3-none-any.whl"
MAX_FILES = 2000  # the server's default bound on a bundle's files (REPRO_MAX_CODE_BUNDLE_FILES)
MAX_BYTES = 256 * 1024**2  # and on their total size
_SKIPPED_DIRS = {"__pycache__", "reprotrain-runs"}
_DATE = (1980, 1, 1, 0, 0, 0)


class ScriptDirectoryError(ValueError):
    """The directory cannot be shipped as a script's directory (the message says why)."""


def _files(directory: Path) -> Iterator[tuple[str, Path]]:
    """(path in the bundle, file) for every file shipped, in a stable order."""
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
        here = Path(root)
        for d in dirs:
            if (here / d).is_symlink():
                raise ScriptDirectoryError(f"{here / d} is a symbolic link: copy what it holds")
        for name in sorted(names):
            if name.startswith(".") or name.endswith(".pyc"):
                continue
            path = here / name
            if path.is_symlink():
                raise ScriptDirectoryError(f"{path} is a symbolic link: copy what it holds")
            yield path.relative_to(directory).as_posix(), path


def script_entry(script: Path, directory: Path | None = None) -> tuple[Path, str]:
    """(the directory shipped, the script's path inside it) for `repro run SCRIPT`."""
    script = script.resolve()
    if not script.is_file() or script.suffix != ".py":
        raise ScriptDirectoryError(f"{script} is not a Python script (a .py file)")
    base = (directory or script.parent).resolve()
    if not base.is_dir():
        raise ScriptDirectoryError(f"{base} is not a directory")
    try:
        entry = script.relative_to(base).as_posix()
    except ValueError:
        raise ScriptDirectoryError(f"{script} is not inside {base}") from None
    if any(part.startswith(".") or part in _SKIPPED_DIRS for part in entry.split("/")[:-1]):
        raise ScriptDirectoryError(f"{entry} lies in a directory that is not shipped")
    return base, entry


def build_script_wheel(directory: Path, entry: str, out_dir: Path) -> Path:
    """The wheel of `directory` whose script is `entry`; ScriptDirectoryError when the
    directory holds too much or something that cannot be shipped."""
    files = list(_files(directory))
    if entry not in {p for p, _ in files}:
        raise ScriptDirectoryError(f"{entry} is not a file shipped from {directory}")
    if len(files) > MAX_FILES:
        raise ScriptDirectoryError(
            f"{directory} holds {len(files)} files, more than {MAX_FILES}: name a smaller "
            "directory (--dir), or move data out of it"
        )
    total = sum(path.stat().st_size for _, path in files)
    if total > MAX_BYTES:
        raise ScriptDirectoryError(
            f"{directory} holds {total} bytes, more than {MAX_BYTES}: name a smaller "
            "directory (--dir), or move data out of it"
        )
    dist_info = f"{DIST_NAME}-{DIST_VERSION}.dist-info"
    meta = {
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {DIST_VERSION}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: reprotrain\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist_info}/entry_points.txt": f"[{SCRIPT_GROUP}]\nmain = {entry}\n".encode(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / WHEEL_NAME
    record: list[list[str]] = []
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as zf:
        members = [(name, path.read_bytes()) for name, path in files] + list(meta.items())
        for name, data in members:
            _write(zf, name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append([name, f"sha256={digest.decode()}", str(len(data))])
        record.append([f"{dist_info}/RECORD", "", ""])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(record)
        _write(zf, f"{dist_info}/RECORD", text.getvalue().encode())
    return wheel


def _write(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_DATE)
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever the machine: the same bytes everywhere
    zf.writestr(info, data)
