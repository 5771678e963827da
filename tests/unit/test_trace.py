"""Trace comparison: the first moment two runs differ, and in which variables."""

from __future__ import annotations

from typing import Any

from worker.record.fingerprint import combine
from worker.record.trace import TracePoint, compare_traces

VARS = ["model/dense_0/kernel", "model/dense_0/bias", "optimizer/adam/iteration"]


def _point(kind: str, epoch: int, step: int, digests: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": kind,
        "epoch": epoch,
        "step": step,
        "fingerprint": combine(digests.items()),
        "variables": digests,
    }


def _trace(
    epochs: int,
    steps_per_epoch: int = 10,
    tamper: dict[int, list[str]] | None = None,
    every_steps: int | None = None,
) -> list[dict[str, Any]]:
    """A trace whose digests depend only on (moment, variable) unless tampered with."""
    tamper = tamper or {}

    def digests(epoch: int, step: int) -> dict[str, str]:
        out = {}
        for var in VARS:
            mark = "bad" if var in tamper.get(epoch, []) else "ok"
            out[var] = combine([(f"{var}@{step}:{mark}", "00" * 32)]).split(":")[1]
        return out

    points = [_point("init", 0, 0, digests(0, 0))]
    for epoch in range(1, epochs + 1):
        if every_steps:
            for step in range((epoch - 1) * steps_per_epoch + 1, epoch * steps_per_epoch + 1):
                if step % every_steps == 0:
                    points.append(_point("step", epoch, step, digests(epoch, step)))
        points.append(
            _point("epoch", epoch, epoch * steps_per_epoch, digests(epoch, epoch * steps_per_epoch))
        )
    return points


def test_equal_traces_are_identical() -> None:
    result = compare_traces(_trace(4), _trace(4))
    assert result.identical
    assert result.first_divergence is None
    assert result.compared_points == 5


def test_finds_the_epoch_and_the_variable_that_differ() -> None:
    a = _trace(5)
    b = _trace(5, tamper={3: ["model/dense_0/bias"], 4: VARS})
    result = compare_traces(a, b)
    assert not result.identical
    div = result.first_divergence
    assert div is not None
    assert (div.point.kind, div.point.epoch, div.point.step) == ("epoch", 3, 30)
    assert div.variables == ["model/dense_0/bias"]
    assert div.point.label() == "end of epoch 3"


def test_divergence_at_initialisation_is_reported_as_such() -> None:
    b = _trace(2, tamper={0: ["model/dense_0/kernel"]})
    div = compare_traces(_trace(2), b).first_divergence
    assert div is not None and div.point.kind == "init" and div.point.label() == "initialisation"


def test_order_of_points_in_the_documents_does_not_matter() -> None:
    a = _trace(3)
    b = list(reversed(_trace(3, tamper={2: ["optimizer/adam/iteration"]})))
    div = compare_traces(a, b).first_divergence
    assert div is not None and div.point.epoch == 2


def test_step_points_localise_within_an_epoch() -> None:
    a = _trace(3, every_steps=5)
    b = _trace(3, every_steps=5)
    # Change one step point's digests in b: step 15 (epoch 2).
    for p in b:
        if p["kind"] == "step" and p["step"] == 15:
            p["variables"] = dict(p["variables"], **{VARS[0]: "ff" * 32})
            p["fingerprint"] = combine(p["variables"].items())
    div = compare_traces(a, b).first_divergence
    assert div is not None and (div.point.kind, div.point.step) == ("step", 15)
    assert div.point.label() == "epoch 2, step 15"
    assert div.changed == [VARS[0]]


def test_different_granularity_is_not_identical_and_says_what_is_unmatched() -> None:
    result = compare_traces(_trace(2, every_steps=5), _trace(2))
    assert not result.identical
    assert result.first_divergence is None
    assert result.unmatched_a == [(1, 5, "step"), (1, 10, "step"), (2, 15, "step"), (2, 20, "step")]
    assert result.unmatched_b == []


def test_variables_missing_on_one_side_are_listed() -> None:
    a = _trace(1)
    b = _trace(1)
    del b[1]["variables"][VARS[2]]
    b[1]["fingerprint"] = combine(b[1]["variables"].items())
    div = compare_traces(a, b).first_divergence
    assert div is not None and div.only_in_a == [VARS[2]] and div.changed == []


def test_empty_traces_are_not_identical() -> None:
    assert not compare_traces([], []).identical
    assert TracePoint.model_validate(_trace(1)[0]).key == (0, 0, 0)
