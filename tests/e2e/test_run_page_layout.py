"""The run page in Debian's Chromium against `repro serve`: a run with many long environment
variables, a wide trace and several curves fits the window; a page opened while its run is
live shows the finished record (summary, trace, actions) without a reload."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.config import Settings
from service.persistence.engine import make_engine
from service.persistence.models import Run, TracePointRow, Worker, utcnow
from service.runs.experiments import create_experiment
from service.verification import verdicts
from tests.e2e.browser import ARGS, CHROMIUM, playwright_or_skip
from tests.integration import dashboard_world
from tests.integration.service_procs import Service
from worker.spec import ExperimentSpec

pytestmark = pytest.mark.slow

WIDTHS = (1280, 1400, 1920)  # 1400: where the report saw it
MAX_HEIGHT = 15_000  # px: the whole record of the run below, with room to spare
MIN_COLUMN = 60  # px: no cell with text is narrower
ENV_VARS = 50
TRACE_VARIABLES = 200
EPOCHS = 10

sync_api = playwright_or_skip()

# Everything the layout test asks of the page, measured in the page.
MEASURE = """() => {
  const box = (e) => e.getBoundingClientRect();
  const name = (e) => e.tagName.toLowerCase() + (e.className && typeof e.className === "string"
    ? "." + e.className.trim().split(/\\s+/).join(".") : "");
  const narrow = [];
  for (const cell of document.querySelectorAll("main th, main td")) {
    const text = cell.innerText.trim();
    if (text && box(cell).width < MIN_COLUMN) {
      narrow.push(`${name(cell)} ${Math.round(box(cell).width)}px: ${text.slice(0, 40)}`);
    }
  }
  const wide = [];
  for (const e of document.querySelectorAll("main *")) {
    if (box(e).right > innerWidth + 0.5 && !e.closest("pre")) {
      wide.push(`${name(e)} right=${Math.round(box(e).right)}`);
    }
  }
  // The charts as drawn by the page's script (uPlot), controls and legend included.
  const charts = [...document.querySelectorAll("figure.chart-box[data-drawn]")].map(box);
  const overlaps = [];
  charts.forEach((a, i) => charts.slice(i + 1).forEach((b, j) => {
    if (a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5
        && b.top < a.bottom - 0.5) overlaps.push(`chart ${i} and chart ${i + j + 1}`);
  }));
  return {
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: innerWidth,
    height: document.documentElement.scrollHeight,
    charts: charts.length,
    narrow: narrow.slice(0, 20),
    wide: wide.slice(0, 20),
    overlaps: overlaps,
  };
}""".replace("MIN_COLUMN", str(MIN_COLUMN))


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def environment() -> dict[str, str]:
    """Variables as a real machine has them: paths, flag lists, and long unbroken tokens."""
    env: dict[str, str] = {"PYTHONHASHSEED": "0", "TF_DETERMINISTIC_OPS": "1"}
    for i in range(ENV_VARS - len(env)):
        if i % 3 == 0:
            value = ":".join(f"/opt/toolchain-{i}/lib{j}/x86_64-linux-gnu" for j in range(8))
        elif i % 3 == 1:
            value = " ".join(f"--xla_flag_{i}_{j}=true" for j in range(12))
        else:
            value = _digest("token", i) * 4
        env[f"SOME_RATHER_LONG_ENVIRONMENT_VARIABLE_NAME_{i:02d}"] = value
    return env


def trace_points() -> list[dict[str, Any]]:
    names = [f"model/block_{i // 4}/layer_{i % 4}/kernel" for i in range(TRACE_VARIABLES)]
    points = []
    for epoch in range(EPOCHS + 1):
        variables = {v: "blake3:" + _digest(v, epoch) for v in names}
        points.append(
            {
                "kind": "init" if epoch == 0 else "epoch",
                "epoch": epoch,
                "step": epoch * 4,
                "fingerprint": "blake3:" + _digest(sorted(variables.items())),
                "variables": variables,
            }
        )
    return points


def record_big_run(data_dir: Path) -> int:
    """A finished run written as completion writes one, with a large record to lay out."""
    engine = make_engine(f"sqlite:///{data_dir / 'reprotrain.db'}")
    try:
        with Session(engine, expire_on_commit=False) as db:
            worker = Worker(name="layout-box", hostname="box", executors=["process"], images=[])
            db.add(worker)
            db.commit()
            doc = dashboard_world.spec_doc("layout", epochs=EPOCHS)
            spec = ExperimentSpec.model_validate(doc)
            _, run, _ = create_experiment(db=db, spec=spec, settings=Settings(data_dir=data_dir))
            _finish(db, run, worker)
            return run.id
    finally:
        engine.dispose()


def _finish(db: Session, run: Run, worker: Worker) -> None:
    now = utcnow()
    points = trace_points()
    run.status, run.worker_id, run.attempt = "succeeded", worker.id, 1
    run.started_at, run.finished_at = now - timedelta(seconds=90), now
    run.final_fingerprint = points[-1]["fingerprint"]
    run.trace_granularity = "epoch"
    run.provenance = dashboard_world.provenance(list(run.experiment.seed))
    env = environment()
    run.provenance["environment"] = env
    run.provenance["environment_digests"] = {k: "sha256:" + _digest(k, v) for k, v in env.items()}
    run.metrics = [
        {"epoch": e, "step": 4 * e, "loss": 0.7 - e / 50, "accuracy": 0.5 + e / 40,
         "val_loss": 0.75 - e / 60, "val_accuracy": 0.45 + e / 45}
        for e in range(1, EPOCHS + 1)
    ]  # fmt: skip
    run.data_fingerprints = [
        {"epoch": e, "fingerprint": "sha256:" + _digest("data", e)} for e in range(1, EPOCHS + 1)
    ]
    run.result_summary = {"warnings": [], "determinism": run.provenance["determinism"]}
    db.add_all(
        TracePointRow(run_id=run.id, seq=i, **{k: p[k] for k in p}) for i, p in enumerate(points)
    )
    db.flush()
    verdicts.update_family(db=db, family_id=run.family_id or run.id)
    db.commit()


def tiny_spec() -> dict[str, Any]:
    """Ten epochs of a few seconds in all: progress (sent about once a second) shows several."""
    doc = dashboard_world.spec_doc("live-run", epochs=EPOCHS)
    doc["dataset"]["train_batches"] = 300
    return doc


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def logged_in_page(browser: Any, service: Service, width: int) -> Any:
    page = browser.new_context(viewport={"width": width, "height": 900}).new_page()
    page.goto(f"{service.url}/login")
    page.fill("#token", service.admin_token)
    page.click("form[action='/login'] button[type=submit]")
    page.wait_for_url(f"{service.url}/")
    return page


def test_a_large_run_record_fits_the_window(tmp_path: Path, browser: Any) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    try:
        service.wait_ready()
        run_id = record_big_run(service.data_dir)
        failures = []
        for width in WIDTHS:
            page = logged_in_page(browser, service, width)
            page.goto(f"{service.url}/runs/{run_id}")
            page.locator("figure.chart-box[data-drawn] canvas").first.wait_for()
            m = page.evaluate(MEASURE)
            problems = []
            if m["scrollWidth"] > m["innerWidth"]:
                problems.append(f"page {m['scrollWidth']} px wide in a {m['innerWidth']} window")
            if m["height"] > MAX_HEIGHT:
                problems.append(f"page {m['height']} px tall (bound {MAX_HEIGHT})")
            if m["charts"] != 4:
                problems.append(f"{m['charts']} charts, not 4")
            problems += [f"narrow: {n}" for n in m["narrow"]]
            problems += [f"past the right edge: {w}" for w in m["wide"]]
            problems += [f"overlap: {o}" for o in m["overlaps"]]
            if problems:
                shot = tmp_path / f"run-page-{width}.png"
                page.screenshot(path=str(shot), full_page=m["height"] <= 30_000)
                failures.append(f"at {width} px ({shot}): " + "; ".join(problems))
            page.context.close()
        assert not failures, "\n".join(failures)
    finally:
        service.stop()


def _summary_cell(page: Any, label: str) -> Any:
    # The summary comes first; provenance groups further down hold rows such as
    # "worker.name", which a substring match would also find.
    header = page.locator("th", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))
    return page.locator("table.kv tr", has=header).locator("td").first


def test_a_live_run_page_shows_the_finished_record_without_a_reload(
    tmp_path: Path, browser: Any
) -> None:
    service = Service(tmp_path / "data", extra=("--with-worker", "--no-demo"))
    try:
        service.wait_ready()
        run_id = service.submit(json.dumps(tiny_spec()), "application/json").json()["run"]["id"]
        service.wait_run(run_id, timeout=120, until=("running", "succeeded", "failed"))
        page = logged_in_page(browser, service, 1400)
        page.goto(f"{service.url}/runs/{run_id}")
        assert page.locator("#run-live .status").inner_text() in ("queued", "running")
        assert page.locator("form[action$='/cancel'] button").count() == 1
        loads: list[str] = []
        page.on("load", lambda: loads.append(page.url))
        seen = _watch_progress(page)
        finished = service.wait_run(run_id, timeout=5)
        assert finished["status"] == "succeeded", finished["error"]
        fingerprint = finished["final_fingerprint"]

        cell = _summary_cell(page, "Final fingerprint").locator("code")
        cell.wait_for(timeout=30_000)
        try:
            assert cell.get_attribute("title") == fingerprint
            assert _summary_cell(page, "Worker").inner_text().strip() not in ("", "—")
            assert _summary_cell(page, "Attempt").inner_text().strip().startswith("1")
            assert page.locator("table.trace tbody tr").count() == EPOCHS + 1
            assert page.locator("form[action$='/cancel']").count() == 0
            # Drawn by the script too, though the page's content came in by a live swap.
            assert page.locator("figure.chart-box[data-drawn] canvas").count() >= 1
            assert loads == []  # all of it came through the live updates
            # Progress advanced before the end rather than jumping from 0 to it (the worker
            # reports about once a second: on a loaded machine epochs pass between reports).
            middle = {s for s in seen if 0 < s < EPOCHS}
            assert middle, seen
        except AssertionError:
            page.screenshot(path=str(tmp_path / "live-run.png"), full_page=True)
            raise
    finally:
        service.stop()


def _watch_progress(page: Any, timeout: float = 240) -> list[int]:
    """The epochs the live progress showed, sampled until the page shows the run as final."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = page.locator("#run-live").inner_text()
        status = page.locator("#run-live .status").inner_text()
        if status not in ("queued", "running"):
            return seen
        found = text.split("epoch ", 1)[1].split(" ", 1)[0] if "epoch " in text else ""
        if found.isdigit() and (not seen or seen[-1] != int(found)):
            seen.append(int(found))
        time.sleep(0.1)
    raise AssertionError(f"the page still shows the run live after {timeout} s: {seen}")
