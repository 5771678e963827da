"""Archiving experiments, datasets, model definitions and code bundles, the retention of a
stored file's bytes, and admins' deletes: an archived dataset is left out of lists and
refused to new experiments while its runs rerun; its bytes go only once every run that used
it is archived; pushing it again restores it; a delete waits until nothing names it. On
real SQLite and PostgreSQL, through the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.persistence.models import AuditEvent, Run, Worker
from service.runs.experiments import create_experiment
from tests.code_wheels import ring_bundle
from tests.integration import dashboard_world
from tests.integration import test_dashboard_pages as pages
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World
from tests.integration.test_checkpoint_structure import small_definition
from tests.integration.test_datasets_api import ARRAYS_SPEC, digits_like, sha256
from tests.integration.test_run_labels import _experiment, bearer
from worker.spec import ExperimentSpec

app, world, browser = pages.app, pages.world, pages.browser


def _push(browser: AsgiBrowser, token: str, body: bytes) -> Any:
    return browser.post(
        "/api/v1/datasets",
        params={"name": "digits.npz"},
        content=body,
        headers={**bearer(token), "X-Content-SHA256": sha256(body)},
    )


def _trained_on(app: Any, digest: str) -> Run:
    """A finished run of an experiment training on the dataset of `digest`."""
    doc = {**ARRAYS_SPEC, "dataset": {**ARRAYS_SPEC["dataset"], "data": digest}}
    with app.state.sessionmaker() as db:
        worker = db.scalars(select(Worker)).one()
        _, run, _ = create_experiment(
            db=db, spec=ExperimentSpec.model_validate(doc), settings=app.state.settings
        )
        dashboard_world.finish(db, run, worker, epochs=2)
        db.expunge(run)
        return run


def _stored_file(app: Any, digest: str) -> Path:
    root = Path(app.state.settings.resolved_datasets_dir)
    return next(p for p in root.rglob("*") if p.is_file() and digest.split(":")[1] in p.name)


def test_an_archived_dataset_keeps_its_runs_rerunnable_loses_its_bytes_late_and_comes_back(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    body = digits_like()
    digest = sha256(body)
    submitter, admin = bearer(world.submitter_token), bearer(world.admin_token)
    assert _push(browser, world.submitter_token, body).status_code == 201
    run = _trained_on(app, digest)
    stored = _stored_file(app, digest)

    answer = browser.post(f"/api/v1/datasets/{digest}/archive", headers=submitter)
    assert answer.status_code == 200, answer.text
    assert answer.json()["archived_at"] is not None and answer.json()["runs"] == [run.id]
    listed = browser.get("/api/v1/datasets", headers=submitter).json()
    assert digest not in [d["digest"] for d in listed["items"]]
    archived = browser.get("/api/v1/datasets", params={"archived": "true"}, headers=submitter)
    assert [d["digest"] for d in archived.json()["items"]] == [digest]

    # A new experiment may not name it; the run that trained on it reruns as before.
    spec = {**ARRAYS_SPEC, "dataset": {**ARRAYS_SPEC["dataset"], "data": digest}}
    refused = browser.post("/api/v1/experiments", json=spec, headers=submitter)
    assert refused.status_code == 422, refused.text
    assert "is archived: bring it back (repro dataset archive --undo" in refused.text
    rerun = browser.post(f"/api/v1/runs/{run.id}/rerun", headers=submitter)
    assert rerun.status_code == 202, rerun.text
    rerun_id = rerun.json()["id"]

    def collect() -> dict[str, Any]:
        found = browser.post("/api/v1/admin/collect", params={"retention_days": 0}, headers=admin)
        assert found.status_code == 200, found.text
        answer: dict[str, Any] = found.json()
        return answer

    # While a run that used it is in the lists (the queued rerun), its bytes stay.
    kept = collect()
    assert kept["stored"] == []
    assert [(f["kind"], f["digest"]) for f in kept["stored_kept"]] == [("dataset", digest)]
    assert str(rerun_id) in kept["stored_kept"][0]["why"] and stored.exists()

    assert browser.post(f"/api/v1/runs/{rerun_id}/cancel", headers=submitter).status_code == 200
    experiment = browser.post(f"/api/v1/experiments/{run.experiment_id}/archive", headers=submitter)
    assert experiment.status_code == 200, experiment.text
    gone = collect()
    assert gone["stored"] == [
        {"kind": "dataset", "digest": digest, "bytes": len(body), "why": None}
    ]
    assert not stored.exists()
    record = browser.get(f"/api/v1/datasets/{digest}", headers=submitter).json()
    assert record["files_collected_at"] is not None and record["runs"] == [rerun_id, run.id]
    assert collect()["stored"] == []  # collected once

    # A rerun now cannot have the data: it says so and how to bring it back.
    refused = browser.post(f"/api/v1/runs/{run.id}/rerun", headers=submitter)
    assert refused.status_code == 409, refused.text
    assert "bytes of dataset" in refused.text and "push the same file again" in refused.text
    again = _push(browser, world.submitter_token, body)
    assert again.status_code == 201, again.text
    assert again.json()["files_collected_at"] is None and again.json()["archived_at"] is None
    assert stored.read_bytes() == body
    assert browser.post(f"/api/v1/runs/{run.id}/rerun", headers=submitter).status_code == 202

    with app.state.sessionmaker() as db:
        actions = db.scalars(
            select(AuditEvent.action)
            .where(AuditEvent.target_type == "dataset")
            .order_by(AuditEvent.id)
        ).all()
    assert actions == ["dataset.push", "dataset.archive", "dataset.collect", "dataset.restore"]


def test_only_admins_delete_a_dataset_and_only_once_no_experiment_names_it(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    body = digits_like(seed=3)
    digest = sha256(body)
    submitter, admin = bearer(world.submitter_token), bearer(world.admin_token)
    assert _push(browser, world.submitter_token, body).status_code == 201
    run = _trained_on(app, digest)
    stored = _stored_file(app, digest)

    assert browser.delete(f"/api/v1/datasets/{digest}", headers=submitter).status_code == 403
    named = browser.delete(f"/api/v1/datasets/{digest}", headers=admin)
    assert named.status_code == 409, named.text
    assert f"experiments {run.experiment_id} name it" in named.text
    busy = browser.delete(f"/api/v1/experiments/{run.experiment_id}", headers=admin)
    assert busy.status_code == 409 and f"still has runs ({run.id})" in busy.text

    assert browser.delete(f"/api/v1/runs/{run.id}", headers=admin).status_code == 204
    deleted = browser.delete(f"/api/v1/experiments/{run.experiment_id}", headers=admin)
    assert deleted.status_code == 204, deleted.text
    assert browser.delete(f"/api/v1/datasets/{digest}", headers=admin).status_code == 204
    assert not stored.exists()
    assert browser.get(f"/api/v1/datasets/{digest}", headers=submitter).status_code == 404
    spec = {**ARRAYS_SPEC, "dataset": {**ARRAYS_SPEC["dataset"], "data": digest}}
    gone = browser.post("/api/v1/experiments", json=spec, headers=submitter)
    assert gone.status_code == 422, gone.text
    assert f"no dataset {digest} is stored on this server" in gone.text
    assert "(repro dataset push)" in gone.text and gone.json()["errors"][0]["loc"] == "dataset.data"
    experiment = browser.get(f"/api/v1/experiments/{run.experiment_id}", headers=submitter)
    assert experiment.status_code == 404


def test_an_experiment_is_archived_with_its_runs_and_brought_back_with_just_those(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    headers = bearer(world.submitter_token)
    first = _experiment(app, lr=0.004, epochs=1, name="archived-together")
    with app.state.sessionmaker() as db:
        original = db.get(Run, first)
        worker = db.scalars(select(Worker)).one()
        assert original is not None
        experiment_id = original.experiment_id
        alone = dashboard_world.rerun(db, original)
        dashboard_world.finish(db, alone, worker, epochs=1)
        running = dashboard_world.rerun(db, original)
        running.status = "running"
        db.commit()
        alone_id, running_id = alone.id, running.id
    assert browser.post(f"/api/v1/runs/{alone_id}/archive", headers=headers).status_code == 200

    busy = browser.post(f"/api/v1/experiments/{experiment_id}/archive", headers=headers)
    assert busy.status_code == 409 and f"({running_id})" in busy.text
    assert browser.post(f"/api/v1/runs/{running_id}/cancel", headers=headers).status_code == 200
    answer = browser.post(f"/api/v1/experiments/{experiment_id}/archive", headers=headers)
    assert answer.status_code == 200 and answer.json()["archived_at"] is not None

    def runs(archived: str) -> set[int]:
        page = browser.get(
            "/api/v1/runs",
            params={"experiment_id": experiment_id, "archived": archived},
            headers=headers,
        )
        assert page.status_code == 200, page.text
        return {r["id"] for r in page.json()["items"]}

    def experiments(archived: str) -> set[int]:
        page = browser.get(
            "/api/v1/experiments", params={"archived": archived, "limit": 500}, headers=headers
        )
        return {e["id"] for e in page.json()["items"]}

    assert runs("false") == set() and runs("true") == {first, alone_id, running_id}
    assert experiment_id not in experiments("false") and experiment_id in experiments("true")

    back = browser.post(f"/api/v1/experiments/{experiment_id}/unarchive", headers=headers)
    assert back.status_code == 200 and back.json()["archived_at"] is None
    assert runs("false") == {first, running_id}  # the run archived on its own stays so
    assert runs("true") == {alone_id}
    assert experiment_id in experiments("false")
    with app.state.sessionmaker() as db:
        details = db.scalars(
            select(AuditEvent.details)
            .where(AuditEvent.action.in_(["experiment.archive", "experiment.unarchive"]))
            .order_by(AuditEvent.id)
        ).all()
    assert details == [{"runs": 2}, {"runs": 2}]  # the run archived before is not counted


@pytest.mark.parametrize("kind", ["models", "code"])
def test_an_archived_definition_or_bundle_no_run_used_loses_its_bytes_and_a_push_restores_them(
    app: Any, world: World, browser: AsgiBrowser, kind: str
) -> None:
    headers = bearer(world.submitter_token)
    if kind == "models":
        body, params, space = small_definition(), {"name": "small.json"}, "models"
    else:
        wheel = "ring_bundle-1.0-py3-none-any.whl"
        body, params, space = ring_bundle(), {"name": "rings", "filename": wheel}, "code"
    digest = sha256(body)
    sent = {**headers, "X-Content-SHA256": digest}
    pushed = browser.post(f"/api/v1/{kind}", params=params, content=body, headers=sent)
    assert pushed.status_code == 201, pushed.text
    root = Path(app.state.settings.data_dir)

    def stored() -> list[Path]:
        return [p for p in root.rglob(digest.split(":")[1] + "*") if space in str(p)]

    assert len(stored()) == 1
    assert browser.post(f"/api/v1/{kind}/{digest}/archive", headers=headers).status_code == 200
    listed = browser.get(f"/api/v1/{kind}", headers=headers).json()["items"]
    assert digest not in [r["digest"] for r in listed]

    found = browser.post(
        "/api/v1/admin/collect",
        params={"retention_days": 0},
        headers=bearer(world.admin_token),
    )
    assert found.status_code == 200, found.text
    noun = "model definition" if kind == "models" else "code bundle"
    assert [(f["kind"], f["digest"]) for f in found.json()["stored"]] == [(noun, digest)]
    assert stored() == []
    shown = browser.get(f"/api/v1/{kind}/{digest}", headers=headers).json()
    assert shown["files_collected_at"] is not None

    again = browser.post(f"/api/v1/{kind}", params=params, content=body, headers=sent)
    assert again.status_code == 201, again.text
    assert again.json()["files_collected_at"] is None and again.json()["archived_at"] is None
    content = browser.get(f"/api/v1/{kind}/{digest}/content", headers=headers)
    assert content.status_code == 200 and content.content == body and len(stored()) == 1


def test_the_dashboard_archives_a_dataset_and_an_experiment_from_their_pages(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    body = digits_like(seed=5)
    digest = sha256(body)
    assert _push(browser, world.submitter_token, body).status_code == 201
    run = _trained_on(app, digest)
    pages.logged_in(browser, world.submitter_token)

    page = f"/datasets/{digest}"
    assert 'action="/datasets/' in browser.get(page).text
    done = browser.post(f"{page}/archive", data={"csrf": browser.csrf(page)})
    assert done.status_code == 303 and done.headers["location"] == page
    shown = browser.get(page).text
    pages.strict_parse(shown)
    assert "archived</span>" in shown and f'action="{page}/unarchive"' in shown
    assert f'href="{page}"' not in browser.get("/datasets").text
    archived = browser.get("/datasets", params={"archived": 1}).text
    pages.strict_parse(archived)
    assert f'href="{page}"' in archived and "Back to the others" in archived

    experiment = f"/experiments/{run.experiment_id}"
    done = browser.post(f"{experiment}/archive", data={"csrf": browser.csrf(experiment)})
    assert done.status_code == 303
    shown = browser.get(experiment).text
    pages.strict_parse(shown)
    assert "archived</span> with its runs" in shown
    assert f'href="{experiment}"' not in browser.get("/experiments").text
    only = browser.get("/experiments", params={"archived": 1}).text
    assert f'href="{experiment}"' in only
    assert f'href="/runs/{run.id}"' not in browser.get("/").text
    # Viewers see the state but no buttons.
    pages.logged_in(browser, world.viewer_token)
    assert 'action="/experiments/' not in browser.get(experiment).text
