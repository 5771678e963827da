"""Comparing runs is a read: a viewer comparing any number of pairs, through the API or the
dashboard, leaves the kept comparison reports bounded by `max_stored_comparisons` (besides
a rerun's report against its family's reference), and still gets every report whole."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.app import create_app
from service.config import Settings
from service.persistence.models import ComparisonRecord, Run, Worker
from service.runs.experiments import create_experiment
from service.schemas import ComparisonReport
from service.verification import comparisons
from tests.integration import dashboard_world
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World
from worker.spec import ExperimentSpec

KEPT = 5


@pytest.fixture
def app(migrated_settings: Settings) -> Iterator[Any]:
    settings = migrated_settings.model_copy(update={"max_stored_comparisons": KEPT})
    application = create_app(settings)
    yield application
    application.state.engine.dispose()


def _other_families(app: Any, world: World, count: int) -> list[int]:
    """Finished runs of `count` experiments of their own, each its family's reference."""
    ids = []
    with app.state.sessionmaker() as db:
        worker = db.scalars(select(Worker).where(Worker.name == world.worker)).one()
        for i in range(count):
            spec = ExperimentSpec.model_validate(dashboard_world.spec_doc(f"other {i}"))
            _, run, _ = create_experiment(db=db, spec=spec, settings=app.state.settings)
            dashboard_world.finish(db, run, worker)
            ids.append(run.id)
    return ids


def _rows(app: Any) -> list[tuple[int, int]]:
    with app.state.sessionmaker() as db:
        found = db.execute(select(ComparisonRecord.run_a_id, ComparisonRecord.run_b_id))
        return [(a, b) for a, b in found]


def _expected(app: Any, a: int, b: int) -> dict[str, Any]:
    """The full report of the pair, computed directly, as the API serves it."""
    with app.state.sessionmaker() as db:
        report = comparisons.compare(db, db.get_one(Run, a), db.get_one(Run, b))
    return ComparisonReport.model_validate(report).model_dump(mode="json")


def test_comparing_many_pairs_keeps_few_reports_and_answers_them_whole(
    app: Any, tmp_path: Path
) -> None:
    with app.state.sessionmaker() as db:
        world = dashboard_world.build(db, tmp_path / "artifacts", app.state.settings)
    finished = [world.reference, world.identical, world.diverged, world.failed]
    finished += _other_families(app, world, 3)
    pairs = list(itertools.permutations(finished, 2))
    family = (world.reference, world.failed)  # a failed rerun has no verdict to hold it
    pairs.remove(family)
    browser = AsgiBrowser(app)
    try:
        assert browser.login(world.viewer_token).status_code == 303
        api = {"Authorization": f"Bearer {world.viewer_token}"}
        before = len(_rows(app))
        first = browser.get(f"/api/v1/compare?a={family[0]}&b={family[1]}", headers=api)
        assert first.status_code == 200, first.text
        answers = {}
        for n, (a, b) in enumerate(pairs):
            if n % 3 == 0:  # some through the dashboard's page, the rest through the API
                page = browser.get(f"/compare?a={a}&b={b}")
                assert page.status_code == 200, page.text[:2000]
                assert f"run {a}" in page.text and f"run {b}" in page.text
            answer = browser.get(f"/api/v1/compare?a={a}&b={b}", headers=api)
            assert answer.status_code == 200, answer.text
            answers[a, b] = answer.json()
        rows = _rows(app)
        # Besides the family's report, at most KEPT others, however many pairs were read.
        assert len(pairs) > 4 * KEPT
        assert len(rows) - before <= KEPT + 1, len(rows)
        assert family in rows
        # Every answer is the full report, whether it was kept or computed again.
        again = {
            (a, b): browser.get(f"/api/v1/compare?a={a}&b={b}", headers=api).json()
            for a, b in pairs[:KEPT]
        }
        assert again == {pair: answers[pair] for pair in pairs[:KEPT]}
        for (a, b), answer in answers.items():
            assert answer == _expected(app, a, b), (a, b)
        assert first.json() == _expected(app, *family)
        assert len(_rows(app)) - before <= KEPT + 1
    finally:
        browser.close()


def test_the_bound_has_a_default_and_an_environment_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().max_stored_comparisons == 1000
    monkeypatch.setenv("REPRO_MAX_STORED_COMPARISONS", "0")
    assert Settings().max_stored_comparisons == 0


def test_a_bound_of_zero_keeps_only_the_family_reports(app: Any, tmp_path: Path) -> None:
    with app.state.sessionmaker() as db:
        world = dashboard_world.build(db, tmp_path / "artifacts", app.state.settings)
    others = _other_families(app, world, 2)
    with app.state.sessionmaker() as db:
        report = comparisons.compare_ids(db, others[0], others[1], max_stored=0)
        family = comparisons.compare_ids(db, world.reference, world.failed, max_stored=0)
    served = ComparisonReport.model_validate(report).model_dump(mode="json")
    assert served == _expected(app, others[0], others[1])
    assert (family["a"], family["b"]) == (world.reference, world.failed)
    assert _rows(app) == [(world.reference, world.failed)]
