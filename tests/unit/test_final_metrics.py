"""What the runs page sorts by: each run's final value of every metric it recorded."""

from __future__ import annotations

from service.config import Settings
from service.runs.final_metrics import finals


def test_final_values_are_the_last_finite_number_of_each_metric() -> None:
    rows = [
        {"epoch": 1, "step": 4, "loss": 0.9, "eval_accuracy": 0.5, "seconds": 2.0},
        {"epoch": 2, "step": 8, "loss": 0.4, "note": "text", "flag": True, "big": 10**400},
        "not a row",
    ]
    assert finals(rows, max_names=64) == {"loss": 0.4, "eval_accuracy": 0.5}
    assert finals(None, max_names=64) == {}


def test_a_result_with_more_names_than_the_limit_keeps_the_first_ones_sortable() -> None:
    row = {"loss": 1.0, **{f"m{i:03d}": float(i) for i in range(100)}, "x" * 201: 3.0}
    kept = finals([row, {"loss": 0.5, "m099": 9.0}], max_names=3)
    assert kept == {"loss": 0.5, "m000": 0.0, "m001": 1.0}
    assert Settings().max_sortable_metrics == 64
    assert Settings(max_sortable_metrics=5).max_sortable_metrics == 5
