"""Fail an image build whose project wheel lacks a file of the source tree.

setuptools puts only the files `package-data` names next to the Python modules, so a new
template or static asset that pyproject.toml does not list would silently be missing from
the image while an editable install (every developer's) still has it.

    wheel_check.py SRC WHEEL_DIR PACKAGE... [NAME=DIR...]

NAME=DIR is a package installed under another name than its directory (pyproject.toml's
`package-dir`): the files of SRC/DIR are expected under NAME/ in the wheel, not under DIR/.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

_SKIP_PARTS = {"__pycache__"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


def missing_files(src: Path, wheel: Path, packages: list[str]) -> list[str]:
    """Files under src/<package> (or src/DIR for NAME=DIR) that the wheel does not contain,
    as paths relative to src."""
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    renamed = dict(p.split("=", 1)[::-1] for p in packages if "=" in p)  # DIR -> NAME
    missing = []
    for package in packages:
        directory = package.split("=", 1)[-1]
        for path in sorted((src / directory).rglob("*")):
            if not path.is_file() or _SKIP_PARTS & set(path.parts):
                continue
            if path.suffix in _SKIP_SUFFIXES:
                continue
            rel = path.relative_to(src).as_posix()
            owner = next((d for d in renamed if rel.startswith(d + "/")), None)
            if owner is not None and owner != directory:
                continue  # checked under its installed name
            expected = renamed[owner] + rel[len(owner) :] if owner is not None else rel
            if expected not in shipped:
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
