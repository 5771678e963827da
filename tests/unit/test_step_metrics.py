"""Per-step metric rows: at most MAX_STEP_POINTS a run, spread evenly over its steps; a
script's come from what it logged with a step and no epoch."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.worker_schemas import CompleteIn
from worker.result import MAX_STEP_POINTS, JobResult, step_bucket_size
from worker.script.job import step_rows


def test_buckets_keep_any_run_within_the_bound() -> None:
    assert step_bucket_size(40) == 1
    assert step_bucket_size(MAX_STEP_POINTS) == 1
    assert step_bucket_size(MAX_STEP_POINTS + 1) == 2
    for total in (999, 1000, 1001, 3000, 123_457):  # a job's steps 1..total, bucket (s-1)//k
        bucket = step_bucket_size(total)
        assert len({(s - 1) // bucket for s in range(1, total + 1)}) <= MAX_STEP_POINTS


def test_a_scripts_step_metrics_are_one_row_a_step_thinned_to_the_bound() -> None:
    logged = [{"name": "loss", "value": 1.0 / s, "step": s, "epoch": None} for s in range(1, 5001)]
    logged += [{"name": "lr", "value": 0.1, "step": s, "epoch": None} for s in (1, 2)]
    logged += [{"name": "loss", "value": 0.5, "step": 5000, "epoch": 1}]  # an epoch's: not here
    logged += [{"name": "loss", "value": float("nan"), "step": 7, "epoch": None}]
    rows = step_rows(logged)
    assert len(rows) <= MAX_STEP_POINTS and rows[0] == {"step": 1, "loss": 1.0, "lr": 0.1}
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] >= 4995
    assert all(r["loss"] == 1.0 / r["step"] for r in rows)
    assert step_rows([]) == []
    JobResult(status="succeeded", step_metrics=rows)  # within the document's bound


def test_the_server_refuses_odd_per_step_values_naming_where() -> None:
    def complete(rows: list[dict[str, object]]) -> CompleteIn:
        result = {"status": "failed", "step_metrics": rows}
        return CompleteIn.model_validate({"worker_id": 1, "result": result})

    assert complete([{"step": 3, "epoch": 1, "loss": 0.5}]).result.step_metrics[0]["step"] == 3
    with pytest.raises(ValidationError, match=r"step_metrics\.0\.step must be a whole number"):
        complete([{"step": -1, "loss": 0.5}])
    with pytest.raises(ValidationError, match=r"step_metrics\.1\.loss must be a number"):
        complete([{"step": 1, "loss": 0.5}, {"step": 2, "loss": "high"}])
    with pytest.raises(ValidationError, match="at most 1000"):
        complete([{"step": s, "loss": 0.1} for s in range(MAX_STEP_POINTS + 1)])
