"""Building a code bundle's wheel from a project directory (`repro code push DIR`): offline,
with the project's own build backend and no pip; a fresh install has the backend the example
needs; a backend that is missing is named, with how to install it."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from service.client.wheel_build import build_wheel
from tests.cli_runner import repro

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "code"


def requirement_name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found is not None, requirement
    return found[0].lower()


def test_a_fresh_install_has_the_build_backend_the_example_needs() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {requirement_name(r): r for r in project["dependencies"]}
    example = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["build-system"]
    for requirement in example["requires"]:
        assert requirement_name(requirement) in base, requirement
    # setuptools builds wheels by itself only from 70.1 (before, it needed `wheel` too).
    assert base["setuptools"].replace(" ", "") == "setuptools>=70.1"


def test_the_same_directory_builds_the_same_wheel_without_pip(tmp_path: Path) -> None:
    # pip unimportable in the build, as in an environment made without it.
    hidden = tmp_path / "hidden" / "pip"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('pip is not installed here')\n")
    script = (
        "import sys; from pathlib import Path; "
        "from service.client.wheel_build import build_wheel; "
        "print(build_wheel(Path(sys.argv[1]), Path(sys.argv[2])))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "hidden"), str(REPO)])}
    digests = []
    for out in (tmp_path / "a", tmp_path / "b"):
        out.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", script, str(EXAMPLE), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        wheel = Path(done.stdout.strip())
        assert wheel.name == "ring_layers-1.0.0-py3-none-any.whl"
        digests.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert digests[0] == digests[1]  # one digest, so one experiment, per content
    assert sorted(p.name for p in EXAMPLE.iterdir()) == ["pyproject.toml", "spec.yaml", "src"]


def hatch_project(root: Path) -> Path:
    project = root / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling>=1.20"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "pkg"\nversion = "1.0"\n'
    )
    return project


def test_a_missing_build_backend_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModuleNotFoundError):  # the backend this project names is not here
        __import__("hatchling")
    project = hatch_project(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    reason = r"needs hatchling>=1\.20 .*pip install 'hatchling>=1\.20'"
    with pytest.raises(ValueError, match=reason):
        build_wheel(project, out)


def test_the_cli_says_what_is_missing_and_stores_nothing(tmp_path: Path) -> None:
    # No server listens there: the build fails before anything is sent.
    project = hatch_project(tmp_path)
    done = repro("code", "push", str(project), "--api", "http://127.0.0.1:9", "--token", "t")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "needs hatchling>=1.20" in done.stderr and "pip install" in done.stderr
    assert "Traceback" not in done.stderr  # a reason, not a build tool's stack
    assert done.stdout == ""
