"""Verdict of a rerun against its reference: identical, or where and how it diverged.

TensorFlow-free: the API gives verdicts with it, and so does `repro compare`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from worker.trace import TracePoint, compare_traces

Trace = Sequence[TracePoint | Mapping[str, Any]]


def compare_runs(
    *,
    trace_a: Trace,
    trace_b: Trace,
    final_a: str | None,
    final_b: str | None,
    data_a: Mapping[int, str],
    data_b: Mapping[int, str],
) -> dict[str, Any]:
    """`{"verdict": "identical", ...}` or `{"verdict": "diverged", "first_divergence": ...}`.

    Identical means equal final fingerprints and equal fingerprints at every trace point,
    with the same points recorded by both runs.
    """
    comparison = compare_traces(trace_a, trace_b)
    if comparison.identical and final_a is not None and final_a == final_b:
        return {
            "verdict": "identical",
            "fingerprint": final_a,
            "points": comparison.compared_points,
        }
    report: dict[str, Any] = {"verdict": "diverged", "first_divergence": None, "variables": []}
    div = comparison.first_divergence
    if div is not None:
        report["first_divergence"] = {
            "kind": div.point.kind,
            "epoch": div.point.epoch,
            "step": div.point.step,
            "label": div.point.label(),
        }
        report["variables"] = div.variables
    elif comparison.unmatched_a or comparison.unmatched_b:
        report["reason"] = "the runs recorded different trace points"
    differing = sorted(e for e in data_a if data_b.get(e) != data_a[e])
    report["data_epochs_differing"] = differing
    report["cause"] = "input data differed" if differing else "computation differed (data equal)"
    return report


def compare_records(
    *,
    succeeded: tuple[bool, bool],
    spec_hashes: tuple[str | None, str | None],
    **comparison: Any,
) -> dict[str, Any]:
    """`compare_runs` for two arbitrary runs: `incomparable` unless both succeeded on one spec."""
    if not all(succeeded):
        return {"verdict": "incomparable", "reason": "a run did not succeed"}
    if spec_hashes[0] != spec_hashes[1]:
        return {"verdict": "incomparable", "reason": "the runs have different specs"}
    return compare_runs(**comparison)


def describe(report: Mapping[str, Any]) -> str:
    """One line for people: the verdict and, when diverged, where and in what."""
    if report["verdict"] == "identical":
        return f"identical  {report['fingerprint']}  ({report['points']} trace points equal)"
    if report["verdict"] != "diverged":
        return f"{report['verdict']}: {report.get('reason', '')}".rstrip(": ")
    div = report.get("first_divergence")
    where = div["label"] if div else report.get("reason", "the final state")
    names = ", ".join(report.get("variables", [])[:5]) or "(no variable list)"
    more = len(report.get("variables", [])) - 5
    names += f" and {more} more" if more > 0 else ""
    return f"diverged at {where} in {names}; {report['cause']}"
