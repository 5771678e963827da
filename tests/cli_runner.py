"""Running the `repro` command line in a subprocess, as a user would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.integration.jobs import job_env


def repro_command(*args: str) -> list[str]:
    """The argv of `repro ARGS` with this interpreter, so the checkout under test runs."""
    return [sys.executable, "-m", "service.cli", *args]


def repro(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`repro ARGS` run to its end with the test jobs' environment, `env` laid over it, and
    `input` on its stdin (none: the test's own).

    Never raises on a failing exit: callers assert on `returncode` and the captured output.
    """
    return subprocess.run(
        repro_command(*args),
        cwd=cwd,
        env={**job_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=input,
    )
