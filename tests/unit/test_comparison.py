"""The comparison report's parts: bisection, numeric sizes, environment diff, verdicts."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.compare.numeric_diff import array_difference, ulp_distance
from worker.compare.verdict import RunRecord, build_report, describe
from worker.record.fingerprint import combine
from worker.record.provenance import diff_provenance
from worker.record.trace import TracePoint, locate_divergence

VARS = [f"model/dense_{i}/kernel" for i in range(4)]


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _trace(epochs: int, diverge_at: int | None = None, var: str = VARS[1]) -> list[TracePoint]:
    points = []
    for epoch in range(epochs + 1):
        variables = {v: _hex(f"{v}-{epoch}") for v in VARS}
        if diverge_at is not None and epoch >= diverge_at:
            variables[var] = _hex(f"other-{epoch}")
        points.append(
            TracePoint(
                kind="init" if epoch == 0 else "epoch",
                epoch=epoch,
                step=epoch * 10,
                fingerprint=combine(variables.items()),
                variables=variables,
            )
        )
    return points


@given(st.integers(min_value=1, max_value=200), st.data())
def test_bisection_finds_the_first_divergent_point_in_log_comparisons(
    epochs: int, data: st.DataObject
) -> None:
    at = data.draw(st.integers(min_value=0, max_value=epochs))
    found = locate_divergence(_trace(epochs), _trace(epochs, diverge_at=at))
    assert found.first == at
    assert found.last_equal == (at - 1 if at > 0 else None)
    # first and last compared, then a binary search over the points in between
    assert found.inspected <= 2 + max(1, epochs).bit_length()


def test_equal_last_point_falls_back_to_a_scan_and_still_sees_a_transient_difference() -> None:
    a, b = _trace(6), _trace(6)
    b[3] = TracePoint(**{**b[3].model_dump(), "fingerprint": "blake3:" + "0" * 64})
    found = locate_divergence(a, b)
    assert (found.first, found.last_equal) == (3, 2)
    assert locate_divergence(a, _trace(6)).first is None


def _record(trace: Sequence[TracePoint], **changes: Any) -> RunRecord:
    fields: dict[str, Any] = {
        "label": "run",
        "status": "succeeded",
        "spec_hash": "sha256:x",
        "granularity": "epoch",
        "final_fingerprint": trace[-1].fingerprint,
        "trace": trace,
        "data": {e: f"data-{e}" for e in range(1, len(trace))},
        "provenance": {"libraries": {"tensorflow": "2.21.0"}, "captured_at": "t0"},
    }
    return RunRecord(**{**fields, **changes})


def test_identical_runs_and_why_others_are_incomparable() -> None:
    report = build_report(_record(_trace(3)), _record(_trace(3), provenance={"captured_at": "t1"}))
    assert report["verdict"] == "identical" and report["points"] == 4
    assert report["provenance_diff"][0]["field"] == "libraries.tensorflow"
    assert "did not change the result" in report["explanation"]

    failed = build_report(_record(_trace(3)), _record(_trace(3), status="failed", label="run 9"))
    assert failed["verdict"] == "incomparable" and "run 9 did not succeed" in failed["reason"]
    other = build_report(_record(_trace(3)), _record(_trace(3), spec_hash="sha256:y"))
    assert "different specs" in other["reason"]
    coarse = build_report(_record(_trace(3)), _record(_trace(3), granularity="steps:5"))
    assert "different granularity" in coarse["reason"] and describe(coarse).startswith(
        "incomparable"
    )


def test_diverged_report_measures_only_the_differing_variables_from_checkpoints() -> None:
    read: list[tuple[int, tuple[str, ...]]] = []

    def reader(shift: float) -> Any:
        def read_checkpoint(epoch: int, paths: Sequence[str]) -> Mapping[str, np.ndarray]:
            read.append((epoch, tuple(paths)))
            base = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
            return {p: base + np.float32(shift) for p in paths}

        return read_checkpoint

    a = _record(_trace(4), checkpoint_epochs=[2, 4], read_checkpoint=reader(0.0))
    b = _record(
        _trace(4, diverge_at=3),
        checkpoint_epochs=[2, 4],
        read_checkpoint=reader(0.5),
        data={**a.data, 3: "data-changed"},
    )
    report = build_report(a, b)
    assert report["verdict"] == "diverged"
    assert report["first_divergence"]["label"] == "end of epoch 3"
    assert report["variables"] == [VARS[1]] and report["layers"] == {"model/dense_1": [VARS[1]]}
    assert read == [(4, (VARS[1],)), (4, (VARS[1],))]  # the first checkpoint after epoch 3
    assert report["differences_measured_at"] == {
        "epoch": 4,
        "label": "end of epoch 4",
        "at_divergence": False,
    }
    [size] = report["differences"]
    assert size["max_abs_diff"] == pytest.approx(0.5)
    assert report["cause"] == "data" and report["data_epochs_differing"] == [3]
    assert (
        "Data identical through epoch 2; the input pipeline diverged in epoch 3"
        in (report["explanation"])
    )
    assert "measured at the end of epoch 4" in report["explanation"]


def test_ulp_distance_counts_representable_floats_across_zero() -> None:
    x = np.array([1.0, 0.0, -0.0, 1e-45, -1e-45, 3.5], dtype=np.float32)
    up = np.nextafter(x, np.float32(np.inf))
    assert ulp_distance(x, up).tolist() == [1, 1, 1, 1, 1, 1]
    assert ulp_distance(np.float32([0.0]), np.float32([-0.0])).tolist() == [0]
    tiny = np.float32([np.float32(1e-45)])
    assert ulp_distance(tiny, -tiny).tolist() == [2]
    big = np.float64([1e300, -1e300])
    assert ulp_distance(big, big[::-1].copy()).tolist()[0] > 2**62  # no overflow
    with pytest.raises(TypeError):
        ulp_distance(np.int32([1]), np.int32([2]))


def test_array_difference_sizes() -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = a.copy()
    b[1, 1] = np.nextafter(b[1, 1], np.float32(10))
    size = array_difference(a, b)
    assert size["elements_differing"] == 1 and size["max_ulp"] == 1
    assert size["max_abs_diff"] == pytest.approx(float(b[1, 1] - a[1, 1]))
    assert size["relative_norm"] == pytest.approx(size["max_abs_diff"] / np.linalg.norm(a))
    same = array_difference(a, a.copy())
    assert (same["elements_differing"], same["max_ulp"], same["max_abs_diff"]) == (0, 0, 0.0)
    ints = array_difference(np.int64([1, 5]), np.int64([1, 9]))
    assert ints["max_abs_diff"] == 4 and ints["max_ulp"] is None
    assert "different dtype/shape" in array_difference(a, a.ravel())["note"]


def test_provenance_diff_flags_reproducibility_breaking_fields_first() -> None:
    a = {
        "threads": {"intra_op": 1, "inter_op": 1},
        "cuda": {"loaded": {"cudnn_version": "9.1.0"}},
        "os": {"release": "6.1"},
        "environment": {"TF_DETERMINISTIC_OPS": "1"},
        "captured_at": "2026-01-01",
    }
    b = {
        "threads": {"intra_op": 2, "inter_op": 1},
        "cuda": {"loaded": {"cudnn_version": "9.3.0"}},
        "os": {"release": "6.2"},
        "environment": {},
        "captured_at": "2026-01-02",
    }
    diff = diff_provenance(a, b)
    assert [(d["field"], d["breaks_reproducibility"]) for d in diff] == [
        ("cuda.loaded.cudnn_version", True),
        ("environment.TF_DETERMINISTIC_OPS", True),
        ("threads.intra_op", True),
        ("os.release", False),
    ]
    assert diff[1]["b"] is None and "reduction" in diff[2]["why"]


def test_explanation_names_the_environment_change() -> None:
    provenance = {"cuda": {"loaded": {"cudnn_version": "9.1.0"}}}
    changed = {"cuda": {"loaded": {"cudnn_version": "9.3.0"}}}
    report = build_report(
        _record(_trace(3), provenance=provenance),
        _record(_trace(3, diverge_at=3), provenance=changed),
    )
    text: str = report["explanation"]
    assert text.startswith("Data identical through epoch 3 (equal data fingerprints)")
    assert "first differ at the end of epoch 3 in model/dense_1/kernel" in text
    assert "cuda.loaded.cudnn_version (9.1.0 vs 9.3.0)" in text
    assert describe(report) == (
        "diverged at end of epoch 3 in model/dense_1/kernel; the computation differed (data equal)"
    )
