"""Running the `repro` command line in a subprocess, as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.jobs import job_env


def repro(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`repro ARGS` run in `cwd` with the test jobs' environment; never raises on failure."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=cwd,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
