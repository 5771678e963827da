"""The dashboard's server time: the runs page at 1k, 10k and 100k runs, and the run and
compare pages of a 50-epoch, 200-variable run.

A migrated SQLite database in a temporary directory is filled step by step (the same
rows as section 6). At each size the pages are rendered through the app in this process
(routing, session check, queries, templates; no network), each timed request after one
untimed, and the median kept:

- `/` page 1 (newest 50 runs), baseline the same page at 1,000 runs: keyset paging must
  not grow with the table (target: within 1.5x);
- `/?before=<id>`: a page 90% of the way down the list, baseline page 1 at that size;
- `/?status=failed`: page 1 of a filter, baseline page 1 at that size;
- `/?sort=loss&order=asc&metric=accuracy`: page 1 with its metric columns (final loss, eval
  accuracy, a picked metric) sorted by final loss, walked on the `run_metrics` index,
  baseline page 1 at that size (target: < 150 ms);
- `/?search=params.training.optimizer.params.learning_rate = 0.003 and metrics.loss < 0.69`
  with two parameter columns picked (the parameter and metric walked on their indexes, a
  third of the runs matching), baseline page 1 at that size (target: < 150 ms).

Then two runs of one experiment with 51 trace points of 200 variables each, diverging at
epoch 30 in 5 variables, and `/runs/{id}` and `/compare?a=&b=` of them (target: < 200 ms),
baseline the runs page.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.fill import fill_runs
from benchmarks.rounds import progress
from benchmarks.rows import Row, write_json

RUNS_TARGET_MS = 150.0
PAGE_TARGET_MS = 200.0
EPOCHS, VARIABLES, DIVERGING = 50, 200, 5
METRIC_SORTED = "/?sort=loss&order=asc&metric=accuracy"
METRIC_RATIO = 1.5  # three more columns and the metric names' select box
LEARNING_RATE = "training.optimizer.params.learning_rate"
SEARCHED = (
    "/?search=params." + LEARNING_RATE + "%20%3D%200.003%20and%20metrics.loss%20%3C%200.69"
    "&param=" + LEARNING_RATE + "&param=training.epochs"
)
SEARCH_RATIO = 3.0  # a third of the runs match: the walk reads three times as many rows


@dataclass(frozen=True)
class Budget:
    sizes: tuple[int, ...]
    samples: int


FULL = Budget(sizes=(1_000, 10_000, 100_000), samples=15)
QUICK = Budget(sizes=(200, 1_000), samples=3)


class Dashboard:
    """The app in this process, logged in as an admin."""

    def __init__(self, data_dir: Path) -> None:
        from service.app import create_app
        from service.auth import tokens as auth
        from service.config import Settings

        self.app = create_app(Settings(data_dir=data_dir))
        with self.app.state.sessionmaker() as db:
            _, token = auth.create_token(db=db, name="bench", role="admin")
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://bench", timeout=120
        )
        form = self.get("/login").text
        found = re.search(r'name="form_token" value="([^"]+)"', form)
        assert found is not None
        answer = self._run(
            self.client.post("/login", data={"token": token, "form_token": found.group(1)})
        )
        assert answer.status_code == 303, answer.text

    def _run(self, request: Any) -> httpx.Response:
        answer: httpx.Response = self.loop.run_until_complete(request)
        return answer

    def get(self, url: str) -> httpx.Response:
        return self._run(self.client.get(url))

    def median_ms(self, url: str, samples: int) -> float:
        answer = self.get(url)  # untimed: warms caches and compiles templates
        if answer.status_code != 200:
            raise RuntimeError(f"{url}: {answer.status_code} {answer.text[:500]}")
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            self.get(url).raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    def close(self) -> None:
        self._run(self.client.aclose())
        self.loop.close()
        self.app.state.engine.dispose()


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def add_large_pair(data_dir: Path) -> tuple[int, int]:
    """Two finished runs of one experiment, 51 points x 200 variables, diverging at epoch 30."""
    from sqlalchemy.orm import Session

    from benchmarks.fill import _base_spec
    from service.config import Settings
    from service.persistence.engine import make_engine
    from service.persistence.models import Run, TracePointRow, utcnow
    from service.runs.experiments import create_experiment
    from service.verification.verdicts import update_family
    from worker.spec import ExperimentSpec

    engine = make_engine(f"sqlite:///{data_dir / 'reprotrain.db'}")
    names = [
        f"model/layer_{i // 2:03d}/{'kernel' if i % 2 == 0 else 'bias'}" for i in range(VARIABLES)
    ]
    try:
        with Session(engine) as db:
            spec = ExperimentSpec.model_validate({**_base_spec(), "name": "bench-large"})
            _, first, _ = create_experiment(db=db, spec=spec, settings=Settings(data_dir=data_dir))
            second = Run(
                experiment_id=first.experiment_id,
                rerun_of_id=first.id,
                family_id=first.id,
                status="queued",
            )
            db.add(second)
            db.flush()
            for run, diverges in ((first, False), (second, True)):
                run.status, run.started_at, run.finished_at = "succeeded", utcnow(), utcnow()
                run.trace_granularity = "epoch"
                run.metrics = [
                    {"epoch": e, "step": 10 * e, "loss": 1 / e, "accuracy": 1 - 1 / (e + 1)}
                    for e in range(1, EPOCHS + 1)
                ]
                run.provenance = {"libraries": {"tensorflow": "2.21.0"}, "threads": {"intra_op": 1}}
                for epoch in range(EPOCHS + 1):
                    variables = {
                        name: _digest(
                            name, epoch, "b" if diverges and epoch >= 30 and i < DIVERGING else "a"
                        )
                        for i, name in enumerate(names)
                    }
                    fingerprint = "blake3:" + _digest(json.dumps(variables, sort_keys=True))
                    db.add(
                        TracePointRow(
                            run_id=run.id,
                            seq=epoch,
                            kind="init" if epoch == 0 else "epoch",
                            epoch=epoch,
                            step=10 * epoch,
                            fingerprint=fingerprint,
                            variables=variables,
                        )
                    )
                run.final_fingerprint = fingerprint
            db.flush()
            update_family(db=db, family_id=first.id)
            db.commit()
            return first.id, second.id
    finally:
        engine.dispose()


def _deep_cursor(dashboard: Dashboard, total: int) -> int:
    from sqlalchemy import func, select

    from service.persistence.models import Run

    with dashboard.app.state.sessionmaker() as db:
        top = db.scalar(select(func.max(Run.id))) or total
    return max(int(top * 0.1), 2)


def _row(
    benchmark: str, configuration: str, measured: float, baseline: float, *, ratio_target: float
) -> Row:
    ratio = round(measured / baseline, 2) if baseline else None
    met = measured < RUNS_TARGET_MS and (ratio is None or ratio <= ratio_target)
    return Row(
        section="dashboard",
        benchmark=benchmark,
        configuration=configuration,
        unit="ms",
        measured=round(measured, 2),
        baseline=round(baseline, 2),
        ratio=ratio,
        target=f"< {RUNS_TARGET_MS:.0f} ms, ratio <= {ratio_target}",
        met=met,
    )


def measure(quick: bool) -> list[Row]:
    """Every row of the section."""
    from service.persistence.migrate import upgrade

    budget = QUICK if quick else FULL
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        data_dir = Path(tmp)
        url = f"sqlite:///{data_dir / 'reprotrain.db'}"
        upgrade(url)
        stored = 0
        first_page: float | None = None
        for size in budget.sizes:
            progress(f"dashboard: filling to {size:,} runs")
            stored = fill_runs(url, size - stored, queued=min(100, size // 10))
            dashboard = Dashboard(data_dir)
            try:
                page1 = dashboard.median_ms("/", budget.samples)
                deep = dashboard.median_ms(
                    f"/?before={_deep_cursor(dashboard, stored)}", budget.samples
                )
                failed = dashboard.median_ms("/?status=failed", budget.samples)
                by_metric = dashboard.median_ms(METRIC_SORTED, budget.samples)
                searched = dashboard.median_ms(SEARCHED, budget.samples)
                if 'id="run-' not in dashboard.get(SEARCHED).text:
                    raise RuntimeError(f"{SEARCHED}: no run matches; the timing says nothing")
            finally:
                dashboard.close()
            first_page = first_page or page1
            config = f"{stored:,} runs (SQLite, median of {budget.samples})"
            rows += [
                _row("runs page 1 vs page 1 at the smallest size", config, page1, first_page,
                     ratio_target=1.5),
                _row("runs page 90% deep (keyset cursor) vs page 1", config, deep, page1,
                     ratio_target=1.5),
                _row("runs page filtered by status vs page 1", config, failed, page1,
                     ratio_target=3.0),
                _row("runs page with metric columns, sorted by final loss, vs page 1", config,
                     by_metric, page1, ratio_target=METRIC_RATIO),
                _row("runs page searched by a parameter and a metric, with parameter columns, "
                     "vs page 1", config, searched, page1, ratio_target=SEARCH_RATIO),
            ]  # fmt: skip
            progress(f"dashboard: {stored:,} runs: page 1 {page1:.1f} ms, deep {deep:.1f} ms, "
                     f"filtered {failed:.1f} ms, by loss {by_metric:.1f} ms, "
                     f"searched {searched:.1f} ms")  # fmt: skip
        progress(f"dashboard: a {EPOCHS}-epoch, {VARIABLES}-variable pair")
        a, b = add_large_pair(data_dir)
        dashboard = Dashboard(data_dir)
        try:
            base = dashboard.median_ms("/", budget.samples)
            pages: dict[str, Callable[[], float]] = {
                f"run page (/runs/{{id}}), {EPOCHS + 1} points x {VARIABLES} variables": (
                    lambda: dashboard.median_ms(f"/runs/{b}", budget.samples)
                ),
                f"compare page with its divergence map, {EPOCHS + 1} x {VARIABLES}": (
                    lambda: dashboard.median_ms(f"/compare?a={a}&b={b}", budget.samples)
                ),
            }
            for name, timed in pages.items():
                measured = timed()
                progress(f"dashboard: {name}: {measured:.1f} ms")
                rows.append(
                    Row(
                        section="dashboard",
                        benchmark=name,
                        configuration=f"vs runs page 1 (median of {budget.samples})",
                        unit="ms",
                        measured=round(measured, 2),
                        baseline=round(base, 2),
                        ratio=round(measured / base, 2),
                        target=f"< {PAGE_TARGET_MS:.0f} ms",
                        met=measured < PAGE_TARGET_MS,
                    )
                )
        finally:
            dashboard.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = measure(args.quick)
    if args.out:
        write_json(args.out, rows)
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
