"""N-way comparison in Debian's Chromium against `repro serve`: tick three runs on the runs
list and press "Compare selected", read the verdict matrix and the legend, hover a curve
point for its value; then "Compare all" on an experiment page brings every succeeded run of
it. On a run page, a chart's tooltip, drag to zoom and reset, log scale, and step on x.
Then parameters against final metrics, a search by parameter and metric, a run named and
tagged from its page and found by its tag, a run archived and found only under "archived".
A failure is screenshotted into REPRO_LAYOUT_SHOTS (or the test's temporary directory).

The runs are the dashboard world's (reference, identical and diverged reruns, a failed and
a running one) plus a second identical rerun, stored as completion stores them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser import ARGS, CHROMIUM, playwright_or_skip
from tests.e2e.test_dashboard_browser import Watched
from tests.integration.dashboard_world import World
from tests.integration.served_world import served_world
from tests.integration.service_procs import Service

pytestmark = pytest.mark.slow

sync_api = playwright_or_skip()

# The matrix as shown: the column runs, and per row its run and its cells' texts.
READ_MATRIX = """() => ({
  columns: [...document.querySelectorAll("table.matrix thead th[scope=col]")]
    .map((th) => th.innerText.trim()),
  rows: [...document.querySelectorAll("table.matrix tbody tr")].map((tr) => [
    tr.querySelector("th").innerText.trim(),
    [...tr.querySelectorAll("td")].map((td) =>
      td.classList.contains("self") ? "-" : td.querySelector(".badge").innerText.trim()),
  ]),
})"""


def matrix(page: Any) -> dict[tuple[int, int], str]:
    """(row run, column run) -> the verdict the page shows; every row and column present."""
    found = page.evaluate(READ_MATRIX)
    columns = [int(c.removeprefix("run ")) for c in found["columns"]]
    cells = {}
    for row, texts in found["rows"]:
        assert len(texts) == len(columns), found
        cells.update(
            {(int(row.removeprefix("run ")), b): t for b, t in zip(columns, texts, strict=True)}
        )
    assert len(cells) == len(columns) ** 2, found
    return cells


def expected(runs: list[int], diverged: int) -> dict[tuple[int, int], str]:
    return {
        (a, b): "-" if a == b else "diverged" if diverged in (a, b) else "identical"
        for a in runs
        for b in runs
    }


# The chart box (`figure.chart-box`, drawn by charts.js with uPlot) whose title is `title`.
BOX = """(title) => [...document.querySelectorAll('figure.chart-box[data-drawn]')]
  .find((b) => JSON.parse(b.dataset.chart).title === title)"""


def chart_legend(page: Any, metric: str) -> list[str]:
    """The series named in the legend under `metric`'s chart (the x series left out)."""
    found: list[str] = page.evaluate(
        f"(t) => [...({BOX})(t).querySelectorAll('.u-legend .u-series .u-label')]"
        ".slice(1).map((e) => e.textContent.trim())",
        metric,
    )
    return found


def at(page: Any, metric: str, x: float, y_fraction: float = 0.5) -> tuple[float, float]:
    """Where on the screen `metric`'s chart plots x (at this height of the plot)."""
    found: list[float] = page.evaluate(
        f"([t, x, f]) => {{ const b = ({BOX})(t); b.scrollIntoView({{block: 'center'}});"
        " const u = b.uplot; const r = u.over.getBoundingClientRect();"
        " return [r.left + u.valToPos(x, 'x'), r.top + r.height * f]; }",
        [metric, x, y_fraction],
    )
    return found[0], found[1]


def hovered(page: Any, metric: str, x: float) -> list[str]:
    """The tooltip's lines with the mouse over x on `metric`'s chart."""
    page.mouse.move(*at(page, metric, x))
    tip = page.evaluate(
        f"(t) => {{ const e = ({BOX})(t).querySelector('.chart-tooltip');"
        " return e.style.display === 'none' ? '' : e.textContent; }",
        metric,
    )
    return str(tip).splitlines()


def x_scale(page: Any, metric: str) -> tuple[float, float]:
    found: list[float] = page.evaluate(
        f"(t) => {{ const s = ({BOX})(t).uplot.scales.x; return [s.min, s.max]; }}", metric
    )
    return found[0], found[1]


def charts_on_a_run_page(w: Watched, service: Service, world: World) -> None:
    """Hover a point and read its value, zoom by dragging and back, a log scale, step on x."""
    page = w.page
    page.goto(f"{service.url}/runs/{world.reference}")
    page.wait_for_selector("figure.chart-box[data-drawn] canvas")
    assert page.locator("figure.chart-box svg.chart").first.is_hidden()  # drawn again
    # dashboard_world: loss 0.7 - epoch/50 over epochs 1-3, steps 4, 8, 12.
    assert hovered(page, "loss", 2) == ["epoch 2", f"run {world.reference}: 0.66"]
    page.mouse.move(*at(page, "loss", 1.2))
    page.mouse.down()
    page.mouse.move(*at(page, "loss", 2.2), steps=5)
    page.mouse.up()
    low, high = x_scale(page, "loss")
    assert 1.1 < low < 1.3 and 2.1 < high < 2.3, (low, high)
    box = page.locator("figure.chart-box").first
    box.locator("button.chart-reset").click()
    assert x_scale(page, "loss") == (1, 3)
    box.locator("input.chart-log").check()
    assert box.get_attribute("data-drawn") == "epoch log"
    assert page.evaluate(f"(t) => ({BOX})(t).uplot.scales.y.distr", "loss") == 3
    box.locator("select.chart-x").select_option("step")
    assert box.get_attribute("data-drawn") == "step log"
    assert x_scale(page, "loss") == (4, 12)
    assert hovered(page, "loss", 8) == ["step 8", f"run {world.reference}: 0.66"]
    w.shot("run-page-charts")


def lr_runs(data_dir: Path) -> dict[str, int]:
    """Runs of specs with learning rates 0.003 (3 epochs: accuracy 0.575; 1 epoch: 0.525;
    and one that failed, without metrics) and 0.01, stored as completion stores them."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from service.config import Settings
    from service.persistence.engine import make_engine
    from service.persistence.models import Worker
    from service.runs.experiments import create_experiment
    from tests.integration import dashboard_world
    from worker.spec import ExperimentSpec

    settings = Settings(data_dir=data_dir)
    engine = make_engine(settings.resolved_database_url)
    made = {}
    try:
        with Session(engine) as db:
            worker = db.scalars(select(Worker)).first()
            for key, lr, epochs in (("long", 0.003, 3), ("short", 0.003, 1), ("fast", 0.01, 3),
                                    ("broken", 0.003, 2)):  # fmt: skip
                doc = dashboard_world.spec_doc(name=f"lr-{key}", epochs=epochs)
                doc["training"]["optimizer"]["params"]["learning_rate"] = lr
                spec = ExperimentSpec.model_validate(doc)
                _, run, _ = create_experiment(db=db, spec=spec, settings=settings)
                if key == "broken":
                    run.status = "failed"
                else:
                    dashboard_world.finish(db, run, worker, epochs=epochs)
                db.commit()
                made[key] = run.id
    finally:
        engine.dispose()
    return made


def listed(page: Any) -> set[int]:
    ids = page.eval_on_selector_all(
        "table.runs tbody tr[id^=run-]", "(rows) => rows.map((r) => r.id)"
    )
    return {int(i.removeprefix("run-")) for i in ids}


def label_search_and_archive(w: Watched, service: Service, runs: dict[str, int]) -> None:
    """Search by a parameter and a metric, name and tag a run from its page, archive one."""
    page = w.page
    page.goto(f"{service.url}/")
    query = "params.training.optimizer.params.learning_rate = 0.003 and metrics.accuracy > 0.5"
    page.fill("input[name=search]", query)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*search=params"))
    assert listed(page) == {runs["long"], runs["short"]}

    page.goto(f"{service.url}/runs/{runs['long']}")
    page.locator("details.labels summary").click()
    page.fill("form.labels input[name=name]", "baseline")
    page.fill("form.labels input[name=tags]", "gold, lr-sweep")
    page.locator("form.labels button[type=submit]").click()
    page.wait_for_load_state()
    assert page.locator("h1 .run-name, .run-name").first.inner_text() == "baseline"
    page.locator("a.tag", has_text="gold").first.click()
    page.wait_for_url(re.compile(r".*\?tag=gold"))
    assert listed(page) == {runs["long"]}
    assert "baseline" in page.locator(f"#run-{runs['long']}").inner_text()

    page.goto(f"{service.url}/runs/{runs['fast']}")
    page.get_by_role("button", name="Archive").click()
    page.wait_for_load_state()
    page.goto(f"{service.url}/")
    assert runs["fast"] not in listed(page) and runs["long"] in listed(page)
    page.select_option("select[name=archived]", "only")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*archived=only"))
    assert listed(page) == {runs["fast"]}
    w.shot("archived-runs")


def scatter_of_params(w: Watched, service: Service, runs: dict[str, int]) -> None:
    """Three runs whose learning rates and epochs differ: their final accuracy against the
    learning rate, one point a run, read by hovering."""
    page = w.page
    ids = "&".join(f"runs={runs[k]}" for k in ("long", "short", "fast"))
    page.goto(f"{service.url}/compare/runs?{ids}")
    box = page.locator("figure.scatter-box[data-drawn]")
    box.wait_for()
    lr = "training.optimizer.params.learning_rate"
    options = box.locator("select.scatter-x option").all_inner_texts()
    assert options == ["training.epochs", lr], options
    box.locator("select.scatter-x").select_option(lr)
    box.locator("select.scatter-y").select_option("accuracy")
    assert box.get_attribute("data-drawn") == f"{lr} accuracy"

    def hover(x: float) -> list[str]:
        spot = page.evaluate(
            "(x) => { const b = document.querySelector('figure.scatter-box');"
            " b.scrollIntoView({block: 'center'}); const u = b.uplot;"
            " const r = u.over.getBoundingClientRect();"
            " return [r.left + Math.min(u.valToPos(x, 'x'), r.width - 2), r.top + r.height / 2]; }",
            x,
        )
        page.mouse.move(*spot)
        return str(box.locator(".chart-tooltip").text_content()).splitlines()

    assert hover(0.01) == [f"{lr} 0.01", f"run {runs['fast']}: 0.575"]
    at_low = sorted(hover(0.003)[1:])
    assert at_low == sorted([f"run {runs['long']}: 0.575", f"run {runs['short']}: 0.525"])
    w.shot("compare-scatter")


def walk(w: Watched, service: Service, world: World, third: int) -> None:
    page = w.page
    page.goto(f"{service.url}/login")
    page.fill("#token", world.admin_token)
    page.click("form[action='/login'] button[type=submit]")
    page.wait_for_url(f"{service.url}/")

    # Tick three runs on the runs list and compare them.
    ticked = [world.reference, world.diverged, third]
    for run in ticked:
        page.locator(f"#run-{run} input[name=runs]").check()
    page.get_by_role("button", name="Compare selected").click()
    page.wait_for_url(re.compile(r".*/compare/runs\?"))
    w.shot("compare-selected")
    assert page.locator("h1").inner_text() == "3 runs compared"
    assert matrix(page) == expected(ticked, world.diverged)
    assert page.locator("table.matrix td.cell.diverged").count() == 4
    for metric in ("loss", "accuracy"):
        assert sorted(chart_legend(page, metric)) == sorted(f"run {r}" for r in ticked)
    # The diverged run's loss is 0.01 above the others' (which lie on one another).
    shown = hovered(page, "loss", 2)
    assert shown[0] == "epoch 2" and f"run {world.diverged}: 0.67" in shown, shown
    assert f"run {world.reference}: 0.66" in shown

    # Every succeeded run of the experiment, from its page.
    page.goto(f"{service.url}/experiments/{world.experiment}")
    link = page.locator("a.compare-all")
    assert link.inner_text() == "Compare all 4 succeeded runs"
    link.click()
    page.wait_for_url(re.compile(r".*/compare/runs\?runs="))
    w.shot("compare-all")
    family = [world.reference, world.identical, world.diverged, third]
    assert page.locator("h1").inner_text() == "4 runs compared"
    assert matrix(page) == expected(family, world.diverged)
    assert sorted(chart_legend(page, "loss")) == sorted(f"run {r}" for r in family)
    # One environment field differs, the second identical rerun's numpy.
    fields = page.locator("table.environment-diff td.field").all_inner_texts()
    assert fields == ["libraries.numpy"]
    charts_on_a_run_page(w, service, world)
    runs = lr_runs(service.data_dir)
    scatter_of_params(w, service, runs)
    label_search_and_archive(w, service, runs)
    assert w.problems == []


def test_compare_selected_and_compare_all_in_chromium(tmp_path: Path) -> None:
    shots = Path(os.environ.get("REPRO_LAYOUT_SHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    with served_world(tmp_path, None) as (service, world, third), sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            w = Watched(context.new_page(), shots)
            try:
                walk(w, service, world, third)
            except Exception as exc:
                w.shot("compare-runs-failure")
                raise AssertionError(
                    f"{exc} (screenshot {shots / 'compare-runs-failure.png'}, "
                    f"page {w.page.url}, problems {w.problems})"
                ) from exc
        finally:
            browser.close()
