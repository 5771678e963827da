"""Filling a migrated database with many runs quickly, through the service's own models.

The rows look like a service that has been in use for a while: four runs in five are the
first run of their experiment, the fifth is a rerun of one of them (same experiment and
family); most have finished, with provenance, metrics and a fingerprint. The newest runs
of each fill are queued, so there is always something to claim.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, insert, select, update
from sqlalchemy.orm import Session

from service.models import Experiment, Run, utcnow

REPO = Path(__file__).resolve().parents[1]
BATCH = 5000  # runs per transaction: a multiple of 5, so no rerun is split from its run
_STATUSES = ("succeeded",) * 8 + ("failed", "cancelled")
_PROVENANCE = {
    "python": "3.11.7",
    "tensorflow": "2.21.0",
    "keras": "3.15.1",
    "cpu": "AMD EPYC",
    "threads": {"intra_op": 2, "inter_op": 1},
}
_METRICS = [{"epoch": e, "step": 7 * e, "loss": 0.7 - e / 100, "accuracy": 0.5} for e in (1, 2, 3)]


def _digest(prefix: str, text: str) -> str:
    return f"{prefix}:{hashlib.sha256(text.encode()).hexdigest()}"


def _base_spec() -> dict[str, Any]:
    from worker.spec import load_spec

    return load_spec(REPO / "examples" / "seed001.yaml").model_dump(mode="json")


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
        "metrics": _METRICS if status == "succeeded" else None,
        "error": {"type": "Failed", "message": "training raised"} if status == "failed" else None,
    }


def fill_runs(database_url: str, count: int, *, queued: int = 100) -> int:
    """Add `count` runs, the newest `queued` of them queued; returns the runs now stored."""
    engine = create_engine(database_url)
    base = _base_spec()
    now = utcnow()
    try:
        with Session(engine) as db:
            start = db.scalar(select(func.count()).select_from(Run)) or 0
            for first in range(0, count, BATCH):
                positions = range(first, min(first + BATCH, count))

                def is_rerun(p: int) -> bool:
                    return p % 5 == 4 and p < count - queued

                def created(p: int) -> datetime:
                    return now - timedelta(seconds=count - p)

                originals = [p for p in positions if not is_rerun(p)]
                experiments = []
                for p in originals:
                    spec = {**base, "name": f"fill-{start + p}", "seed": [start + p, 7]}
                    spec_hash = _digest("sha256", json.dumps(spec, sort_keys=True))
                    experiments.append(
                        {
                            "name": spec["name"],
                            "spec": spec,
                            "spec_hash": spec_hash,
                            "submitted_spec_hash": spec_hash,
                            "seed": spec["seed"],
                            "seed_source": "spec",
                            "created_at": created(p),
                        }
                    )
                experiment_ids = db.scalars(
                    insert(Experiment).returning(Experiment.id, sort_by_parameter_order=True),
                    experiments,
                ).all()
                run_rows = [
                    {
                        "experiment_id": experiment_id,
                        **_fields(
                            "queued" if p >= count - queued else _STATUSES[p % 10],
                            created(p),
                            start + p,
                        ),
                    }
                    for p, experiment_id in zip(originals, experiment_ids, strict=True)
                ]
                run_ids = db.scalars(
                    insert(Run).returning(Run.id, sort_by_parameter_order=True), run_rows
                ).all()
                by_position = dict(zip(originals, zip(run_ids, run_rows, strict=True), strict=True))
                # A rerun repeats the run four places before it: same experiment and family.
                reruns = [
                    {
                        "experiment_id": by_position[p - 4][1]["experiment_id"],
                        "rerun_of_id": by_position[p - 4][0],
                        "family_id": by_position[p - 4][0],
                        **_fields("succeeded", created(p), start + p),
                    }
                    for p in positions
                    if is_rerun(p)
                ]
                if reruns:
                    db.execute(insert(Run), reruns)
                db.execute(update(Run).where(Run.family_id.is_(None)).values(family_id=Run.id))
                db.commit()
            total = db.scalar(select(func.count()).select_from(Run)) or 0
        if engine.dialect.name == "postgresql":
            # What autovacuum soon does after bulk inserts: statistics and the visibility map.
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
    finally:
        engine.dispose()
    return total
