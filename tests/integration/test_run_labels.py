"""Run names, tags and notes (issue: runs were numbers only), through the ASGI app on real
SQLite and PostgreSQL: `PATCH /runs/{id}` sets them for submitters and admins and writes
the audit log; the runs list filters by tag through the API and the dashboard; the run
page edits them with its form; bad tags and too many are refused saying why."""

from __future__ import annotations

import csv
import html
import io
import re
from typing import Any

from tests.integration import dashboard_world
from tests.integration import test_dashboard_pages as pages
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World

# The dashboard tests' fixtures: the app (SQLite and PostgreSQL), its world and a browser.
app, world, browser, logged_in = pages.app, pages.world, pages.browser, pages.logged_in


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_run_is_named_tagged_and_noted_and_found_by_its_tag(
    world: World, browser: AsgiBrowser
) -> None:
    submitter = bearer(world.submitter_token)
    url = f"/api/v1/runs/{world.diverged}"
    answer = browser.patch(
        url,
        json={"name": "lr sweep 3", "notes": "odd loss at epoch 2", "tags": ["sweep", "lr"]},
        headers=submitter,
    )
    assert answer.status_code == 200, answer.text
    run = answer.json()
    assert (run["name"], run["tags"], run["notes"]) == (
        "lr sweep 3",
        ["sweep", "lr"],
        "odd loss at epoch 2",
    )
    # Only what is given changes; tags are added and removed without repeats.
    changed = browser.patch(
        url, json={"add_tags": ["lr", "keep"], "remove_tags": ["sweep"]}, headers=submitter
    ).json()
    assert changed["tags"] == ["lr", "keep"] and changed["name"] == "lr sweep 3"
    browser.patch(
        f"/api/v1/runs/{world.identical}", json={"tags": ["keep"]}, headers=submitter
    ).raise_for_status()

    listed = browser.get("/api/v1/runs?tag=keep", headers=submitter).json()
    assert [r["id"] for r in listed["items"]] == [world.diverged, world.identical]
    assert listed["items"][0]["name"] == "lr sweep 3"
    assert browser.get("/api/v1/runs?tag=sweep", headers=submitter).json()["items"] == []
    counted = browser.get("/api/v1/runs?tag=lr&count=true", headers=submitter).json()
    assert counted["total"] == 1

    cleared = browser.patch(url, json={"name": "", "tags": None}, headers=submitter).json()
    assert cleared["name"] is None and cleared["tags"] is None
    assert cleared["notes"] == "odd loss at epoch 2"
    assert browser.get("/api/v1/runs?tag=lr", headers=submitter).json()["items"] == []

    log = browser.get("/api/v1/audit?action=run.edit", headers=bearer(world.admin_token))
    assert log.status_code == 200, log.text
    events = log.json()["items"]
    assert len(events) == 4 and {e["target_id"] for e in events} == {
        world.diverged,
        world.identical,
    }
    first = events[-1]
    assert first["actor"] == "submitter" and first["details"]["name"]["to"] == "lr sweep 3"


def test_bad_edits_are_refused_saying_why_and_viewers_may_not_edit(
    world: World, browser: AsgiBrowser
) -> None:
    url = f"/api/v1/runs/{world.reference}"
    submitter = bearer(world.submitter_token)
    for body, where in (
        ({"tags": ["-dash-first"]}, "tags"),
        ({"tags": ["x" * 65]}, "tags"),
        ({"add_tags": [f"t{i}" for i in range(33)]}, "add_tags"),
        ({"name": "n" * 201}, "name"),
        ({"title": "x"}, "title"),
    ):
        refused = browser.patch(url, json=body, headers=submitter)
        assert refused.status_code == 422, (body, refused.text)
        assert where in refused.text
    browser.patch(url, json={"tags": [f"t{i}" for i in range(30)]}, headers=submitter)
    too_many = browser.patch(url, json={"add_tags": ["a", "b", "c"]}, headers=submitter)
    assert too_many.status_code == 422 and "at most 32 tags" in too_many.text
    viewer = browser.patch(url, json={"name": "mine"}, headers=bearer(world.viewer_token))
    assert viewer.status_code == 403
    missing = browser.patch("/api/v1/runs/99999", json={"name": "x"}, headers=submitter)
    assert missing.status_code == 404


def test_the_run_page_edits_labels_and_the_runs_list_filters_and_exports_them(
    world: World, browser: AsgiBrowser
) -> None:
    logged_in(browser, world.submitter_token)
    page = f"/runs/{world.reference}"
    csrf = browser.csrf(page)
    saved = browser.post(
        f"{page}/labels",
        data={"csrf": csrf, "name": "baseline", "tags": "gold, v1 v1", "notes": "first"},
    )
    assert saved.status_code == 303 and saved.headers["location"] == page
    shown = browser.get(page).text
    assert '<span class="run-name">baseline</span>' in shown
    assert 'href="/?tag=gold"' in shown and ">v1</a>" in shown and "first" in shown

    refused = browser.post(f"{page}/labels", data={"csrf": csrf, "tags": "ok, !bad"})
    assert refused.status_code == 400 and "tags" in refused.text

    listed = browser.get("/?tag=gold").text
    assert f'href="/runs/{world.reference}"' in listed
    assert f'href="/runs/{world.diverged}"' not in listed
    exported = browser.get("/runs/export.csv?tag=gold").text
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [(r["id"], r["name"], r["tags"]) for r in rows] == [
        (str(world.reference), "baseline", "gold v1")
    ]
    # The experiment filter says "name contains", and does so.
    name = dashboard_world.HOSTILE
    part = browser.get("/", params={"experiment": name[2:8]}).text
    assert f'href="/runs/{world.reference}"' in part


def _experiment(app: Any, *, lr: float, epochs: int, name: str) -> int:
    """A finished run of a spec with this learning rate and epochs (final accuracy
    0.5 + epochs/40, as dashboard_world.finish records it)."""
    from sqlalchemy import select

    from service.persistence.models import Worker
    from service.runs.experiments import create_experiment
    from worker.spec import ExperimentSpec

    doc = dashboard_world.spec_doc(name=name, epochs=epochs)
    doc["training"]["optimizer"]["params"]["learning_rate"] = lr
    with app.state.sessionmaker() as db:
        worker = db.scalars(select(Worker)).one()
        _, run, _ = create_experiment(
            db=db, spec=ExperimentSpec.model_validate(doc), settings=app.state.settings
        )
        dashboard_world.finish(db, run, worker, epochs=epochs)
        return run.id


def test_runs_are_searched_by_params_metrics_tags_and_status(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    fast_long = _experiment(app, lr=0.003, epochs=3, name="lr-fast")  # accuracy 0.575
    fast_short = _experiment(app, lr=0.003, epochs=1, name="lr-fast")  # accuracy 0.525
    slow = _experiment(app, lr=0.01, epochs=3, name="lr-slow")
    headers = bearer(world.viewer_token)

    def found(search: str) -> list[int]:
        answer = browser.get("/api/v1/runs", params={"search": search}, headers=headers)
        assert answer.status_code == 200, answer.text
        return [r["id"] for r in answer.json()["items"]]

    wanted = "params.training.optimizer.params.learning_rate = 0.003 and metrics.accuracy > 0.55"
    assert found(wanted) == [fast_long]
    assert found("params.training.optimizer.params.learning_rate = 0.003") == [
        fast_short,
        fast_long,
    ]
    assert found(
        "params.training.optimizer.params.learning_rate >= 0.003 AND metrics.accuracy >= 0.575"
    ) == [
        slow,
        fast_long,
    ]
    assert found("params.training.optimizer.name = 'adam' and experiment ~ lr-") == [
        slow,
        fast_short,
        fast_long,
    ]
    assert found("params.model.params.hidden = '[8]' and experiment = lr-slow") == [slow]
    assert found("status = running") == [world.running]
    browser.patch(
        f"/api/v1/runs/{slow}", json={"tags": ["keep"]}, headers=bearer(world.submitter_token)
    ).raise_for_status()
    assert found("tag = keep and metrics.loss < 1") == [slow]
    assert slow not in found("tag != keep and experiment ~ lr-")
    total = browser.get(
        "/api/v1/runs", params={"search": wanted, "count": "true"}, headers=headers
    ).json()["total"]
    assert total == 1

    for bad, says in (
        ("metrics.accuracy > high", "compared with a number"),
        ("params.x ~ 3", "needs a number"),
        ("colour = red", "unknown key 'colour'"),
        ("status = running or status = queued", "joined by `and`"),
        ("metrics.accuracy >", "incomplete clause"),
    ):
        refused = browser.get("/api/v1/runs", params={"search": bad}, headers=headers)
        assert refused.status_code == 422, (bad, refused.text)
        assert says in refused.text, (bad, refused.text)

    # The dashboard's runs list takes the same search.
    logged_in(browser, world.viewer_token)
    page = browser.get("/", params={"search": wanted}).text
    assert f'href="/runs/{fast_long}"' in page and f'href="/runs/{fast_short}"' not in page
    assert browser.get("/", params={"search": "colour = red"}).status_code == 422


def test_an_archived_run_leaves_the_lists_and_comes_back_under_archived(
    world: World, browser: AsgiBrowser
) -> None:
    submitter = bearer(world.submitter_token)

    def listed(**params: str) -> list[int]:
        answer = browser.get("/api/v1/runs", params=params, headers=submitter)
        assert answer.status_code == 200, answer.text
        return [r["id"] for r in answer.json()["items"]]

    assert world.diverged in listed()
    archived = browser.post(f"/api/v1/runs/{world.diverged}/archive", headers=submitter)
    assert archived.status_code == 200 and archived.json()["archived_at"], archived.text
    assert world.diverged not in listed()
    assert listed(archived="true") == [world.diverged]
    assert world.diverged in listed(archived="any") and world.reference in listed(archived="any")
    running = browser.post(f"/api/v1/runs/{world.running}/archive", headers=submitter)
    assert running.status_code == 409 and "let it end first" in running.text
    viewer = browser.post(
        f"/api/v1/runs/{world.reference}/archive", headers=bearer(world.viewer_token)
    )
    assert viewer.status_code == 403

    # The dashboard: gone from the default list, there under "only archived", and back.
    logged_in(browser, world.submitter_token)
    assert f'href="/runs/{world.diverged}"' not in browser.get("/").text
    only = browser.get("/?archived=only").text
    assert f'href="/runs/{world.diverged}"' in only and "archived</span>" in only
    page = f"/runs/{world.diverged}"
    back = browser.post(f"{page}/unarchive", data={"csrf": browser.csrf(page)})
    assert back.status_code == 303
    assert f'href="/runs/{world.diverged}"' in browser.get("/").text
    assert world.diverged in listed()
    actions = browser.get(
        "/api/v1/audit", params={"action": "run.archive"}, headers=bearer(world.admin_token)
    ).json()["items"]
    assert [a["target_id"] for a in actions] == [world.diverged]


def test_the_runs_list_shows_the_params_that_differ_and_picked_ones_and_exports_them(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    fast = _experiment(app, lr=0.003, epochs=3, name="cols-a")
    slow = _experiment(app, lr=0.01, epochs=3, name="cols-b")
    logged_in(browser, world.viewer_token)
    lr = "training.optimizer.params.learning_rate"

    def headings(page: str) -> list[str]:
        return re.findall(r'<th class="param" title="params\.([^" ]+)', page)

    def cells(page: str, run_id: int) -> list[str]:
        row = page.split(f'<tr id="run-{run_id}"', 1)[1].split("</tr>", 1)[0]
        return re.findall(r'<td class="(?:num|param)">(?:<span[^>]*>)?([^<]*)<', row)[-2:]

    # Unasked: the one parameter that differs (the names differ too, and have a column).
    page = browser.get("/", params={"experiment": "cols-"}).text
    assert headings(page) == [lr]
    assert "differs between runs on this page" in page
    # Picked: shown first, with a link that hides it; the differing one still follows.
    page = browser.get("/", params={"experiment": "cols-", "param": "training.epochs"}).text
    assert headings(page) == ["training.epochs", lr]
    assert cells(page, fast) == ["3", "0.003"] and cells(page, slow) == ["3", "0.01"]
    assert 'aria-label="hide the column training.epochs"' in page

    # The export holds the columns shown: the page's link names them all.
    link = re.search(r'href="(/runs/export\.csv\?[^"]+)"', page).group(1)  # type: ignore[union-attr]
    exported = browser.get(html.unescape(link)).text
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(exported))}
    assert set(rows) == {str(fast), str(slow)}
    assert (
        rows[str(fast)][f"params.{lr}"] == "0.003"
        and rows[str(slow)]["params.training.epochs"] == "3.0"
    )
    assert float(rows[str(fast)]["metrics.loss"]) > 0 and "metrics.eval_accuracy" in rows[str(fast)]
    as_json = browser.get(html.unescape(link).replace("export.csv", "export.json")).json()
    assert {r["id"]: r[f"params.{lr}"] for r in as_json} == {fast: 0.003, slow: 0.01}

    too_many = [("param", f"p{i}") for i in range(7)]
    refused = browser.get("/", params=[("experiment", "cols-"), *too_many])
    assert refused.status_code == 400 and "at most 6 parameter columns" in refused.text
