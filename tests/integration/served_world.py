"""`repro serve` on a database holding the dashboard world (see dashboard_world): real
runs as completion stores them, without training a model, behind a real server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.persistence.engine import make_engine
from service.persistence.models import Run, Worker
from tests.integration import dashboard_world
from tests.integration.dashboard_world import World
from tests.integration.service_procs import Service


@contextmanager
def served_world(
    tmp_path: Path, database_url: str | None, *, max_compare_runs: int = 20
) -> Iterator[tuple[Service, World, int]]:
    """A ready server on the database (None: its default SQLite file), holding the dashboard
    world plus the id of a second identical rerun of its reference run, whose environment
    differs in one library version (numpy 2.5.0)."""
    env = {"REPRO_MAX_COMPARE_RUNS": str(max_compare_runs)}
    service = Service(tmp_path / "data", database_url=database_url, env=env, extra=("--no-demo",))
    try:
        service.wait_ready()
        settings = Settings(data_dir=tmp_path / "data", database_url=database_url or "")
        engine = make_engine(settings.resolved_database_url)
        try:
            with Session(engine, expire_on_commit=False) as db:
                world = dashboard_world.build(db, tmp_path / "artifacts", settings)
                third = _identical_rerun(db, world)
        finally:
            engine.dispose()
        yield service, world, third
    finally:
        service.stop()


def _identical_rerun(db: Session, world: World) -> int:
    reference = db.get(Run, world.reference)
    worker = db.scalars(select(Worker).where(Worker.name == world.worker)).one()
    assert reference is not None
    run = dashboard_world.rerun(db, reference)
    dashboard_world.finish(db, run, worker)
    recorded = run.provenance or {}
    run.provenance = {**recorded, "libraries": {**recorded["libraries"], "numpy": "2.5.0"}}
    db.commit()
    return run.id
