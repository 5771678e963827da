"""Retention of archived runs' files (`POST /admin/collect`, `repro admin collect`): runs
archived past the retention lose their checkpoints, model and log, keep their records; a
family's reference keeps its files while a rerun of it is not archived; a file another run
shares stays; admins only, audit-logged. On real SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from service.persistence.models import Artifact, Run, RunLogChunk, Worker, utcnow
from service.runs import logs
from tests.integration import dashboard_world
from tests.integration import test_dashboard_pages as pages
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World
from tests.integration.test_run_labels import _experiment

app, world, browser, logged_in = pages.app, pages.world, pages.browser, pages.logged_in


def _file(app: Any, run_id: int, data: bytes) -> Path:
    """A checkpoint file of the run, stored as uploads store them."""
    directory = Path(app.state.settings.resolved_artifacts_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / hashlib.sha256(data).hexdigest()
    path.write_bytes(data)
    with app.state.sessionmaker() as db:
        db.add(
            Artifact(
                run_id=run_id, kind="checkpoint", name="epoch-000001.npz", epoch=1,
                sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                storage_url=path.resolve().as_uri(), attempt=1,
            )
        )  # fmt: skip
        db.commit()
    return path


def _family(app: Any, *, lr: float, name: str) -> tuple[int, int]:
    """A finished run and a finished rerun of it (its verdict against the first), the rerun
    with a line of job log."""
    first = _experiment(app, lr=lr, epochs=2, name=name)
    with app.state.sessionmaker() as db:
        original = db.get(Run, first)
        worker = db.scalars(select(Worker)).first()
        assert original is not None and worker is not None
        rerun = dashboard_world.rerun(db, original)
        dashboard_world.finish(db, rerun, worker, epochs=2)
        logs.append(db, run_id=rerun.id, attempt=1, offset=0, text="epoch 1\n", max_bytes=4096)
        db.commit()
        return first, rerun.id


def _archive(app: Any, run_id: int, days_ago: float) -> None:
    with app.state.sessionmaker() as db:
        run = db.get(Run, run_id)
        assert run is not None
        run.archived_at = utcnow() - timedelta(days=days_ago)
        db.commit()


def test_archived_runs_lose_their_files_after_the_retention_and_references_keep_theirs(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    first, second = _family(app, lr=0.002, name="retained")
    first_file = _file(app, first, b"weights of the first run")
    second_file = _file(app, second, b"weights of the rerun")
    admin = {"Authorization": f"Bearer {world.admin_token}"}

    def collect(**params: Any) -> dict[str, Any]:
        answer = browser.post("/api/v1/admin/collect", params=params, headers=admin)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    _archive(app, first, days_ago=40)
    kept = collect()
    assert kept["runs"] == [] and kept["retention_days"] == 30
    assert kept["kept"] == [
        {"run": first, "why": f"the reference of reruns not archived ({second})"}
    ]
    assert first_file.exists()

    _archive(app, second, days_ago=40)
    dry = collect(dry_run="true")
    assert dry["runs"] == [first, second] and dry["files"] == 2 and dry["kept"] == []
    assert dry["bytes"] == len(b"weights of the first run") + len(b"weights of the rerun")
    assert first_file.exists() and second_file.exists()

    done = collect()
    assert done["runs"] == [first, second] and not done["more"]
    assert not first_file.exists() and not second_file.exists()
    with app.state.sessionmaker() as db:
        assert db.scalars(select(Artifact).where(Artifact.run_id.in_([first, second]))).all() == []
        assert db.scalars(select(RunLogChunk).where(RunLogChunk.run_id == second)).all() == []
    detail = browser.get(f"/api/v1/runs/{first}", headers=admin).json()
    assert detail["files_collected_at"] and detail["metrics"]  # the record stays
    assert collect()["runs"] == []  # nothing left to do
    events = browser.get("/api/v1/audit", params={"action": "run.collect"}, headers=admin).json()[
        "items"
    ]
    assert sorted(e["target_id"] for e in events) == [first, second]
    logged_in(browser, world.viewer_token)
    assert "were removed" in browser.get(f"/runs/{first}").text


def test_a_shared_file_stays_a_recent_archive_waits_and_only_admins_collect(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    # The same bytes as the world's reference run's artifact: one stored file for both.
    with app.state.sessionmaker() as db:
        shared = db.get(Artifact, world.artifact)
        assert shared is not None
        sha, url, size = shared.sha256, shared.storage_url, shared.size
    lone = _experiment(app, lr=0.02, epochs=1, name="shares-a-file")
    with app.state.sessionmaker() as db:
        db.add(Artifact(run_id=lone, kind="checkpoint", name="epoch-000001.npz", epoch=1,
                        sha256=sha, size=size, storage_url=url, attempt=1))  # fmt: skip
        db.commit()
    _archive(app, lone, days_ago=1)
    admin = {"Authorization": f"Bearer {world.admin_token}"}
    waits = browser.post("/api/v1/admin/collect", headers=admin).json()
    assert lone not in waits["runs"]  # archived a day ago: within the 30 days
    now = browser.post("/api/v1/admin/collect", params={"retention_days": 0}, headers=admin)
    assert now.json()["runs"] == [lone]
    assert Path(url.removeprefix("file://")).exists()  # the reference run still names it
    for token in (world.submitter_token, world.viewer_token):
        refused = browser.post(
            "/api/v1/admin/collect", headers={"Authorization": f"Bearer {token}"}
        )
        assert refused.status_code == 403


def test_an_admin_deletes_a_rerun_then_its_reference_and_nothing_else(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    first, second = _family(app, lr=0.004, name="to-delete")
    stored = _file(app, second, b"the rerun's only checkpoint")
    admin = {"Authorization": f"Bearer {world.admin_token}"}
    compared = browser.get(f"/api/v1/compare?a={first}&b={second}", headers=admin)
    assert compared.status_code == 200  # a kept comparison report names both

    refused = browser.delete(f"/api/v1/runs/{first}", headers=admin)
    assert refused.status_code == 409
    assert f"runs {second} are its reruns" in refused.text and "verdicts of runs" in refused.text
    submitter = {"Authorization": f"Bearer {world.submitter_token}"}
    assert browser.delete(f"/api/v1/runs/{second}", headers=submitter).status_code == 403
    running = browser.delete(f"/api/v1/runs/{world.running}", headers=admin)
    assert running.status_code == 409 and "let it end first" in running.text

    assert browser.delete(f"/api/v1/runs/{second}", headers=admin).status_code == 204
    assert browser.get(f"/api/v1/runs/{second}", headers=admin).status_code == 404
    assert not stored.exists()
    assert browser.delete(f"/api/v1/runs/{first}", headers=admin).status_code == 204
    assert browser.get(f"/api/v1/runs/{first}", headers=admin).status_code == 404
    assert browser.get(f"/api/v1/runs/{world.reference}", headers=admin).status_code == 200
    events = browser.get("/api/v1/audit", params={"action": "run.delete"}, headers=admin)
    assert [e["target_id"] for e in events.json()["items"]] == [first, second]
