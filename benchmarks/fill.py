"""Filling a migrated database with many runs quickly, through the service's own models.

The rows look like a service that has been in use for a while: four runs in five are the
first run of their experiment, the fifth is a rerun of one of them (same experiment and
family); most have finished, with provenance, metrics (their final values in `run_metrics`, as
the server records them) and a fingerprint; each experiment's parameters are in
`experiment_params`, its learning rate one of three. The newest runs
of each fill are queued, so there is always something to claim.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, insert, select
from sqlalchemy.orm import Session

from service.persistence.models import Experiment, ExperimentParam, Run, RunMetric, utcnow
from service.runs.final_metrics import finals as finals_of
from service.runs.params import param_rows

REPO = Path(__file__).resolve().parents[1]
BATCH = 5000  # runs per transaction: a multiple of 5, so no rerun is split from its run
LEARNING_RATES = (0.001, 0.003, 0.01)
_STATUSES = ("succeeded",) * 8 + ("failed", "cancelled")
_PROVENANCE = {
    "python": "3.11.7",
    "tensorflow": "2.21.0",
    "keras": "3.15.1",
    "cpu": "AMD EPYC",
    "threads": {"intra_op": 2, "inter_op": 1},
}


def _metrics(n: int) -> list[dict[str, Any]]:
    """Three epochs whose final values differ from run to run (a sort has something to do);
    every fourth run was never evaluated."""
    spread = (n * 7919 % 1000) / 10_000
    rows: list[dict[str, Any]] = [
        {"epoch": e, "step": 7 * e, "loss": round(0.7 - e / 100 + spread, 4), "accuracy": 0.5}
        for e in (1, 2, 3)
    ]
    if n % 4:
        rows[-1]["eval_accuracy"] = round(0.5 + spread, 4)
    return rows


def _digest(prefix: str, text: str) -> str:
    return f"{prefix}:{hashlib.sha256(text.encode()).hexdigest()}"


def _base_spec() -> dict[str, Any]:
    from worker.spec import load_spec

    return load_spec(REPO / "examples" / "seed001.yaml").model_dump(mode="json")


def _with_learning_rate(training: dict[str, Any], n: int) -> dict[str, Any]:
    """The spec's training section with one of three learning rates (a search by it finds a
    third of the runs)."""
    optimizer = training["optimizer"]
    rate = LEARNING_RATES[n % len(LEARNING_RATES)]
    return {**training, "optimizer": {**optimizer, "params": {"learning_rate": rate}}}


def _fields(status: str, created: datetime, n: int) -> dict[str, Any]:
    done = status != "queued"
    return {
        "status": status,
        "attempt": 1 if done else 0,
        "created_at": created,
        "started_at": created + timedelta(seconds=1) if done else None,
        "finished_at": created + timedelta(seconds=8) if done else None,
        "final_fingerprint": _digest("blake3", str(n)) if status == "succeeded" else None,
        "trace_granularity": "epoch" if done else None,
        "provenance": _PROVENANCE if done else None,
        "metrics": _metrics(n) if status == "succeeded" else None,
        "error": {"type": "Failed", "message": "training raised"} if status == "failed" else None,
    }


def fill_runs(database_url: str, count: int, *, queued: int = 100) -> int:
    """Add `count` runs, the newest `queued` of them queued; returns the runs now stored.

    Rows get their ids here, after the newest stored ones, in the order the database gave
    them before (a batch's first runs, then its reruns), so the inserts return nothing, and
    every run names every column: the ORM sends a batch's consecutive rows that name the
    same columns as one statement, and leaves out those that are None, so the mix of
    statuses had cut each batch into statements of a few rows, whose returned ids it
    spliced onto all those before. Filling 90,000 runs took SQLite 14 s and PostgreSQL
    25-27 s that way, now 8 and 10, with the same rows. PostgreSQL's id sequences are moved
    past the new ids at the end.
    """
    engine = create_engine(database_url)
    base = _base_spec()
    now = utcnow()
    try:
        with Session(engine) as db:
            start = db.scalar(select(func.count()).select_from(Run)) or 0
            next_experiment = (db.scalar(select(func.max(Experiment.id))) or 0) + 1
            next_run = (db.scalar(select(func.max(Run.id))) or 0) + 1
            for first in range(0, count, BATCH):
                positions = range(first, min(first + BATCH, count))

                def is_rerun(p: int) -> bool:
                    return p % 5 == 4 and p < count - queued

                def created(p: int) -> datetime:
                    return now - timedelta(seconds=count - p)

                originals = [p for p in positions if not is_rerun(p)]
                experiments: list[dict[str, Any]] = []
                for p in originals:
                    spec = {**base, "name": f"fill-{start + p}", "seed": [start + p, 7]}
                    spec["training"] = _with_learning_rate(base["training"], start + p)
                    spec_hash = _digest("sha256", json.dumps(spec, sort_keys=True))
                    experiments.append(
                        {
                            "id": next_experiment + len(experiments),
                            "name": spec["name"],
                            "spec": spec,
                            "spec_hash": spec_hash,
                            "submitted_spec_hash": spec_hash,
                            "seed": spec["seed"],
                            "seed_source": "spec",
                            "created_at": created(p),
                        }
                    )
                next_experiment += len(experiments)
                run_rows: dict[int, dict[str, Any]] = {}
                for p, experiment in zip(originals, experiments, strict=True):
                    run_id = next_run + len(run_rows)
                    status = "queued" if p >= count - queued else _STATUSES[p % 10]
                    run_rows[p] = {
                        "id": run_id,
                        "experiment_id": experiment["id"],
                        "rerun_of_id": None,
                        "family_id": run_id,
                        **_fields(status, created(p), start + p),
                    }
                # A rerun repeats the run four places before it: same experiment and family.
                for p in positions:
                    if is_rerun(p):
                        first_run = run_rows[p - 4]
                        run_rows[p] = {
                            "id": next_run + len(run_rows),
                            "experiment_id": first_run["experiment_id"],
                            "rerun_of_id": first_run["id"],
                            "family_id": first_run["id"],
                            **_fields("succeeded", created(p), start + p),
                        }
                next_run += len(run_rows)
                db.execute(insert(Experiment), experiments)
                # Every row names every column (None as NULL), so the rows go out as one batch.
                db.execute(
                    insert(Run).execution_options(render_nulls=True),
                    list(run_rows.values()),  # in id order: first runs, then reruns
                )
                finals = [
                    {"run_id": row["id"], "name": name, "value": value}
                    for row in run_rows.values()
                    for name, value in finals_of(row["metrics"], max_names=64).items()
                ]
                if finals:
                    db.execute(insert(RunMetric), finals)
                params = [
                    {"experiment_id": r.experiment_id, "name": r.name, "num": r.num, "text": r.text}
                    for e in experiments
                    for r in param_rows(e["id"], e["spec"])
                ]
                db.execute(insert(ExperimentParam), params)
                db.commit()
            total = db.scalar(select(func.count()).select_from(Run)) or 0
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                for table in ("experiments", "runs"):
                    conn.exec_driver_sql(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"(SELECT max(id) FROM {table}))"
                    )
                # What autovacuum soon does after bulk inserts: statistics and the visibility map.
                conn.exec_driver_sql("VACUUM ANALYZE")
    finally:
        engine.dispose()
    return total
