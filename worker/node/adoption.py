"""Adopting the jobs an agent left when it died: the next agent on the same work directory
follows each to its report instead of throwing the work away.

An executor whose jobs outlive their agent (the docker executor's containers) lists them.
A job is adopted only when it is this worker's job of a run this worker still holds: its
workspace is an attempt directory of this work directory, the record kept beside it
(`job_record`) names this worker, a job that has ended left a readable result document,
and the API renews the lease (taking back one that lapsed, unless another worker claimed
the run since). Anything else is removed as it always was, saying why; the run's next
attempt then resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from worker.node.client import ApiClient, ApiError, Id
from worker.node.executors import JobHandle
from worker.node.job_files import job_file_bounds
from worker.node.job_record import JobRecord, read_record
from worker.node.job_workspace import FileTooLarge, JobWorkspace
from worker.result import JobResult

log = logging.getLogger("reprotrain.agent")
_ATTEMPT_DIR = re.compile(r"attempt-(\d+)")
_FOLLOWED = ("running", "exited")


class NotAdoptable(Exception):
    """This agent does not adopt the job (the message says why)."""


class OrphanedJob(Protocol):
    """A job whose agent is gone."""

    run_id: str  # as the executor labelled it
    workspace: Path | None  # the attempt directory it works in, None if unknown
    state: str  # "running", "exited", or what else the executor says
    ended: bool

    def describe(self) -> str:
        """How the log names it."""
        ...

    def follow(self, result_path: Path) -> JobHandle:
        """The job as a handle of this agent's, from the start of its output."""
        ...

    def remove(self, why: str) -> None:
        """Stop it if it runs and remove it, logging `why`."""
        ...


@runtime_checkable
class AdoptingExecutor(Protocol):
    """An executor whose jobs can outlive their agent."""

    def orphaned_jobs(self) -> Sequence[OrphanedJob]:
        """This host's jobs whose agent is gone, none of them removed (what else such an
        agent left, which no one adopts, may be)."""
        ...


def adoptable(orphan: OrphanedJob, *, work_dir: Path, worker_id: Id) -> JobRecord:
    """The record of the claim `orphan` works for, if this agent (worker `worker_id` on
    `work_dir`) may follow it; NotAdoptable otherwise."""
    if orphan.state not in _FOLLOWED:
        raise NotAdoptable(f"it is {orphan.state}, neither running nor ended")
    workspace = orphan.workspace
    if workspace is None:
        raise NotAdoptable("it has no workspace")
    attempt = _ATTEMPT_DIR.fullmatch(workspace.name)
    runs = work_dir / "runs"
    if attempt is None or workspace.parent.name != orphan.run_id:
        raise NotAdoptable(f"its workspace {workspace} is not an attempt directory of its run")
    if not workspace.is_dir():
        raise NotAdoptable(f"its workspace {workspace} is gone")
    if not (runs.is_dir() and runs.samefile(workspace.parent.parent)):
        raise NotAdoptable(f"its workspace {workspace} is not in this agent's work directory")
    try:
        record = read_record(workspace)
    except (OSError, ValueError) as exc:
        raise NotAdoptable(
            f"there is no readable record of the claim it runs for ({exc})"
        ) from None
    if str(record.run_id) != orphan.run_id or record.attempt != int(attempt.group(1)):
        raise NotAdoptable(f"the record beside {workspace} is of another run or attempt")
    if str(record.worker_id) != str(worker_id):
        raise NotAdoptable(
            f"worker {record.worker_id} started it and this agent is worker {worker_id} (a "
            "worker keeps its identity across restarts under the same --name and token, or "
            "with --enroll)"
        )
    if orphan.ended:
        _check_result(workspace, record)
    return record


def _check_result(workspace: Path, record: JobRecord) -> None:
    """NotAdoptable unless the ended job left a result document to report."""
    try:
        with JobWorkspace(workspace) as opened:
            raw = opened.read_bytes("result.json", max_bytes=job_file_bounds(record.limits).result)
        JobResult.model_validate(json.loads(raw))
    except FileTooLarge:  # reported as a result the API would not take, as usual
        return
    except (OSError, ValueError) as exc:
        raise NotAdoptable(f"it ended without a readable result document ({exc})") from None


def still_held(client: ApiClient, record: JobRecord) -> None:
    """Renew the run's lease for the record's attempt (taking back one that lapsed, unless
    another worker claimed the run since); NotAdoptable when the API says the run is no
    longer this worker's. An API that does not answer is asked again by the heartbeats."""
    try:
        client.heartbeat(record.run_id, record.worker_id, None, attempt=record.attempt)
    except ApiError as exc:
        if exc.retryable:
            log.warning(
                "run %s: the API does not answer (%s); the job is followed, and its lease "
                "renewed once the API answers",
                record.run_id,
                exc,
            )
            return
        raise NotAdoptable(
            f"the run's attempt {record.attempt} is no longer this worker's ({exc}): another "
            "worker claimed the run since, or it was cancelled"
        ) from None
