"""N-way comparison's server time: 10 finished runs of one rerun family, 51 trace points of 200
variables and 4 metrics over 50 epochs each, one diverging at epoch 30 in 5 variables.

A migrated SQLite database in a temporary directory; the family's verdicts are recorded as
completion does. `/compare/runs?runs=...` (45 pairs in a matrix, the differing fields, 4
charts of 10 lines with a hover value per point) and `GET /api/v1/compare/runs` are rendered
through the app in this process, each timed request after one untimed, the median kept
(target: < 300 ms), against the runs page of the same database.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.dashboard_pages import Dashboard
from benchmarks.rounds import progress
from benchmarks.rows import Row, write_json

TARGET_MS = 300.0
RUNS, EPOCHS, VARIABLES, DIVERGING = 10, 50, 200, 5


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def add_family(data_dir: Path) -> list[int]:
    """RUNS finished runs of one family; the last diverges at epoch 30 in DIVERGING variables."""
    from sqlalchemy.orm import Session

    from benchmarks.fill import _base_spec
    from service.config import Settings
    from service.persistence.engine import make_engine
    from service.persistence.models import Run, TracePointRow, utcnow
    from service.runs.experiments import create_experiment
    from service.verification.verdicts import update_family
    from worker.spec import ExperimentSpec

    engine = make_engine(f"sqlite:///{data_dir / 'reprotrain.db'}")
    names = [f"model/layer_{i // 2:03d}/{'bias' if i % 2 else 'kernel'}" for i in range(VARIABLES)]
    try:
        with Session(engine) as db:
            spec = ExperimentSpec.model_validate({**_base_spec(), "name": "bench-family"})
            _, first, _ = create_experiment(db=db, spec=spec, settings=Settings(data_dir=data_dir))
            runs = [first]
            for _ in range(RUNS - 1):
                runs.append(Run(experiment_id=first.experiment_id, rerun_of_id=first.id,
                                family_id=first.id, status="queued"))  # fmt: skip
            db.add_all(runs[1:])
            db.flush()
            for n, run in enumerate(runs):
                diverges = n == RUNS - 1
                run.status, run.started_at, run.finished_at = "succeeded", utcnow(), utcnow()
                run.trace_granularity = "epoch"
                run.metrics = [
                    {"epoch": e, "step": 10 * e, "loss": 1 / e + (0.01 if diverges else 0),
                     "accuracy": 1 - 1 / (e + 1), "eval_loss": 1.1 / e, "lr": 0.01}
                    for e in range(1, EPOCHS + 1)
                ]  # fmt: skip
                run.provenance = {
                    "libraries": {"tensorflow": "2.21.0", "numpy": "2.4.6"},
                    "threads": {"intra_op": 1 if not diverges else 2},
                    "environment": {f"VAR_{i}": str(i) for i in range(50)},
                }
                for epoch in range(EPOCHS + 1):
                    moved = diverges and epoch >= 30
                    variables = {
                        name: _digest(name, epoch, "b" if moved and i < DIVERGING else "a")
                        for i, name in enumerate(names)
                    }
                    fingerprint = "blake3:" + _digest(json.dumps(variables, sort_keys=True))
                    db.add(TracePointRow(run_id=run.id, seq=epoch,
                                         kind="init" if epoch == 0 else "epoch", epoch=epoch,
                                         step=10 * epoch, fingerprint=fingerprint,
                                         variables=variables))  # fmt: skip
                run.final_fingerprint = fingerprint
                db.flush()
            update_family(db=db, family_id=first.id)
            db.commit()
            return [r.id for r in runs]
    finally:
        engine.dispose()


def _median_ms(dashboard: Dashboard, url: str, samples: int, headers: dict[str, str]) -> float:
    def get() -> None:
        answer = dashboard._run(dashboard.client.get(url, headers=headers))
        if answer.status_code != 200:
            raise RuntimeError(f"{url}: {answer.status_code} {answer.text[:500]}")

    get()  # untimed: warms caches and compiles templates
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        get()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(quick: bool) -> list[Row]:
    """The page's and the API's rows."""
    from service.auth import tokens as auth
    from service.persistence.migrate import upgrade

    samples = 3 if quick else 15
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-compare-runs-") as tmp:
        data_dir = Path(tmp)
        upgrade(f"sqlite:///{data_dir / 'reprotrain.db'}")
        progress(f"dashboard: a family of {RUNS} runs, {EPOCHS + 1} x {VARIABLES}")
        ids = ",".join(map(str, add_family(data_dir)))
        dashboard = Dashboard(data_dir)
        try:
            with dashboard.app.state.sessionmaker() as db:
                _, token = auth.create_token(db=db, name="bench-api", role="viewer")
            bearer = {"Authorization": f"Bearer {token}"}
            base = _median_ms(dashboard, "/", samples, {})
            timed = {
                f"N-way compare page (/compare/runs), {RUNS} runs": ("/compare/runs", {}),
                f"N-way compare API (GET /api/v1/compare/runs), {RUNS} runs": (
                    "/api/v1/compare/runs",
                    bearer,
                ),
            }
            for name, (path, headers) in timed.items():
                measured = _median_ms(dashboard, f"{path}?runs={ids}", samples, headers)
                progress(f"dashboard: {name}: {measured:.1f} ms")
                rows.append(
                    Row(
                        section="dashboard",
                        benchmark=name,
                        configuration=f"{EPOCHS + 1} points x {VARIABLES} variables, 4 metrics; "
                        f"vs runs page 1 (median of {samples})",
                        unit="ms",
                        measured=round(measured, 2),
                        baseline=round(base, 2),
                        ratio=round(measured / base, 2),
                        target=f"< {TARGET_MS:.0f} ms",
                        met=measured < TARGET_MS,
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
