"""N-way comparison in Debian's Chromium against `repro serve`: tick three runs on the runs
list and press "Compare selected", read the verdict matrix and the legend, hover a curve
point for its value; then "Compare all" on an experiment page brings every succeeded run of
it. A failure is screenshotted into REPRO_LAYOUT_SHOTS (or the test's temporary directory).

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


def chart_legend(page: Any, metric: str) -> list[str]:
    chart = page.locator(f'svg.chart[aria-label="{metric}"]')
    return [t.strip() for t in chart.locator(".legend-entry text").all_text_contents()]


def hovered_value(page: Any, metric: str, title: str) -> list[str]:
    """Hover the point of `metric`'s chart whose hover text is `title`; the hover texts of
    the points under the mouse then."""
    points = page.locator(f'svg.chart[aria-label="{metric}"] circle.point')
    titles = points.evaluate_all("(cs) => cs.map((c) => c.querySelector('title').textContent)")
    assert title in titles, titles
    points.nth(titles.index(title)).hover()
    found: list[str] = page.evaluate(
        "() => [...document.querySelectorAll('circle.point:hover')]"
        ".map((c) => c.querySelector('title').textContent)"
    )
    return found


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
    value = f"run {world.diverged} · epoch 2 · loss 0.67"
    assert hovered_value(page, "loss", value) == [value]

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
