"""N-way comparison on real SQLite and PostgreSQL through the ASGI app: the verdict matrix,
only the differing fields, overlaid curves with hover values, valid HTML, and the JSON
endpoint's refusals of bad ids, unknown runs and too many runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.config import Settings
from service.persistence.migrate import upgrade
from tests.integration import dashboard_world
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import HOSTILE, HOSTILE_ENV, HOSTILE_ERROR, World

html5lib = pytest.importorskip("html5lib", reason="html5lib is not installed (test extra)")

MAX_RUNS = 5


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url = "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    settings = Settings(data_dir=tmp_path / "data", database_url=url, max_compare_runs=MAX_RUNS)
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


def api(browser: AsgiBrowser, world: World, runs: str) -> Any:
    return browser.get(
        "/api/v1/compare/runs",
        params={"runs": runs},
        headers={"Authorization": f"Bearer {world.viewer_token}"},
    )


def cells(html: str) -> dict[tuple[int, int], str]:
    """(row run, column run) -> the verdict shown in the matrix."""
    found = re.findall(
        r'<a href="/compare\?a=(\d+)&amp;b=(\d+)" title="[^"]*"><span class="badge (\w+)">', html
    )
    return {(int(a), int(b)): verdict for a, b, verdict in found}


def test_the_page_shows_every_pair_only_differing_fields_and_hoverable_curves(
    world: World, browser: AsgiBrowser
) -> None:
    runs = [world.reference, world.identical, world.diverged, world.failed]
    page = browser.get(f"/compare/runs?runs={','.join(map(str, runs))}")
    assert page.status_code == 200, page.text[:500]
    html5lib.HTMLParser(strict=True).parse(page.text)
    for hostile in (HOSTILE, HOSTILE_ERROR, HOSTILE_ENV):
        assert hostile not in page.text

    shown = cells(page.text)
    assert len(shown) == len(runs) * (len(runs) - 1)  # every pair both ways, not the diagonal
    ref, same, div, failed = runs
    assert shown[(ref, same)] == shown[(same, ref)] == "identical"
    for other in (ref, same):
        assert shown[(other, div)] == shown[(div, other)] == "diverged"
    assert {shown[(failed, r)] for r in (ref, same, div)} == {"incomparable"}
    assert page.text.count("not comparable") == 6
    # One spec, one environment: no field differs.
    assert 'class="none spec-same"' in page.text
    assert "scatter-box" not in page.text  # no parameter differs: nothing to plot against
    # One chart per metric, a line and a legend entry per finished run, a value per point.
    assert page.text.count('<svg class="chart"') == 2
    assert page.text.count('class="legend-entry"') == 2 * 3
    assert re.search(rf"<title>run {div} · epoch 2 · loss 0\.67</title>", page.text)
    lines = re.findall(r"<polyline [^>]*>", page.text)
    styles = {(re.findall(r'stroke="([^"]+)"', t)[0], "dasharray" in t) for t in lines[:3]}
    assert len(lines) == 6 and len(styles) == 3  # the lines of one chart look different


def test_the_json_answer_lists_pairs_and_only_the_fields_that_differ(
    world: World, browser: AsgiBrowser, app: Any
) -> None:
    with app.state.sessionmaker() as db:
        from service.persistence.models import Run

        run = db.get(Run, world.identical)
        assert run is not None
        run.provenance = {**run.provenance, "libraries": {**run.provenance["libraries"],
                                                         "numpy": "2.5.0"}}  # fmt: skip
        db.commit()
    answer = api(browser, world, f"{world.reference},{world.identical},{world.diverged}")
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert found["runs"] == [world.reference, world.identical, world.diverged]
    verdicts = {(p["a"], p["b"]): p["verdict"] for p in found["pairs"]}
    assert verdicts == {
        (world.reference, world.identical): "identical",
        (world.reference, world.diverged): "diverged",
        (world.identical, world.diverged): "diverged",
    }
    # The rerun verdicts are read as kept, the third pair worked out from the traces.
    stored = {(p["a"], p["b"]): p["stored"] for p in found["pairs"]}
    assert (
        stored[(world.reference, world.diverged)] and not stored[(world.identical, world.diverged)]
    )
    assert found["spec_diff"] == []
    assert [(d["field"], d["values"]) for d in found["environment_diff"]] == [
        ("libraries.numpy", ["2.4.6", "2.5.0", "2.4.6"])
    ]
    assert sorted(found["curves"]) == ["accuracy", "loss"]
    assert [c["run"] for c in found["curves"]["loss"]] == found["runs"]


@pytest.mark.parametrize(
    ("runs", "says"),
    [
        ("1,abc", "'abc' is not a run id"),
        ("1,-2", "'-2' is not a run id"),
        ("1,0", "0 is not a run id"),
        ("1,99999999999", "is not a run id"),
        ("1", "at least two different runs"),
        ("1,1", "at least two different runs"),
        (",".join(map(str, range(1, MAX_RUNS + 2))), "REPRO_MAX_COMPARE_RUNS"),
    ],
)
def test_bad_run_lists_are_refused_with_the_reason(
    world: World, browser: AsgiBrowser, runs: str, says: str
) -> None:
    answer = api(browser, world, runs)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert says in body["detail"] and body["errors"][0]["loc"] == "query.runs"
    page = browser.get("/compare/runs", params={"runs": runs})
    assert page.status_code == 422 and says in page.text.replace("&#39;", "'")


def test_unknown_runs_are_named_and_a_missing_list_is_refused(
    world: World, browser: AsgiBrowser
) -> None:
    answer = api(browser, world, f"{world.reference},777777,888888")
    assert answer.status_code == 422
    assert answer.json()["detail"] == "no runs 777777, 888888"
    missing = browser.get(
        "/api/v1/compare/runs", headers={"Authorization": f"Bearer {world.viewer_token}"}
    )
    assert missing.status_code == 422 and missing.json()["errors"][0]["loc"] == "query.runs"


def test_runs_can_be_selected_on_the_runs_list_and_a_family_compared_from_its_experiment(
    world: World, browser: AsgiBrowser
) -> None:
    runs = browser.get("/").text
    assert '<form id="compare-selected" class="compare-selected" method="get" ' in runs
    for run in (world.reference, world.diverged):
        assert f'name="runs" value="{run}" form="compare-selected"' in runs
    # The form sends `runs` once per ticked box; the page takes that as well as a list.
    picked = browser.get(f"/compare/runs?runs={world.reference}&runs={world.diverged}")
    assert picked.status_code == 200 and len(cells(picked.text)) == 2

    experiment = browser.get(f"/experiments/{world.experiment}").text
    link = re.search(r'<a class="compare-all" href="([^"]+)">Compare all (\d+)', experiment)
    assert link is not None
    family = browser.get(link.group(1).replace("&amp;", "&"))
    assert family.status_code == 200
    succeeded = [world.reference, world.identical, world.diverged]
    assert int(link.group(2)) == len(succeeded)
    assert {a for a, _ in cells(family.text)} == set(succeeded)


def test_the_run_page_curves_show_values_on_hover(world: World, browser: AsgiBrowser) -> None:
    page = browser.get(f"/runs/{world.reference}").text
    assert re.search(rf"<title>run {world.reference} · epoch 1 · loss 0\.68\d*</title>", page)
    assert re.search(rf"<title>run {world.reference} · epoch 3 · accuracy 0\.575</title>", page)
