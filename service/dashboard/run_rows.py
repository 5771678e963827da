"""The runs list as the dashboard shows it: filters, keyset pages, verdict badges.

Pages are cut on the run id (an indexed key): `before` walks to older runs, `after` to
newer ones. No OFFSET and no count of an unfiltered list, so page 1 and page 2,000 cost
the same however many runs the database holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Select, exists, select
from sqlalchemy.orm import Session, aliased

from service.persistence.models import Experiment, Run, RunTag, Verdict, Worker
from service.runs import search
from service.runs.experiments import reported_image
from service.verification.verdicts import FamilyHead, family_heads, family_references

VERDICT_FILTERS = ("identical", "diverged", "incomparable", "reference", "pending")


@dataclass(frozen=True)
class Filters:
    """What the runs list is narrowed to (each kept in the page's URL)."""

    status: str | None = None
    verdict: str | None = None
    experiment: str | None = None
    worker: str | None = None
    kind: str = "train"
    spec: str | None = None
    fingerprint: str | None = None
    spot_check: str | None = None  # the newest spot check's outcome, or "none"
    tag: str | None = None  # runs with this tag
    search: str | None = None  # `params.x = 1 and metrics.y > 0.9` (service.runs.search)
    archived: str | None = None  # None: archived runs left out; "only"; "all"

    def query_items(self) -> list[tuple[str, str]]:
        items = [(k, v) for k, v in vars(self).items() if v and not (k == "kind" and v == "train")]
        return sorted(items)


@dataclass(frozen=True)
class Badge:
    kind: str | None
    label: str = ""
    title: str = ""


@dataclass
class RunRow:
    """One line of the runs list."""

    run: Run
    experiment: Experiment
    worker: str | None
    badge: Badge
    image: str | None
    extra: dict[str, Any] = field(default_factory=dict)
    # Finished, but an older run of its family is not: its badge changes when that one ends
    # (a rerun that finished first shows as the reference until then).
    settling: bool = False

    @property
    def live(self) -> bool:
        return self.run.status in ("queued", "running") or self.settling


def _prefix(value: str, algorithm: str) -> str:
    # Digests are written `algorithm:hex`; a bare hex prefix means the usual algorithm.
    return value if ":" in value else f"{algorithm}:{value}"


def filtered(filters: Filters) -> Select[Run, Experiment]:
    """The runs matching `filters` with their experiments, not yet ordered or cut."""
    query = (
        select(Run, Experiment)
        .join(Experiment, Experiment.id == Run.experiment_id)
        .where(Run.kind == filters.kind)
    )
    if filters.archived is None:
        query = query.where(Run.archived_at.is_(None))
    elif filters.archived == "only":
        query = query.where(Run.archived_at.is_not(None))
    if filters.status:
        query = query.where(Run.status == filters.status)
    if filters.experiment:
        if filters.experiment.isdigit():
            query = query.where(Run.experiment_id == int(filters.experiment))
        else:
            # What the filter's label says: the experiment's name contains the text.
            query = query.where(Experiment.name.icontains(filters.experiment, autoescape=True))
    if filters.tag:
        query = query.where(exists().where(RunTag.run_id == Run.id, RunTag.tag == filters.tag))
    if filters.search:
        query = query.where(*search.conditions(search.parse(filters.search)))
    if filters.worker:
        ids = select(Worker.id).where(Worker.name == filters.worker)
        query = query.where(Run.worker_id.in_(ids))
    if filters.spec:
        query = query.where(Experiment.spec_hash.startswith(_prefix(filters.spec, "sha256")))
    if filters.fingerprint:
        fingerprint = _prefix(filters.fingerprint, "blake3")
        query = query.where(Run.final_fingerprint.startswith(fingerprint))
    if filters.spot_check == "none":
        query = query.where(Run.spot_check.is_(None))
    elif filters.spot_check:
        query = query.where(Run.spot_check == filters.spot_check)
    if filters.verdict in ("identical", "diverged", "incomparable"):
        query = query.join(Verdict, Verdict.run_id == Run.id).where(
            Verdict.verdict == filters.verdict
        )
    elif filters.verdict == "reference":
        earlier = aliased(Run)
        query = query.where(
            Run.status == "succeeded",
            ~exists().where(
                earlier.family_id == Run.family_id,
                earlier.status == "succeeded",
                earlier.kind == "train",
                earlier.id < Run.id,
            ),
        )
    elif filters.verdict == "pending":
        query = query.where(
            Run.rerun_of_id.is_not(None),
            Run.status.in_(("queued", "running", "succeeded")),
            ~exists().where(Verdict.run_id == Run.id),
        )
    return query


def _pairs(db: Session, query: Select[Run, Experiment]) -> list[tuple[Run, Experiment]]:
    return [(run, experiment) for run, experiment in db.execute(query)]


@dataclass
class RunsPage:
    rows: list[RunRow]
    newer: int | None  # `after` cursor of the previous page, if there is one
    older: int | None  # `before` cursor of the next page, if there is one


def page(
    db: Session,
    filters: Filters,
    *,
    limit: int,
    before: int | None = None,
    after: int | None = None,
) -> RunsPage:
    """One page of runs, newest first, cut at a cursor on the run id."""
    query = filtered(filters)
    if after is not None:
        pairs = _pairs(db, query.where(Run.id > after).order_by(Run.id.asc()).limit(limit + 1))
        more_newer = len(pairs) > limit
        pairs = list(reversed(pairs[:limit]))
        older = pairs[-1][0].id if pairs else None
        newer = pairs[0][0].id if pairs and more_newer else None
        return RunsPage(rows=rows_of(db, pairs), newer=newer, older=older)
    if before is not None:
        query = query.where(Run.id < before)
    pairs = _pairs(db, query.order_by(Run.id.desc()).limit(limit + 1))
    more_older = len(pairs) > limit
    pairs = pairs[:limit]
    older = pairs[-1][0].id if pairs and more_older else None
    newer = pairs[0][0].id if pairs and before is not None else None
    return RunsPage(rows=rows_of(db, pairs), newer=newer, older=older)


def iterate(db: Session, filters: Filters, batch: int = 500) -> Iterator[RunRow]:
    """Every run matching `filters`, newest first, read a batch at a time."""
    before: int | None = None
    while True:
        query = filtered(filters)
        if before is not None:
            query = query.where(Run.id < before)
        pairs = _pairs(db, query.order_by(Run.id.desc()).limit(batch))
        if not pairs:
            return
        yield from rows_of(db, pairs)
        before = pairs[-1][0].id
        db.expunge_all()  # a long export holds one batch in memory, not all of them


def by_ids(db: Session, ids: Sequence[int]) -> list[RunRow]:
    """The rows of the given runs (for refreshing live rows), newest first."""
    query = (
        select(Run, Experiment)
        .join(Experiment, Experiment.id == Run.experiment_id)
        .where(Run.id.in_(ids))
        .order_by(Run.id.desc())
    )
    return rows_of(db, _pairs(db, query))


def references_of(db: Session, runs: Sequence[Run]) -> set[int]:
    """Which of these runs are their family's reference (its first successful training)."""
    return set(family_references(db, _families(runs)).values())


def _families(runs: Sequence[Run]) -> set[int]:
    """The families of the successful trainings among these runs: only such a run can be
    its family's reference, or wait for an older member to settle its verdict."""
    return {
        r.family_id
        for r in runs
        if r.family_id is not None and r.status == "succeeded" and r.kind == "train"
    }


def _references(heads: dict[int, FamilyHead]) -> set[int]:
    return {h.reference for h in heads.values() if h.reference is not None}


def badge(run: Run, verdict: Verdict | None, is_reference: bool) -> Badge:
    """The verdict badge of a run: identical, diverged at e/s, pending, reference, ..."""
    if verdict is not None:
        ref = f"against run {verdict.reference_run_id}"
        if verdict.verdict == "diverged":
            where = (verdict.report or {}).get("first_divergence") or {}
            at = f" at e{where.get('epoch')}/s{where.get('step')}" if where else ""
            return Badge("diverged", f"diverged{at}", f"diverged {ref}")
        return Badge(verdict.verdict, verdict.verdict, f"{verdict.verdict} {ref}")
    if is_reference:
        return Badge("reference", "reference", "the family's reference run")
    if run.rerun_of_id is not None and run.kind == "train" and run.status in ("queued", "running"):
        return Badge("pending", "pending", f"rerun of run {run.rerun_of_id}: not finished")
    return Badge(None)


def image_of(run: Run) -> str | None:
    return run.required_image or reported_image(run.provenance)


def rows_of(db: Session, pairs: Sequence[tuple[Run, Experiment]]) -> list[RunRow]:
    """Rows with worker names and badges, in a fixed number of queries per page."""
    runs = [r for r, _ in pairs]
    ids = [r.id for r in runs]
    verdicts = {v.run_id: v for v in db.scalars(select(Verdict).where(Verdict.run_id.in_(ids)))}
    worker_ids = {r.worker_id for r in runs if r.worker_id is not None}
    workers = (
        {
            i: n
            for i, n in db.execute(select(Worker.id, Worker.name).where(Worker.id.in_(worker_ids)))
        }
        if worker_ids
        else {}
    )
    heads = family_heads(db, _families(runs))  # references and settling rows, one query
    references = _references(heads)
    return [
        RunRow(
            run=run,
            experiment=experiment,
            worker=workers.get(run.worker_id) if run.worker_id is not None else None,
            badge=badge(run, verdicts.get(run.id), run.id in references),
            image=image_of(run),
            settling=_settling(run, heads),
        )
        for run, experiment in pairs
    ]


def _settling(run: Run, heads: dict[int, FamilyHead]) -> bool:
    """Whether an older run of its family, not yet finished, may still change its badge:
    a finished training that is not its family's first run."""
    family = run.family_id
    if family is None or family == run.id or run.status != "succeeded" or run.kind != "train":
        return False
    head = heads.get(family)
    return (
        head is not None and head.oldest_unfinished is not None and head.oldest_unfinished < run.id
    )


def export_record(row: RunRow) -> dict[str, Any]:
    """One run as the CSV/JSON export writes it."""
    run, experiment = row.run, row.experiment

    def iso(value: datetime | None) -> str | None:
        return value.isoformat() + "Z" if value else None

    return {
        "id": run.id,
        "status": run.status,
        "kind": run.kind,
        "experiment_id": experiment.id,
        "experiment": experiment.name,
        "seed": list(experiment.seed),
        "spec_hash": experiment.spec_hash,
        "worker": row.worker,
        "image": row.image,
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "final_fingerprint": run.final_fingerprint,
        "rerun_of_id": run.rerun_of_id,
        "family_id": run.family_id,
        "verdict": row.badge.kind,
        "verdict_label": row.badge.label,
        "name": run.name,
        "tags": list(run.tags or []),
    }
