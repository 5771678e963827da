"""Where a claimed run starts: the newest intact checkpoint it uploaded, epoch-end or mid-epoch.

A job writes checkpoints at epoch ends (`epoch-NNNNNN.npz/.json`) and, with
`training.checkpoint_every_steps`, every K global steps (`step-NNNNNNNNN.npz/.json`). The
node uploads both kinds as the job writes them; step checkpoints are stored without an
epoch, so everything that reads epoch checkpoints (verification of the final fingerprint,
comparison sizes, refinements) never sees them. A checkpoint counts once both its files
are in (the node sends the json last). Step checkpoints serve only to resume, so a newer
complete checkpoint makes the older step checkpoints of the run useless: they are deleted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy import ColumnElement, ScalarSelect, select
from sqlalchemy.orm import Session

from service.persistence.models import Artifact, Run
from service.persistence.rows_as_json import json_rows
from service.storage import artifacts

_NAME = re.compile(r"^(epoch|step)-(\d{6}|\d{9})\.(npz|json)$")


@dataclass(frozen=True)
class ResumePoint:
    """One complete checkpoint: what it is, how far training had gone, and its files."""

    kind: Literal["epoch", "step"]
    epoch: int  # epochs completed when it was written
    step: int  # global optimizer steps done when it was written
    npz: Artifact
    json: Artifact

    @property
    def files(self) -> list[Artifact]:
        """npz first, json last: the order a node downloads them in."""
        return [self.npz, self.json]


def steps_per_epoch(run: Run) -> int:
    """Optimizer steps in one epoch of the run's spec (one per training batch)."""
    return _steps_per_epoch(run.experiment.spec)


def _steps_per_epoch(spec: dict[str, Any]) -> int:
    return max(int(spec["dataset"]["train_batches"]), 1)


Kind = Literal["epoch", "step"]
T = TypeVar("T")


def _complete(
    files: Iterable[tuple[str, int | None, T]], per_epoch: int
) -> list[tuple[Kind, int, int, T, T]]:
    """(kind, epoch, step, npz, json) of each checkpoint both of whose files are among the
    (name, epoch, file) entries, oldest step first."""
    stems: dict[tuple[Kind, int], dict[str, T]] = {}
    for name, stored_epoch, file in files:
        match = _NAME.match(name)
        if match is None:
            continue
        kind: Kind = "epoch" if match.group(1) == "epoch" else "step"
        digits, ext = match.group(2), match.group(3)
        # Epoch checkpoints carry their epoch; step checkpoints are stored without one.
        expected = (6, True) if kind == "epoch" else (9, False)
        if (len(digits), stored_epoch is not None) != expected:
            continue
        stems.setdefault((kind, int(digits)), {})[ext] = file
    points = []
    for (found, number), pair in stems.items():
        if {"npz", "json"} <= set(pair):
            epoch, step = (
                (number, number * per_epoch) if found == "epoch" else (number // per_epoch, number)
            )
            points.append((found, epoch, step, pair["npz"], pair["json"]))
    # At one step an epoch checkpoint is preferred: its epoch is finished, evaluation included.
    return sorted(points, key=lambda p: (p[2], p[0] == "epoch"))


def complete_checkpoints(db: Session, run: Run) -> list[ResumePoint]:
    """The run's checkpoints whose npz and json were both uploaded, oldest step first."""
    found = db.scalars(
        select(Artifact).where(Artifact.run_id == run.id, Artifact.kind == "checkpoint")
    )
    files = ((art.name, art.epoch, art) for art in found)
    return [ResumePoint(*point) for point in _complete(files, steps_per_epoch(run))]


def checkpoint_files(run_id: ColumnElement[int]) -> ScalarSelect[Any]:
    """The name and epoch of each checkpoint file of the run `run_id` names, as a scalar
    subquery (`json_rows`) to select in a statement about the run."""
    columns = Artifact.__table__.columns
    return (
        select(json_rows(columns.name, columns.epoch))
        .where(columns.run_id == run_id, columns.kind == "checkpoint")
        .scalar_subquery()
    )


def checkpoint_position(
    files: Iterable[tuple[str, int | None]], spec: dict[str, Any]
) -> tuple[int | None, int | None]:
    """The newest complete epoch checkpoint's epoch and the newest complete checkpoint's
    global step (None when there is none) among a run's checkpoint files (name, epoch):
    what its detail shows. `spec`: the run's."""
    points = _complete(((name, epoch, name) for name, epoch in files), _steps_per_epoch(spec))
    epochs = [epoch for kind, epoch, *_ in points if kind == "epoch"]
    return (max(epochs) if epochs else None), (points[-1][2] if points else None)


def newest(db: Session, run: Run) -> ResumePoint | None:
    """The run's newest complete checkpoint by global step (epoch or step kind), if any."""
    points = complete_checkpoints(db, run)
    return points[-1] if points else None


def resume_point(db: Session, run: Run) -> ResumePoint | None:
    """The checkpoint a claimed run starts from: its own newest, else (a re-trace) the
    epoch checkpoint of the run and epoch its job options name."""
    own = newest(db, run)
    options = run.job_options or {}
    if own is not None or not options.get("resume_from_epoch"):
        return own
    source = db.get(Run, int(options["resume_from_run"]))
    if source is None:
        return None
    at = int(options["resume_from_epoch"])
    return next(
        (p for p in complete_checkpoints(db, source) if p.kind == "epoch" and p.epoch == at),
        None,
    )


def prune_step_checkpoints(db: Session, run: Run, *, keep_newest: bool = True) -> int:
    """Delete the run's step checkpoints older than its newest complete checkpoint (all of
    them with `keep_newest=False`); returns how many checkpoints went.

    A stored file is removed only when no artifact row still names its digest: files are
    content-addressed, so two runs' identical checkpoints share one.
    """
    points = complete_checkpoints(db, run)
    if not points:
        return 0
    newest_step = points[-1].step if keep_newest else None
    stale_stems = {
        p.npz.name.rsplit(".", 1)[0]
        for p in points
        if p.kind == "step" and (newest_step is None or p.step < newest_step)
    }
    if not stale_stems:
        return 0
    stale = [
        art
        for art in db.scalars(
            select(Artifact).where(Artifact.run_id == run.id, Artifact.kind == "checkpoint")
        )
        if art.epoch is None and art.name.rsplit(".", 1)[0] in stale_stems
    ]
    files = {art.sha256: artifacts.local_path(art) for art in stale}
    for art in stale:
        db.delete(art)
    db.flush()  # written first: on SQLite this takes the write lock (see lock_digests)
    # Held from the check to the unlink, so an upload of the same bytes either committed
    # its artifact before the check or puts the file back after the unlink.
    artifacts.lock_digests(db, files)
    shared = set(db.scalars(select(Artifact.sha256).where(Artifact.sha256.in_(files))))
    for digest, path in files.items():
        if digest not in shared:
            path.unlink(missing_ok=True)
    # Should this commit fail, the rows of superseded checkpoints stay without their files;
    # resumes take the newest checkpoint, which is never pruned while the run goes on.
    db.commit()
    return len(stale_stems)
