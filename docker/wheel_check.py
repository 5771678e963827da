"""Fail an image build whose project wheel lacks a file of the source tree.

setuptools puts only the files `package-data` names next to the Python modules, so a new
template or static asset that pyproject.toml does not list would silently be missing from
the image while an editable install (every developer's) still has it.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

_SKIP_PARTS = {"__pycache__"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


def missing_files(src: Path, wheel: Path, packages: list[str]) -> list[str]:
    """Files under src/<package> that the wheel does not contain, as relative paths."""
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    missing = []
    for package in packages:
        for path in sorted((src / package).rglob("*")):
            if not path.is_file() or _SKIP_PARTS & set(path.parts):
                continue
            if path.suffix in _SKIP_SUFFIXES:
                continue
            rel = path.relative_to(src).as_posix()
            if rel not in shipped:
                missing.append(rel)
    return missing


def main(argv: list[str]) -> int:
    src, wheel_dir, *packages = argv
    (wheel,) = Path(wheel_dir).glob("*.whl")
    missing = missing_files(Path(src), wheel, packages)
    for rel in missing:
        print(
            f"wheel_check: {rel} is not in {wheel.name}: add it to "
            "[tool.setuptools.package-data] in pyproject.toml",
            file=sys.stderr,
        )
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
