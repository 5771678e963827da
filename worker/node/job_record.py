"""What an agent keeps about a started job outside its workspace, so that the next agent on
the same work directory can adopt the job if this one dies while the job runs on.

The record sits beside the attempt directory (`runs/<run>/attempt-<n>.json`), never in
it: a job can write anything in its workspace, but not this. It is written before the job
starts and removed once the job has ended and been closed, so a record left behind names a
job whose report was never made.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from worker.node.client import Id
from worker.record.durable import replace_durably


@dataclass(frozen=True)
class JobRecord:
    """The claim a job runs for, as far as following it and reporting its end need."""

    run_id: Id
    attempt: int
    worker_id: Id
    limits: dict[str, Any] = field(default_factory=dict)  # the claim's (the file bounds)
    export_model: bool = False  # whether the job was asked to export its final model

    def claim(self) -> dict[str, Any]:
        """The parts of the original claim a ClaimedRun reads to follow and report the job."""
        return {"run": {"id": self.run_id, "attempt": self.attempt}, "limits": self.limits}


def record_path(attempt_dir: Path) -> Path:
    """Where the record of the job working in `attempt_dir` is kept."""
    return attempt_dir.with_name(attempt_dir.name + ".json")


def keep_record(attempt_dir: Path, record: JobRecord) -> None:
    """Store the record, whole or not at all (owner-only)."""
    replace_durably(record_path(attempt_dir), json.dumps(asdict(record)))


def read_record(attempt_dir: Path) -> JobRecord:
    """The record of the job of `attempt_dir`; OSError, or ValueError when it is damaged."""
    data = json.loads(record_path(attempt_dir).read_text(encoding="utf-8"))
    try:
        return JobRecord(
            run_id=data["run_id"],
            attempt=int(data["attempt"]),
            worker_id=data["worker_id"],
            limits=dict(data.get("limits") or {}),
            export_model=bool(data.get("export_model")),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a job record: {exc!r}") from None


def forget_record(attempt_dir: Path) -> None:
    """Remove the record: the job has ended and its report is the agent's to deliver."""
    with contextlib.suppress(OSError):
        record_path(attempt_dir).unlink(missing_ok=True)
