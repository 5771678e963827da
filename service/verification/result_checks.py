"""What the server checks itself before it records a result: the worker's word is not enough.

The final fingerprint a worker reports is recomputed from the final checkpoint it uploaded
(NumPy and blake3, with the function the job fingerprints its state with), within the
checkpoint bounds, before the run's row is locked; and the checkpoint must hold the
variables the run's model and optimizer have (`checkpoint_structure`). The image a worker
reports running is checked against the operator's allow-list. The outcomes are recorded
with the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence.models import Artifact, Run
from service.storage import blob_store
from service.verification.checkpoint_structure import structure_differences
from worker.errors import CheckpointError, CheckpointRefused
from worker.record.checkpoint import fingerprint_checkpoint
from worker.record.fingerprint import ALGORITHMS
from worker.record.trace import TracePoint
from worker.result import JobResult

Outcome = Literal["verified", "mismatch", "structure", "missing", "refused", "not_checked"]
_SHOWN = 10  # differing variables named in an error
_STRUCTURE_SHOWN = 5  # structure differences spelled out in its message


@dataclass(frozen=True)
class Verification:
    """The server's own check of a reported final fingerprint."""

    outcome: Outcome
    reported: str | None
    computed: str | None = None
    message: str = ""
    checkpoint_sha256: str | None = None  # the npz that was hashed, to detect a swap
    epoch: int | None = None
    variables: list[str] = field(default_factory=list)  # whose digests differ
    step: int | None = None  # set when the checkpoint is a step one (a replay's end)

    @property
    def passed(self) -> bool:
        """Whether the result may be recorded as it was reported."""
        return self.outcome in ("verified", "not_checked")

    def error(self) -> dict[str, Any] | None:
        """The run's error document when the check failed, else None."""
        if self.passed:
            return None
        kind = {
            "mismatch": "FingerprintMismatch",
            "structure": "CheckpointStructureMismatch",
            "missing": "FinalCheckpointMissing",
            "refused": "CheckpointRefused",
        }[self.outcome]
        doc: dict[str, Any] = {"type": kind, "message": self.message}
        doc["reported_fingerprint"], doc["computed_fingerprint"] = self.reported, self.computed
        if self.variables:
            doc["variables"] = self.variables[:_SHOWN]
        return doc

    def record(self) -> dict[str, Any]:
        """What goes into the run's `reported_by.fingerprint`."""
        return {
            "outcome": self.outcome,
            "reported": self.reported,
            "computed": self.computed,
            "epoch": self.epoch,
            "checkpoint_sha256": self.checkpoint_sha256,
        }


def final_npz(db: Session, run_id: int, epoch: int) -> Artifact | None:
    """The uploaded checkpoint arrays of the run at the end of `epoch`, if any."""
    return db.scalar(
        select(Artifact).where(
            Artifact.run_id == run_id,
            Artifact.kind == "checkpoint",
            Artifact.epoch == epoch,
            Artifact.name.like("%.npz"),
        )
    )


def step_npz(db: Session, run_id: int, step: int) -> Artifact | None:
    """The uploaded arrays of the run's step checkpoint at global `step`, if any."""
    return db.scalar(
        select(Artifact).where(
            Artifact.run_id == run_id,
            Artifact.kind == "checkpoint",
            Artifact.name == f"step-{step:09d}.npz",
        )
    )


def _asked_until_step(db: Session, run_id: int) -> int | None:
    """The global step the server asked the run's job to stop after, if it asked."""
    options = db.scalar(select(Run.job_options).where(Run.id == run_id)) or {}
    value = options.get("until_step")
    return int(value) if value is not None else None


def _ends_right(last: TracePoint, reported: str, until_step: int | None) -> bool:
    """Whether the result's last trace point carries its final fingerprint where the run
    had to end: an epoch's end, or the step a replay was asked to stop after."""
    if last.fingerprint != reported:
        return False
    if until_step is None:
        return last.kind == "epoch"
    return last.kind == "step" and last.step == until_step


def verify_result(
    *, db: Session, run_id: int, result: JobResult, max_checkpoint_bytes: int
) -> Verification:
    """Recompute a succeeded result's final fingerprint from its uploaded final checkpoint.

    A result that did not succeed has nothing to verify (`not_checked`). A succeeded one
    needs its last trace point to be the end of an epoch carrying the final fingerprint,
    and the checkpoint of that epoch uploaded; its arrays are read one at a time within
    `max_checkpoint_bytes` (more, or anything but plain numbers: `refused`).
    """
    reported = result.final_fingerprint
    if result.status != "succeeded":
        return Verification("not_checked", reported, message=f"the job {result.status}")
    last = result.trace[-1] if result.trace else None
    # A replay asked to stop mid-epoch (`until_step`) ends on a step point and checkpoint.
    until_step = _asked_until_step(db, run_id)
    if reported is None or last is None or not _ends_right(last, reported, until_step):
        where = f"at step {until_step}" if until_step is not None else "at the end of an epoch"
        return Verification(
            "mismatch",
            reported,
            message="fingerprint mismatch: the reported final fingerprint is not the "
            f"fingerprint of the last trace point {where}",
        )
    algorithm = reported.split(":", 1)[0]
    if algorithm not in ALGORITHMS:
        return Verification(
            "mismatch", reported, message=f"fingerprint mismatch: unknown algorithm {algorithm!r}"
        )
    npz = (
        final_npz(db, run_id, last.epoch) if until_step is None else step_npz(db, run_id, last.step)
    )
    db.commit()  # nothing of the database is held while the arrays are hashed
    if npz is None:
        return Verification(
            "missing",
            reported,
            epoch=last.epoch,
            message=f"final checkpoint not uploaded: the server recomputes the final "
            f"fingerprint from the checkpoint of epoch {last.epoch}, and there is none",
        )
    try:
        with blob_store.local_copy(
            npz.storage_url, npz.sha256, max_bytes=max_checkpoint_bytes
        ) as path:
            computed = fingerprint_checkpoint(
                path, list(last.variables), max_bytes=max_checkpoint_bytes, algorithm=algorithm
            )
    except CheckpointRefused as exc:
        return Verification("refused", reported, message=f"final checkpoint refused: {exc}")
    except (CheckpointError, OSError) as exc:
        return Verification("refused", reported, message=f"final checkpoint unreadable: {exc}")
    found = Verification(
        "verified",
        reported,
        computed.fingerprint,
        checkpoint_sha256=npz.sha256,
        epoch=last.epoch,
        step=last.step if until_step is not None else None,
    )
    if computed.fingerprint == reported:
        return _check_structure(db, run_id, result, npz, found, max_checkpoint_bytes)
    differing = [p for p, d in computed.variables.items() if last.variables.get(p) != d]
    return Verification(
        "mismatch",
        reported,
        computed.fingerprint,
        checkpoint_sha256=npz.sha256,
        epoch=last.epoch,
        variables=differing,
        message=f"fingerprint mismatch: the worker reported {reported} but the uploaded "
        f"checkpoint of epoch {last.epoch} has {computed.fingerprint} "
        f"({len(differing)} variables differ)",
    )


def _check_structure(
    db: Session,
    run_id: int,
    result: JobResult,
    npz: Artifact,
    found: Verification,
    max_checkpoint_bytes: int,
) -> Verification:
    """`found`, unless the checkpoint's variable paths, dtypes or shapes are not the run's."""
    try:
        with blob_store.local_copy(
            npz.storage_url, npz.sha256, max_bytes=max_checkpoint_bytes
        ) as path:
            lines, against = structure_differences(
                db=db, run_id=run_id, result=result, npz_path=path, max_bytes=max_checkpoint_bytes
            )
    except (CheckpointError, OSError) as exc:
        return Verification(
            "refused", found.reported, message=f"final checkpoint unreadable: {exc}"
        )
    finally:
        db.commit()  # nothing of the database is held past the check
    if not lines:
        return found
    shown = "; ".join(what for _, what in lines[:_STRUCTURE_SHOWN])
    more = f" (and {len(lines) - _STRUCTURE_SHOWN} more)" if len(lines) > _STRUCTURE_SHOWN else ""
    return Verification(
        "structure",
        found.reported,
        found.computed,
        checkpoint_sha256=found.checkpoint_sha256,
        epoch=found.epoch,
        step=found.step,
        variables=[path for path, _ in lines if path],
        message=f"checkpoint structure mismatch: the final checkpoint of epoch {found.epoch} "
        f"does not hold the variables of {against}: {shown}{more}",
    )


def still_the_checkpoint(db: Session, run_id: int, found: Verification) -> Verification:
    """`found`, unless the verified checkpoint was replaced since (then a mismatch)."""
    if found.checkpoint_sha256 is None or found.epoch is None:
        return found
    npz = (
        final_npz(db, run_id, found.epoch)
        if found.step is None
        else step_npz(db, run_id, found.step)
    )
    if npz is not None and npz.sha256 == found.checkpoint_sha256:
        return found
    return Verification(
        "mismatch",
        found.reported,
        found.computed,
        epoch=found.epoch,
        message="fingerprint mismatch: the final checkpoint was replaced while it was verified",
    )


def image_allowed(image: str | None, allowed: list[str]) -> bool | None:
    """Whether a reported image is on the operator's allow-list (None: no list, or no image)."""
    if not allowed or image is None:
        return None
    return image in allowed
