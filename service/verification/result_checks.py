"""What the server checks itself before it records a result: the worker's word is not enough.

The final fingerprint a worker reports is recomputed from the final checkpoint it uploaded
(NumPy and blake3, with the function the job fingerprints its state with), within the
checkpoint bounds, before the run's row is locked. The image a worker reports running is
checked against the operator's allow-list. Both outcomes are recorded with the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence.models import Artifact
from service.storage import artifacts
from worker.errors import CheckpointError, CheckpointRefused
from worker.record.checkpoint import fingerprint_checkpoint
from worker.record.fingerprint import ALGORITHMS
from worker.result import JobResult

Outcome = Literal["verified", "mismatch", "missing", "refused", "not_checked"]
_SHOWN = 10  # differing variables named in an error


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
    if reported is None or last is None or last.fingerprint != reported or last.kind != "epoch":
        return Verification(
            "mismatch",
            reported,
            message="fingerprint mismatch: the reported final fingerprint is not the "
            "fingerprint of the last trace point at the end of an epoch",
        )
    algorithm = reported.split(":", 1)[0]
    if algorithm not in ALGORITHMS:
        return Verification(
            "mismatch", reported, message=f"fingerprint mismatch: unknown algorithm {algorithm!r}"
        )
    npz = final_npz(db, run_id, last.epoch)
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
        computed = fingerprint_checkpoint(
            artifacts.local_path(npz),
            list(last.variables),
            max_bytes=max_checkpoint_bytes,
            algorithm=algorithm,
        )
    except CheckpointRefused as exc:
        return Verification("refused", reported, message=f"final checkpoint refused: {exc}")
    except (CheckpointError, OSError) as exc:
        return Verification("refused", reported, message=f"final checkpoint unreadable: {exc}")
    found = Verification(
        "verified", reported, computed.fingerprint, checkpoint_sha256=npz.sha256, epoch=last.epoch
    )
    if computed.fingerprint == reported:
        return found
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


def still_the_checkpoint(db: Session, run_id: int, found: Verification) -> Verification:
    """`found`, unless the verified checkpoint was replaced since (then a mismatch)."""
    if found.checkpoint_sha256 is None or found.epoch is None:
        return found
    npz = final_npz(db, run_id, found.epoch)
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
