"""Where a claimed run starts: the newest intact checkpoint it uploaded, epoch-end or mid-epoch.

A job writes checkpoints at epoch ends (`epoch-NNNNNN.npz/.json`) and, with
`training.checkpoint_every_steps`, every K global steps (`step-NNNNNNNNN.npz/.json`). The
node uploads both kinds as the job writes them; step checkpoints are stored without an
epoch, so everything that reads epoch checkpoints (verification of the final fingerprint,
comparison sizes, refinements) never sees them. A checkpoint counts once both its files
are in (the node sends the json last). Step checkpoints serve only to resume, so a newer
complete checkpoint makes the older step checkpoints of the run useless: they are deleted,
with the halves of older checkpoints whose other file never came; once the run is finished,
every checkpoint file but its complete epoch checkpoints goes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy import ColumnElement, ScalarSelect, select
from sqlalchemy.orm import Session

from service.persistence.models import Artifact, Run, TracePointRow
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
    # A script's epochs are its own: it keeps epoch checkpoints only, ordered by epoch.
    return max(int((spec.get("dataset") or {}).get("train_batches") or 1), 1)


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
    points = [ResumePoint(*point) for point in _complete(files, steps_per_epoch(run))]
    if run.experiment.spec.get("kind") != "script" or not points:
        return points
    # A script's epochs have the steps it took, which its trace says, not a spec.
    steps = dict(
        db.execute(
            select(TracePointRow.epoch, TracePointRow.step).where(
                TracePointRow.run_id == run.id, TracePointRow.kind == "epoch"
            )
        ).all()
    )
    return [dataclasses.replace(p, step=steps.get(p.epoch, p.step)) for p in points]


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
    at_step = options.get("resume_from_step")
    if own is not None or not (options.get("resume_from_epoch") or at_step):
        return own
    source = db.get(Run, int(options["resume_from_run"]))
    if source is None:
        return None
    if at_step:  # a replay from a mid-epoch step checkpoint
        points = complete_checkpoints(db, source)
        return next((p for p in points if p.kind == "step" and p.step == at_step), None)
    at = int(options["resume_from_epoch"])
    return next(
        (p for p in complete_checkpoints(db, source) if p.kind == "epoch" and p.epoch == at),
        None,
    )


def prune_step_checkpoints(
    db: Session, run: Run, *, keep_newest: bool = True, keep_complete: bool = False
) -> int:
    """Delete the run's checkpoint files that can serve no resume; returns how many
    checkpoints (file stems) went.

    While the run goes on (`keep_newest`): its step checkpoints older than its newest
    complete checkpoint, and the halves of checkpoints older than that one whose other file
    never came (an npz without its json). Once it is finished (`keep_newest=False`): every
    step checkpoint and every checkpoint file that is not half of a complete epoch
    checkpoint. With `keep_complete`, complete step checkpoints stay too (kept for spot
    checks), and only orphan halves go. A stored file is removed only when no artifact row
    still names its digest: files are content-addressed, so two runs' identical checkpoints
    share one.
    """
    files = list(
        db.scalars(select(Artifact).where(Artifact.run_id == run.id, Artifact.kind == "checkpoint"))
    )
    points = _complete(((a.name, a.epoch, a) for a in files), steps_per_epoch(run))
    newest_step = points[-1][2] if points and keep_newest else None
    if keep_newest and newest_step is None:
        return 0
    kept = {
        id(file)
        for kind, _, step, npz, json in points
        if kind == "epoch" or keep_complete or (newest_step is not None and step >= newest_step)
        for file in (npz, json)
    }
    stale = [
        art
        for art in files
        if id(art) not in kept and (newest_step is None or _before(art, newest_step, run))
    ]
    artifacts.delete(db, stale)
    return len({art.name.rsplit(".", 1)[0] for art in stale})


def thin_step_checkpoints(db: Session, run: Run, bounds: artifacts.UploadBounds) -> int:
    """Delete every other complete step checkpoint before the newest once the run's counted
    checkpoint files come within two checkpoints of its upload bounds, so keeping them never
    refuses an upload; spot-check segments then span two intervals. How many went."""
    held = db.execute(
        select(Artifact.name, Artifact.epoch, Artifact.size).where(
            Artifact.run_id == run.id, Artifact.kind == "checkpoint"
        )
    ).all()
    counted = [
        size for name, at, size in held if artifacts.counted("checkpoint", name, at, bounds.epochs)
    ]
    largest = max(counted, default=0)
    if len(counted) + 4 <= bounds.files and sum(counted) + 4 * largest <= bounds.bytes:
        return 0
    steps = [p for p in complete_checkpoints(db, run) if p.kind == "step"][:-1]
    dropped = steps[1::2] or steps
    artifacts.delete(db, [f for p in dropped for f in p.files])
    return len(dropped)


def _before(art: Artifact, step: int, run: Run) -> bool:
    """Whether the checkpoint file names a point before global `step` (never for other names)."""
    match = _NAME.match(art.name)
    if match is None:
        return False
    number = int(match.group(2))
    return (number * steps_per_epoch(run) if match.group(1) == "epoch" else number) < step


def kept_positions(count: int, policy: str) -> set[int]:
    """Which of a finished run's `count` complete checkpoints (oldest first, epoch and step
    ones) REPRO_KEEP_CHECKPOINTS keeps: `all`, `final` (the last only) or `every:N` (the
    Nth, 2Nth, ... and the last: epochs N, 2N, ... for a run with epoch checkpoints only)."""
    if count == 0 or policy == "all":
        return set(range(count))
    if policy == "final":
        return {count - 1}
    every = int(policy.removeprefix("every:"))
    return {i for i in range(count) if (i + 1) % every == 0} | {count - 1}


def retain_checkpoints(db: Session, run: Run, policy: str) -> int:
    """Delete the finished run's checkpoints its retention policy does not keep, and none a
    queued or running replay or re-trace of it starts from; how many went."""
    points = complete_checkpoints(db, run)
    keep = kept_positions(len(points), policy)
    needed = [
        options or {}
        for options in db.scalars(
            select(Run.job_options).where(
                Run.rerun_of_id == run.id, Run.status.in_(("queued", "running"))
            )
        )
    ]
    starts = {("epoch", int(o.get("resume_from_epoch") or 0)) for o in needed} | {
        ("step", int(o["resume_from_step"])) for o in needed if o.get("resume_from_step")
    }
    dropped = [
        p
        for i, p in enumerate(points)
        if i not in keep and (p.kind, p.epoch if p.kind == "epoch" else p.step) not in starts
    ]
    artifacts.delete(db, [f for p in dropped for f in p.files])
    return len(dropped)
