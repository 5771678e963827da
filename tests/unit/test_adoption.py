"""Which jobs a restarted agent adopts: only its own worker's job of an attempt directory of
its own work directory, with the record kept beside it, and, once the job has ended, a
result document to report. The rest is removed, each for a reason the log gives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from worker.node.adoption import NotAdoptable, adoptable
from worker.node.executors import JobHandle
from worker.node.job_record import JobRecord, keep_record, read_record
from worker.result import JobResult

WORKER = 7


@dataclass
class Orphan:
    run_id: str
    workspace: Path | None
    state: str = "running"

    @property
    def ended(self) -> bool:
        return self.state == "exited"

    def describe(self) -> str:
        return "orphan"

    def follow(self, result_path: Path) -> JobHandle:
        raise AssertionError("not followed here")

    def remove(self, why: str) -> None:
        raise AssertionError("not removed here")


def started(work_dir: Path, run_id: int = 12, attempt: int = 2, worker: int = WORKER) -> Orphan:
    """A job as the agent leaves it once started: its attempt directory and its record."""
    attempt_dir = work_dir / "runs" / str(run_id) / f"attempt-{attempt}"
    attempt_dir.mkdir(parents=True)
    record = JobRecord(run_id=run_id, attempt=attempt, worker_id=worker, export_model=True)
    keep_record(attempt_dir, record)
    return Orphan(str(run_id), attempt_dir)


def refusal(orphan: Orphan, work_dir: Path) -> str:
    with pytest.raises(NotAdoptable) as refused:
        adoptable(orphan, work_dir=work_dir, worker_id=WORKER)
    return str(refused.value)


def test_a_running_job_of_this_worker_is_adopted_with_its_claim(tmp_path: Path) -> None:
    record = adoptable(started(tmp_path), work_dir=tmp_path, worker_id=WORKER)
    assert (record.run_id, record.attempt, record.worker_id, record.export_model) == (
        12,
        2,
        WORKER,
        True,
    )
    assert record.claim()["run"] == {"id": 12, "attempt": 2}


def test_an_ended_job_is_adopted_only_with_a_result_document_to_report(tmp_path: Path) -> None:
    orphan = started(tmp_path)
    orphan.state = "exited"
    assert "without a readable result document" in refusal(orphan, tmp_path)
    assert orphan.workspace is not None
    result = orphan.workspace / "result.json"
    result.write_text("{not json")
    assert "without a readable result document" in refusal(orphan, tmp_path)
    result.write_text(JobResult(status="succeeded").model_dump_json())
    assert adoptable(orphan, work_dir=tmp_path, worker_id=WORKER).attempt == 2


def test_a_result_document_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    orphan = started(tmp_path)
    orphan.state = "exited"
    outside = tmp_path / "elsewhere.json"
    outside.write_text(JobResult(status="succeeded").model_dump_json())
    assert orphan.workspace is not None
    (orphan.workspace / "result.json").symlink_to(outside)
    assert "symbolic link" in refusal(orphan, tmp_path)


def test_another_workers_job_is_not_adopted(tmp_path: Path) -> None:
    # e.g. an agent started without --name: its default name, and so its worker, changes.
    message = refusal(started(tmp_path, worker=WORKER + 1), tmp_path)
    assert f"worker {WORKER + 1} started it and this agent is worker {WORKER}" in message


def test_a_job_of_another_work_directory_or_without_its_workspace_is_not_adopted(
    tmp_path: Path,
) -> None:
    other = started(tmp_path / "other")
    assert "not in this agent's work directory" in refusal(other, tmp_path / "mine")
    gone = started(tmp_path / "mine", run_id=13)
    assert gone.workspace is not None
    gone.workspace.rename(gone.workspace.with_name("moved"))
    assert "is gone" in refusal(gone, tmp_path / "mine")
    assert "no workspace" in refusal(Orphan("14", None), tmp_path / "mine")
    stray = Orphan("15", tmp_path / "mine" / "runs" / "16" / "attempt-1")
    assert "not an attempt directory of its run" in refusal(stray, tmp_path / "mine")


def test_a_job_without_a_readable_record_or_not_running_is_not_adopted(tmp_path: Path) -> None:
    orphan = started(tmp_path)
    assert orphan.workspace is not None
    record = orphan.workspace.with_name("attempt-2.json")
    record.write_text('{"run_id": 12}')
    assert "no readable record" in refusal(orphan, tmp_path)
    record.unlink()
    assert "no readable record" in refusal(orphan, tmp_path)
    keep_record(orphan.workspace, JobRecord(run_id=99, attempt=2, worker_id=WORKER))
    assert "of another run or attempt" in refusal(orphan, tmp_path)
    created = started(tmp_path, run_id=20)
    created.state = "created"  # the agent died between creating and starting it
    assert "it is created, neither running nor ended" in refusal(created, tmp_path)


def test_a_record_survives_a_round_trip(tmp_path: Path) -> None:
    attempt_dir = tmp_path / "runs" / "3" / "attempt-1"
    attempt_dir.mkdir(parents=True)
    kept = JobRecord(run_id="3", attempt=1, worker_id="w", limits={"max_result_bytes": 10})
    keep_record(attempt_dir, kept)
    assert read_record(attempt_dir) == kept
    assert (attempt_dir.parent / "attempt-1.json").stat().st_mode & 0o777 == 0o600
