"""The dashboard's lists on real SQLite and PostgreSQL through the app: experiments paged and
filtered by name, pushed datasets and what trained on them, and the runs list sorted by a
recorded metric both ways, a page at a time, runs without the metric last."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from service.app import create_app
from service.auth import tokens as auth
from service.config import Settings
from service.persistence.engine import make_engine
from service.persistence.migrate import upgrade
from service.persistence.models import Experiment
from service.runs.experiments import create_experiment
from tests.integration import dashboard_world
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import HOSTILE, World, spec_doc
from tests.integration.test_datasets_api import ARRAYS_SPEC, digits_like, sha256
from worker.spec import ExperimentSpec

html5lib = pytest.importorskip("html5lib", reason="html5lib is not installed (test extra)")


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url = "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    settings = Settings(data_dir=tmp_path / "data", database_url=url)
    settings.data_dir.mkdir(mode=0o755)
    upgrade(settings.resolved_database_url)
    application = create_app(settings)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def world(app: Any, tmp_path: Path) -> World:
    with app.state.sessionmaker() as db:
        return dashboard_world.build(db, tmp_path / "artifacts", app.state.settings)


@pytest.fixture
def browser(app: Any, world: World) -> Iterator[AsgiBrowser]:
    b = AsgiBrowser(app)
    assert b.login(world.admin_token).status_code == 303
    yield b
    b.close()


def valid(page: Any) -> str:
    assert page.status_code == 200, page.text[:2000]
    html5lib.HTMLParser(strict=True).parse(page.text)
    return str(page.text)


def link(text: str, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" rel="{rel}">', text)
    return html.unescape(found.group(1)) if found else None


def _experiments(app: Any, names: list[str], spec: dict[str, Any] | None = None) -> list[int]:
    with app.state.sessionmaker() as db:
        made = []
        for name in names:
            doc = {**(spec or spec_doc()), "name": name}
            parsed = ExperimentSpec.model_validate(doc)
            experiment, _, _ = create_experiment(db=db, spec=parsed, settings=app.state.settings)
            made.append(experiment.id)
        return made


def test_experiments_list_pages_and_filters_by_name(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    made = _experiments(app, [f"alpha-{i}" for i in range(40)] + [f"beta_{i}" for i in range(13)])
    first = valid(browser.get("/experiments"))
    assert '<a href="/experiments">Experiments</a>' in first  # in the navigation
    seen = [int(i) for i in re.findall(r'<tr id="experiment-(\d+)">', first)]
    assert len(seen) == 50 and seen == sorted(seen, reverse=True) and seen[0] == made[-1]
    older = link(first, "next")
    assert older is not None
    second = valid(browser.get(older))
    rest = [int(i) for i in re.findall(r'<tr id="experiment-(\d+)">', second)]
    every = {world.experiment, *made} | {e for e in range(1, made[-1] + 1)}
    assert sorted(seen + rest, reverse=True) == seen + rest and set(seen + rest) == every
    assert link(second, "next") is None
    newer = link(second, "prev")
    assert newer is not None
    again = [int(i) for i in re.findall(r'<tr id="experiment-(\d+)">', browser.get(newer).text)]
    assert again == seen
    # The family with verdicts: its runs, latest run and verdicts at a glance; hostile text escaped.
    row = re.search(rf'<tr id="experiment-{world.experiment}">(.*?)</tr>', second, flags=re.S)
    assert row is not None
    assert f'href="/experiments/{world.experiment}"' in row.group(1)
    assert ">5</a>" in row.group(1)  # the reference and four reruns
    assert "1 identical" in row.group(1) and "1 diverged" in row.group(1)
    assert f"#{world.running}</a>" in row.group(1) and "running" in row.group(1)
    assert HOSTILE not in second and "&lt;script&gt;" in second
    # By name: a part of it, any case; wildcards are literal.
    beta = valid(browser.get("/experiments?name=BETA_"))
    ids = [int(i) for i in re.findall(r'<tr id="experiment-(\d+)">', beta)]
    assert ids == sorted(made[40:], reverse=True)
    assert link(beta, "next") is None
    assert "No experiments match." in valid(browser.get("/experiments?name=%25"))
    assert browser.get("/experiments?name=" + "x" * 201).status_code == 422


def _push(browser: AsgiBrowser, token: str, body: bytes, name: str) -> dict[str, Any]:
    answer = browser.post(
        "/api/v1/datasets",
        params={"name": name},
        content=body,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/octet-stream",
            "X-Content-SHA256": sha256(body),
        },
    )
    assert answer.status_code == 201, answer.text
    record: dict[str, Any] = answer.json()
    return record


def test_datasets_list_and_detail_show_arrays_and_what_trained_on_them(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    used = _push(browser, world.submitter_token, digits_like(40, seed=1), "digits <b>8x8</b>")
    unused = _push(browser, world.admin_token, digits_like(24, seed=2), "spare")
    spec = json.loads(json.dumps(ARRAYS_SPEC))
    spec["dataset"]["data"] = used["digest"]
    [trained] = _experiments(app, ["on-digits"], spec)
    listing = valid(browser.get("/datasets"))
    assert '<a href="/datasets">Datasets</a>' in listing
    for record in (used, unused):
        assert f'href="/datasets/{record["digest"]}"' in listing
        assert f'data-copy="{record["digest"]}"' in listing  # the full digest, to copy
    assert listing.index(unused["digest"]) < listing.index(used["digest"])  # newest first
    assert "x 40\u00d78\u00d78\u00d71 float32" in listing and "y 40 int64" in listing
    assert "digits &lt;b&gt;8x8&lt;/b&gt;" in listing and "<b>8x8" not in listing
    assert "submitter" in listing and "npz" in listing

    detail = valid(browser.get(f"/datasets/{used['digest']}"))
    assert used["digest"] in detail and "40 \u00d7 8 \u00d7 8 \u00d7 1" in detail
    assert f'href="/experiments/{trained}"' in detail and "on-digits" in detail
    with app.state.sessionmaker() as db:
        run_id = db.scalars(select(Experiment).where(Experiment.id == trained)).one().runs[0].id
    assert f'<tr id="run-{run_id}"' in detail and ">1 run<" in detail
    # The bare hex works too; the unused dataset lists nothing; an unknown one is a 404.
    bare = valid(browser.get(f"/datasets/{unused['digest'].removeprefix('sha256:')}"))
    assert "No run has trained on this dataset." in bare and "No experiment names" in bare
    missing = browser.get("/datasets/" + "0" * 64)
    assert missing.status_code == 404 and "no dataset" in missing.text
    assert browser.get("/datasets/not-a-digest").status_code == 422


# (loss, eval_accuracy or None): ties on loss, two runs without eval accuracy.
RESULTS = [(0.5, 0.8), (0.3, 0.9), (0.3, None), (0.9, 0.6), (0.1, 0.95), (0.3, 0.7), (0.7, None)]


def _post(browser: AsgiBrowser, token: str, path: str, doc: dict[str, Any]) -> Any:
    return browser.post(path, json=doc, headers={"Authorization": f"Bearer {token}"})


def _report_results(app: Any, browser: AsgiBrowser) -> dict[int, tuple[float, float | None]]:
    """Queue runs and report a result for each through the worker API, as a worker does
    (no checkpoint is uploaded, so each fails its check; its metrics are kept all the same)."""
    with app.state.sessionmaker() as db:
        _, token = auth.create_token(db=db, name="metrics-worker", role="worker")
    registered = _post(browser, token, "/api/v1/workers/register", {"name": "metrics-box"})
    worker_id = int(registered.json()["id"])
    _experiments(app, [f"m-{i}" for i in range(len(RESULTS) + 2)])
    reported: dict[int, tuple[float, float | None]] = {}
    for loss, accuracy in RESULTS:
        claimed = _post(browser, token, f"/api/v1/workers/{worker_id}/claim?wait=0", {})
        run_id = int(claimed.json()["run"]["id"])
        rows: list[dict[str, Any]] = [{"epoch": 1, "step": 2, "loss": 2.0, "eval_accuracy": 0.1}]
        last: dict[str, Any] = {"epoch": 2, "step": 4, "loss": loss, "f1 <score>": loss / 2}
        if accuracy is not None:
            last["eval_accuracy"] = accuracy
        else:
            rows = [{"epoch": 1, "step": 2, "loss": 2.0}]  # never evaluated
        result = {"status": "succeeded", "metrics": [*rows, last]}
        done = _post(
            browser,
            token,
            f"/api/v1/runs/{run_id}/complete",
            {"worker_id": worker_id, "result": result},
        )
        assert done.status_code == 200, done.text
        reported[run_id] = (loss, accuracy)
    return reported


def _walk(browser: AsgiBrowser, url: str) -> tuple[list[int], list[str]]:
    """Run ids of every page from `url` on, following "Older" links, and the pages' URLs."""
    ids: list[int] = []
    urls: list[str] = []
    next_url: str | None = url
    while next_url is not None:
        urls.append(next_url)
        page = valid(browser.get(next_url))
        ids += [int(i) for i in re.findall(r'<tr id="run-(\d+)"', page)]
        next_url = link(page, "next")
        assert len(urls) < 20
    return ids, urls


def test_runs_sort_by_a_metric_both_ways_across_pages_with_runs_without_it_last(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    reported = _report_results(app, browser)
    with app.state.sessionmaker() as db:
        every = set(db.scalars(sa.text("SELECT id FROM runs")))
        # The final values the server recorded with each result, as the sort reads them.
        stored = {
            (run_id, name): value
            for run_id, name, value in db.execute(
                sa.text("SELECT run_id, name, value FROM run_metrics")
            )
        }
    for run_id, (loss, accuracy) in reported.items():
        assert stored[(run_id, "loss")] == loss and stored[(run_id, "f1 <score>")] == loss / 2
        assert stored.get((run_id, "eval_accuracy")) == accuracy
    world_runs = [world.reference, world.identical, world.diverged]  # loss recorded as well
    losses = {run_id: value for (run_id, name), value in stored.items() if name == "loss"}
    assert set(world_runs) <= set(losses)
    without = every - set(losses)
    assert without  # queued, running and failed runs of the world and two queued ones

    ascending = sorted(losses, key=lambda r: (losses[r], r)) + sorted(without)
    ids, urls = _walk(browser, "/?sort=loss&order=asc&limit=3")
    assert ids == ascending and len(urls) == -(-len(ascending) // 3)
    descending = sorted(losses, key=lambda r: (-losses[r], -r)) + sorted(without, reverse=True)
    ids, urls = _walk(browser, "/?sort=loss&limit=4")
    assert ids == descending
    # Back from the last page, page by page, to the first: the same pages in reverse.
    page = valid(browser.get(urls[-1]))
    back: list[list[int]] = [[int(i) for i in re.findall(r'<tr id="run-(\d+)"', page)]]
    while (prev := link(page, "prev")) is not None:
        page = valid(browser.get(prev))
        back.insert(0, [int(i) for i in re.findall(r'<tr id="run-(\d+)"', page)])
    assert [i for chunk in back for i in chunk] == descending and len(back[0]) == 4

    # The columns: final values, "—" where a run has none; the picked metric after them.
    shown = valid(browser.get("/?sort=eval_accuracy&order=desc&metric=f1+%3Cscore%3E"))
    assert "f1 &lt;score&gt;" in shown and "f1 <score>" not in shown
    assert '<option value="f1 &lt;score&gt;" selected>' in shown
    for name in ("eval_accuracy", "loss"):
        assert f'<option value="{name}">' in shown
    first_rows = [int(i) for i in re.findall(r'<tr id="run-(\d+)"', shown)]
    best = max(
        (r for r in reported if reported[r][1] is not None), key=lambda r: reported[r][1] or 0.0
    )
    assert first_rows[0] == best
    row = re.search(rf'<tr id="run-{best}"(.*?)</tr>', shown, flags=re.S)
    assert row is not None
    cells = re.findall(r'<td class="num">([^<]*)</td>', row.group(1))
    assert cells[-3:] == ["0.1", "0.95", "0.05"]  # loss, eval accuracy, f1 <score>
    no_eval = next(r for r in reported if reported[r][1] is None)
    row = re.search(rf'<tr id="run-{no_eval}"(.*?)</tr>', shown, flags=re.S)
    assert row is not None and row.group(1).count('<span class="none">—</span>') >= 1

    # A key that is not one is refused with the reason; a filter still applies when sorted.
    bad = browser.get("/?sort=loss&cursor=nan,3")
    assert bad.status_code == 400 and "page key" in bad.text
    assert browser.get("/?sort=loss&cursor=1e999,3").status_code == 400
    failed = valid(browser.get("/?sort=loss&order=asc&status=running"))
    assert [int(i) for i in re.findall(r'<tr id="run-(\d+)"', failed)] == [world.running]


def test_live_rows_have_the_header_cells_on_a_page_sorted_by_a_metric_not_shown_by_default(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    _report_results(app, browser)  # records "f1 <score>", and leaves two runs queued
    page = valid(browser.get("/?sort=f1+%3Cscore%3E&order=asc"))
    header = re.search(r"<thead><tr>(.*?)</tr></thead>", page, flags=re.S)
    assert header is not None and "f1 &lt;score&gt;" in header.group(1)
    cells = header.group(1).count("<th")
    poll_url = page
    polled: set[int] = set()
    for _ in range(2):  # the page's poll, then the poll the answer asks for next
        poll = re.search(r'id="live-poller" hx-get="([^"]+)"', poll_url)
        assert poll is not None
        live = browser.get(html.unescape(poll.group(1)))
        assert live.status_code == 200, live.text[:2000]
        rows = re.findall(r'<tr id="run-(\d+)"[^>]*>(.*?)</tr>', live.text, flags=re.S)
        assert rows
        for run_id, row in rows:
            assert row.count("<td") == cells, f"run {run_id}: {row}"
            on_page = re.search(rf'<tr id="run-{run_id}"[^>]*>(.*?)</tr>', page, flags=re.S)
            assert on_page is not None and on_page.group(1).count("<td") == cells
        polled |= {int(run_id) for run_id, _ in rows}
        poll_url = live.text
    assert world.running in polled


def test_the_migration_fills_final_metrics_of_results_stored_before_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'before.db'}"
    upgrade(url, "0008")
    engine = make_engine(url)
    rows = [
        {"epoch": 1, "loss": 0.9, "eval_accuracy": 0.5, "note": "text"},
        {"epoch": 2, "loss": 0.4, "seconds": 3.0, "odd": True},
    ]
    try:
        with engine.begin() as conn:
            spec = json.dumps(spec_doc("old"))
            conn.execute(
                sa.text(
                    "INSERT INTO experiments (id, name, spec, spec_hash, submitted_spec_hash, "
                    "seed, seed_source, created_at) VALUES (1, 'old', :spec, 'sha256:a', "
                    "'sha256:a', '[1]', 'spec', '2026-01-01')"
                ),
                {"spec": spec},
            )
            for run_id, metrics in ((1, json.dumps(rows)), (2, None), (3, '"not rows"')):
                conn.execute(
                    sa.text(
                        "INSERT INTO runs (id, experiment_id, status, attempt, created_at, kind, "
                        "replicas, needs_code, metrics) VALUES (:id, 1, 'succeeded', 1, "
                        "'2026-01-01', 'train', 1, 0, :metrics)"
                    ),
                    {"id": run_id, "metrics": metrics},
                )
        upgrade(url)
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT run_id, name, value FROM run_metrics")).all()
        assert sorted(found) == [(1, "eval_accuracy", 0.5), (1, "loss", 0.4)]
    finally:
        engine.dispose()
