"""Building a wheel of a project directory for `repro code push DIR`, offline.

The project's own build backend (PEP 517: `[build-system]` in its pyproject.toml) is called
directly in a child process of this interpreter: no pip, no build isolation, no network, so
the backend must already be installed here. A fresh install of this project has setuptools
(a base dependency), which builds wheels by itself; another backend the project names
(hatchling, flit-core, ...) is refused up front, naming what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

BUILD_SECONDS = 300.0
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip can hold
# PEP 517's defaults for a project without [build-system] (a setup.py project).
DEFAULT_BACKEND = "setuptools.build_meta:__legacy__"
DEFAULT_REQUIRES = ["setuptools>=40.8.0"]
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")

# Run in the child: import the backend named in argv[1] and build into argv[2].
_BUILD = """
import importlib, sys
module, _, attr = sys.argv[1].partition(":")
backend = importlib.import_module(module)
for part in filter(None, attr.split(".")):
    backend = getattr(backend, part)
print(backend.build_wheel(sys.argv[2]))
"""


def _build_system(source: Path) -> tuple[str, list[str], list[str]]:
    """(backend, requires, backend-path) from the project's pyproject.toml, or the defaults."""
    pyproject = source / "pyproject.toml"
    if not pyproject.is_file():
        return DEFAULT_BACKEND, DEFAULT_REQUIRES, []
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("build-system", {})
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{pyproject.name} cannot be read: {exc}") from None
    if not table:
        return DEFAULT_BACKEND, DEFAULT_REQUIRES, []
    requires = [str(r) for r in table.get("requires", DEFAULT_REQUIRES)]
    backend = str(table.get("build-backend", DEFAULT_BACKEND))
    return backend, requires, [str(p) for p in table.get("backend-path", [])]


def _missing(requires: list[str]) -> list[str]:
    """The requirements whose distribution is not installed in this environment."""
    missing = []
    for requirement in requires:
        if ";" in requirement:  # an environment marker: left to the backend to need or not
            continue
        found = _REQUIREMENT_NAME.match(requirement)
        if found is None:
            continue
        try:
            metadata.distribution(found[1])
        except metadata.PackageNotFoundError:
            missing.append(requirement)
    return missing


def build_wheel(project: Path, out_dir: Path) -> Path:
    """A wheel of the project directory, built offline in `out_dir` by the project's build
    backend; ValueError naming what is missing, or with the backend's reason if it fails."""
    # A copy, so the build leaves nothing (build/, *.egg-info) in the user's project.
    source = out_dir / "project"
    shutil.copytree(project, source, ignore=shutil.ignore_patterns("build", "*.egg-info", ".*"))
    backend, requires, backend_path = _build_system(source)
    missing = _missing(requires)
    if missing:
        quoted = " ".join(f"'{r}'" for r in missing)
        raise ValueError(
            f"building a wheel of {project} needs {', '.join(missing)} (its build-system "
            f"requires), which this Python environment ({sys.executable}) lacks: install it "
            f"(pip install {quoted}), or build the wheel yourself and push the .whl"
        )
    wheel_dir = out_dir / "dist"
    wheel_dir.mkdir()
    # No index: a backend that would fetch anything at build time fails instead. A fixed
    # timestamp in the zip: the same files build the same wheel, so the same digest.
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    env.setdefault("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)
    paths = [str(source / p) for p in backend_path] + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cmd = [sys.executable, "-c", _BUILD, backend, str(wheel_dir)]
    try:
        done = subprocess.run(
            cmd, cwd=source, env=env, capture_output=True, text=True, timeout=BUILD_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"building a wheel of {project} took over {BUILD_SECONDS:.0f} s") from None
    wheels = sorted(wheel_dir.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        reason = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise ValueError(f"building a wheel of {project} with {backend} failed:\n{reason}")
    return wheels[0]
