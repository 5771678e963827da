"""Odd numbers from a worker (a text epoch, a list, an integer of 400 digits) are refused with
422 and nothing stored; a value stored before that check never makes a page answer 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.auth import tokens as auth
from service.config import Settings
from service.persistence.migrate import upgrade
from service.persistence.models import Run
from tests.integration import dashboard_world
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World

HUGE = 10**400  # an integer JSON carries and no double holds
ODD_VALUES: list[Any] = ["abc", [1], {"n": 1}, HUGE, -HUGE, True]


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url = "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    settings = Settings(data_dir=tmp_path / "data", database_url=url)
    settings.data_dir.mkdir(mode=0o700)
    upgrade(settings.resolved_database_url)
    application = create_app(settings)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def world(app: Any, tmp_path: Path) -> World:
    with app.state.sessionmaker() as db:
        return dashboard_world.build(db, tmp_path / "artifacts", app.state.settings)


@pytest.fixture
def browser(app: Any) -> Iterator[AsgiBrowser]:
    b = AsgiBrowser(app)
    yield b
    b.close()


def _post(browser: AsgiBrowser, token: str, path: str, doc: dict[str, Any]) -> Any:
    # json.dumps writes any integer, however long: the body a broken worker could send.
    return browser.post(
        path,
        content=json.dumps(doc),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )


def _held_run(app: Any, browser: AsgiBrowser) -> tuple[str, int, int]:
    with app.state.sessionmaker() as db:
        _, token = auth.create_token(db=db, name="odd-worker", role="worker")
    registered = _post(browser, token, "/api/v1/workers/register", {"name": "odd"})
    assert registered.status_code == 201, registered.text
    worker_id = int(registered.json()["id"])
    claimed = _post(browser, token, f"/api/v1/workers/{worker_id}/claim?wait=0", {})
    assert claimed.status_code == 200, claimed.text
    return token, worker_id, int(claimed.json()["run"]["id"])


def _stored(app: Any, run_id: int) -> tuple[Any, Any]:
    with app.state.sessionmaker() as db:
        run = db.get(Run, run_id)
        assert run is not None
        return run.progress, run.metrics


@pytest.mark.parametrize("field", ["epoch", "step", "epochs", "loss"])
def test_odd_progress_numbers_are_refused_and_nothing_is_stored(
    app: Any, world: World, browser: AsgiBrowser, field: str
) -> None:
    token, worker_id, run_id = _held_run(app, browser)
    beat = f"/api/v1/runs/{run_id}/heartbeat"
    fine = {"event": "epoch_end", "epoch": 1, "step": 4, "epochs": 3, "loss": 0.5}
    assert _post(browser, token, beat, {"worker_id": worker_id, "progress": fine}).is_success
    for value in ODD_VALUES:
        if field == "loss" and value is True:
            continue  # a flag where a number goes is refused below for counters only
        odd = _post(
            browser, token, beat, {"worker_id": worker_id, "progress": {**fine, field: value}}
        )
        assert odd.status_code == 422, (field, value, odd.text)
        assert f"progress.{field}" in odd.text
        assert _stored(app, run_id)[0] == fine
    # A negative or out-of-range counter is refused the same way.
    if field != "loss":
        for value in (-1, 2**31):
            odd = _post(browser, token, beat, {"worker_id": worker_id, "progress": {field: value}})
            assert odd.status_code == 422, (field, value, odd.text)


def test_odd_metrics_in_a_result_are_refused_and_nothing_is_stored(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    token, worker_id, run_id = _held_run(app, browser)
    for row in (
        {"epoch": 1, "loss": HUGE},
        {"epoch": "abc", "loss": 0.1},
        {"epoch": 1, "loss": [1]},
    ):
        result = {"status": "succeeded", "metrics": [row]}
        done = _post(
            browser,
            token,
            f"/api/v1/runs/{run_id}/complete",
            {"worker_id": worker_id, "result": result},
        )
        assert done.status_code == 422, (row, done.text)
        assert "metrics.0." in done.text
        _, metrics = _stored(app, run_id)
        assert metrics is None or metrics == []


def _pages(world: World, run_id: int) -> list[str]:
    return [
        f"/runs/{run_id}",
        f"/runs/{run_id}/live",
        f"/runs/{run_id}/certificate",
        f"/experiments/{world.experiment}",
        "/",
    ]


@pytest.mark.parametrize("value", ODD_VALUES, ids=lambda v: repr(v)[:12])
def test_odd_values_stored_before_the_check_never_break_a_page(
    app: Any, world: World, browser: AsgiBrowser, value: Any
) -> None:
    with app.state.sessionmaker() as db:
        running = db.get(Run, world.running)
        reference = db.get(Run, world.reference)
        assert running is not None and reference is not None
        running.progress = {"event": "epoch_end", "epoch": value, "step": value, "loss": value}
        reference.metrics = [
            {"epoch": value, "step": value, "loss": value, "accuracy": value, "seconds": value}
        ]
        db.commit()
    api = {"Authorization": f"Bearer {world.viewer_token}"}
    for run_id in (world.running, world.reference):
        answer = browser.get(f"/api/v1/runs/{run_id}", headers=api)
        assert answer.status_code == 200, (run_id, answer.text[:500])
    assert browser.login(world.viewer_token).status_code == 303
    for run_id in (world.running, world.reference):
        for page in _pages(world, run_id):
            answer = browser.get(page)
            assert answer.status_code == 200, (page, answer.text[:500])
