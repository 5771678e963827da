"""Whether a worker agent is still making progress, for a container liveness probe.

The agent touches a file in its work directory each time round its claim loop and each
time its heartbeat thread wakes during a job; the probe (`python -m worker.node.liveness
WORK_DIR MAX_AGE`) fails once that file is older than MAX_AGE seconds. An API outage does
not fail it: the agent keeps trying, and a restart would not bring the API back.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

ALIVE_FILE = ".alive"


def mark_alive(work_dir: Path) -> None:
    """Record that the agent is making progress now (never fails the caller)."""
    with contextlib.suppress(OSError):
        (work_dir / ALIVE_FILE).touch()


def is_alive(work_dir: Path, max_age: float) -> bool:
    """Whether the agent marked progress within `max_age` seconds."""
    try:
        return time.time() - (work_dir / ALIVE_FILE).stat().st_mtime <= max_age
    except OSError:
        return False


def main(argv: list[str]) -> int:
    """Exit 0 if the agent using work directory argv[0] was alive within argv[1] seconds."""
    return 0 if is_alive(Path(argv[0]), float(argv[1])) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
