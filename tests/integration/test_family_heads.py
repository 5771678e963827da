"""Families' references and oldest unfinished runs, asked for many families in one query
whose text does not depend on how many families it asks for."""

from __future__ import annotations

from itertools import cycle, islice
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from service.api import run_pages
from service.api.views import run_detail, run_outs
from service.config import Settings
from service.persistence.engine import make_engine
from service.persistence.models import Experiment, Run
from service.verification.verdicts import FamilyHead, family_heads, family_references

# Each family's runs in order, as (kind, status): the reference is the first successful
# training, the oldest unfinished the first queued or running run. The first run of a
# family settles most marks (see `is_reference`): a later success after a successful first
# run is not the reference, one after a first run that failed or is a re-trace may be.
SHAPES = [
    [("train", "succeeded")],
    [("train", "failed"), ("train", "succeeded"), ("train", "succeeded")],
    [("train", "queued")],
    [("train", "succeeded"), ("train", "succeeded"), ("train", "running"), ("train", "queued")],
    [("train", "cancelled")],
    [("refine", "succeeded"), ("train", "failed"), ("train", "succeeded"), ("train", "running")],
]
FAMILIES = 60


def _fill(db: Session) -> dict[int, FamilyHead]:
    """FAMILIES families of the shapes above; each one's head, worked out here one by one."""
    experiment = Experiment(
        name="families",
        spec={"dataset": {"train_batches": 4}},
        spec_hash="h",
        submitted_spec_hash="h",
        seed=[1],
        seed_source="spec",
    )
    db.add(experiment)
    expected = {}
    for shape in islice(cycle(SHAPES), FAMILIES):
        runs = [Run(experiment=experiment, kind=kind, status=status) for kind, status in shape]
        db.add_all(runs)
        db.flush()
        for run in runs:
            run.family_id = runs[0].id
        expected[runs[0].id] = FamilyHead(
            reference=next(
                (r.id for r in runs if (r.kind, r.status) == ("train", "succeeded")), None
            ),
            oldest_unfinished=next((r.id for r in runs if r.status in ("queued", "running")), None),
        )
    db.commit()
    return expected


def test_heads_of_many_families_come_from_one_statement_whatever_their_number(
    migrated_settings: Settings,
) -> None:
    engine = make_engine(migrated_settings.resolved_database_url)
    statements: list[str] = []

    def heads_statements(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "GROUP BY runs.family_id" in statement:
            statements.append(statement)

    try:
        with Session(engine) as db:
            expected = _fill(db)
            event.listen(engine, "before_cursor_execute", heads_statements)
            families = set(expected)
            unknown = max(families) + 1000
            assert family_heads(db, families | {unknown}) == expected
            assert family_references(db, families) == {
                family: head.reference
                for family, head in expected.items()
                if head.reference is not None
            }
            for family in sorted(families)[: len(SHAPES)]:
                assert family_heads(db, {family}) == {family: expected[family]}
                references = family_references(db, {family})
                assert references.get(family) == expected[family].reference
    finally:
        engine.dispose()
    # One text for every number of families: SQLAlchemy need not render it again for
    # each, and PostgreSQL prepares it once.
    assert len(statements) == 2 + 2 * len(SHAPES)
    assert len(set(statements)) == 2, set(statements)  # with and without the unfinished


def test_pages_details_and_list_views_mark_exactly_each_familys_reference(
    migrated_settings: Settings,
) -> None:
    """The reference mark of a page of runs, a run's detail and the list view of loaded runs
    (what writes answer with) is set on the runs worked out here (each family's first
    successful training) and on no other, trainings and re-traces alike."""
    engine = make_engine(migrated_settings.resolved_database_url)
    try:
        with Session(engine) as db:
            expected = _fill(db)
            references = {head.reference for head in expected.values() if head.reference}
            every_run = set(db.scalars(select(Run.id)))
            marked = {
                kind: {
                    item["id"]
                    for item in run_pages.list_runs(
                        db=db.connection(), filters=run_pages.RunFilters(kind=kind), limit=500
                    )["items"]
                    if item["is_reference"]
                }
                for kind in ("train", "refine")
            }
            loaded = db.scalars(select(Run)).all()
            in_list_views = {out.id for out in run_outs(db, loaded) if out.is_reference}
            in_details = set()
            for run_id in every_run:
                detail = run_detail(db, run_id, settings=migrated_settings)
                assert detail is not None
                if detail.is_reference:
                    in_details.add(run_id)
    finally:
        engine.dispose()
    assert len(references) == FAMILIES * 4 // len(SHAPES)  # 4 of the shapes have one
    assert marked == {"train": references, "refine": set()}
    assert in_details == in_list_views == references
