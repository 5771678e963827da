"""With `REPRO_ALLOW_CODE_BUNDLES=false`, the service queues no new work that would run a
code bundle: a spot check's replays and a refinement's re-traces of bundle runs are refused
with 409, naming the switch, and leave no row behind (real SQLite and PostgreSQL, through the
ASGI app; the runs are written as a finished service stores them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from service.app import create_app
from service.config import Settings
from service.persistence.migrate import upgrade
from service.persistence.models import Run, SpotCheck
from tests.integration import dashboard_world
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url = "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    settings = Settings(data_dir=tmp_path / "data", database_url=url, allow_code_bundles=False)
    settings.data_dir.mkdir(mode=0o755)
    upgrade(settings.resolved_database_url)
    application = create_app(settings)
    yield application
    application.state.engine.dispose()


def _counts(app: Any) -> tuple[int, int]:
    with app.state.sessionmaker() as db:
        runs = db.scalar(select(func.count()).select_from(Run))
        checks = db.scalar(select(func.count()).select_from(SpotCheck))
    return int(runs or 0), int(checks or 0)


def test_replays_and_re_traces_of_bundle_runs_are_refused_and_queue_nothing(
    app: Any, tmp_path: Path
) -> None:
    with app.state.sessionmaker() as db:
        world: World = dashboard_world.build(db, tmp_path / "artifacts", app.state.settings)
        for run_id in (world.reference, world.diverged):
            run = db.get(Run, run_id)
            assert run is not None and run.status == "succeeded"
            run.needs_code = True  # as if its spec named a code bundle
        db.commit()
    before = _counts(app)
    client = AsgiBrowser(app)
    auth = {"Authorization": f"Bearer {world.submitter_token}"}
    try:
        replay = client.post(
            f"/api/v1/runs/{world.reference}/spot-checks", json={"segments": 1}, headers=auth
        )
        refine = client.post(
            "/api/v1/compare/refine",
            json={"a": world.reference, "b": world.diverged},
            headers=auth,
        )
    finally:
        client.close()
    for answer, what in ((replay, "replaying run"), (refine, "re-tracing run")):
        assert answer.status_code == 409, answer.text
        detail = answer.json()["detail"]
        assert what in detail and "REPRO_ALLOW_CODE_BUNDLES" in detail, detail
        assert "nothing was queued" in detail
    assert _counts(app) == before
