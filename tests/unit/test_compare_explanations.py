"""What a comparison report tells about the data: a different dataset is flagged as changing
results, and datasets that differ only in rows training never read are said to."""

from __future__ import annotations

import hashlib
from typing import Any

from service.cli.report import report_lines
from service.schemas import ComparisonReport
from worker.compare.verdict import RunRecord, build_report
from worker.record.fingerprint import combine
from worker.record.trace import TracePoint

VARS = ["model/dense/kernel", "model/dense/bias"]
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def _trace(epochs: int, salt: str = "") -> list[TracePoint]:
    points = []
    for epoch in range(epochs + 1):
        variables = {v: hashlib.sha256(f"{v}-{epoch}{salt}".encode()).hexdigest() for v in VARS}
        points.append(
            TracePoint(
                kind="init" if epoch == 0 else "epoch",
                epoch=epoch,
                step=epoch * 4,
                fingerprint=combine(variables.items()),
                variables=variables,
            )
        )
    return points


def _spec(digest: str, eval_batches: int = 2) -> dict[str, Any]:
    return {
        "name": "held-out",
        "seed": [7, 0],
        "dataset": {
            "generator": "arrays",
            "data": digest,
            "params": {"eval_fraction": 0.2},
            "batch_size": 8,
            "train_batches": 4,
            "eval_batches": eval_batches,
        },
    }


def _record(digest: str, *, epochs: int = 3, **changes: Any) -> RunRecord:
    trace = changes.pop("trace", _trace(epochs))
    fields: dict[str, Any] = {
        "label": "run",
        "status": "succeeded",
        "spec_hash": f"sha256:spec-{digest}",
        "granularity": "epoch",
        "final_fingerprint": trace[-1].fingerprint,
        "trace": trace,
        "data": {e: f"blake3:data-{e}" for e in range(1, epochs + 1)},
        "provenance": {"libraries": {"tensorflow": "2.21.0"}, "dataset": {"digest": digest}},
        "spec": _spec(digest),
        "eval_data": "blake3:eval",
    }
    return RunRecord(**{**fields, **changes})


def test_a_different_dataset_is_flagged_as_changing_results_in_api_cli_and_page() -> None:
    report = build_report(_record(DIGEST_A), _record(DIGEST_B, trace=_trace(3, salt="x")))
    first = report["provenance_diff"][0]
    assert first["field"] == "dataset.digest"
    assert first["breaks_reproducibility"] is True and "dataset" in first["why"]
    # The API answer (and the compare page's "Affects the bits?" column) keeps the flag.
    shown = ComparisonReport.model_validate(report).provenance_diff[0]
    assert shown.field == "dataset.digest" and shown.breaks_reproducibility
    # The command line marks it with the "can change results" star.
    lines = report_lines(report)
    row = next(line for line in lines if "dataset.digest" in line and DIGEST_A in line)
    assert row.lstrip().startswith("*")


def test_the_seed_and_spec_hash_recorded_in_provenance_change_results() -> None:
    a = _record(DIGEST_A, provenance={"seed": [7, 0], "spec_hash": "sha256:1"})
    b = _record(DIGEST_A, provenance={"seed": [8, 0], "spec_hash": "sha256:2"})
    flagged = {
        d["field"]: d["breaks_reproducibility"] for d in build_report(a, b)["provenance_diff"]
    }
    assert flagged == {"seed.0": True, "spec_hash": True}


def test_datasets_differing_only_in_held_out_rows_are_explained() -> None:
    a, b = _record(DIGEST_A), _record(DIGEST_B, eval_data="blake3:other-eval")
    report = build_report(a, b)
    assert report["verdict"] == "identical"
    text = report["explanation"]
    assert (
        f"The datasets differ ({DIGEST_A} vs {DIGEST_B}) only in rows training never read" in text
    )
    assert "the evaluation data differs." in text
    # The dataset is told with the spec difference, not as an environment difference.
    assert "environments differ" not in text


def test_equal_evaluation_data_is_said_to_be_equal() -> None:
    report = build_report(_record(DIGEST_A), _record(DIGEST_B))
    assert "only in rows training never read" in report["explanation"]
    assert "the evaluation data is equal." in report["explanation"]


def test_without_evaluation_neither_run_read_the_differing_rows() -> None:
    a = _record(DIGEST_A, spec=_spec(DIGEST_A, eval_batches=0), eval_data=None)
    b = _record(DIGEST_B, spec=_spec(DIGEST_B, eval_batches=0), eval_data=None)
    text = build_report(a, b)["explanation"]
    assert "only in rows training never read" in text
    assert "neither run evaluated" in text


def test_no_held_out_claim_when_training_data_differs_or_datasets_are_equal() -> None:
    other_data = {e: f"blake3:other-{e}" for e in range(1, 4)}
    differing = build_report(_record(DIGEST_A), _record(DIGEST_B, data=other_data))
    assert "training never read" not in differing["explanation"]
    same = build_report(_record(DIGEST_A), _record(DIGEST_A))
    assert "datasets differ" not in same["explanation"]
