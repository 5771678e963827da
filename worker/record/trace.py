"""Fingerprint traces and their comparison (pure Python: the API uses it to give verdicts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

PointKind = Literal["init", "step", "epoch"]
_KIND_ORDER = {"init": 0, "step": 1, "epoch": 2}


class TracePoint(BaseModel):
    """The training state's fingerprint at one moment.

    `epoch` is 1-based for points taken during or at the end of that epoch; the `init`
    point (before any step) has epoch 0. `step` counts optimizer steps since the start.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: PointKind
    epoch: int
    step: int
    fingerprint: str
    variables: dict[str, str]

    @property
    def key(self) -> tuple[int, int, int]:
        """Position in training order; equal keys mean the same moment in two runs."""
        return (self.epoch, self.step, _KIND_ORDER[self.kind])

    def label(self) -> str:
        """Human wording of the moment, e.g. 'end of epoch 3' or 'epoch 2, step 40'."""
        if self.kind == "init":
            return "initialisation"
        if self.kind == "epoch":
            return f"end of epoch {self.epoch}"
        return f"epoch {self.epoch}, step {self.step}"


@dataclass(frozen=True)
class Divergence:
    """The first trace point at which two runs differ, and how."""

    index: int  # position among the points both traces have
    point: TracePoint  # as recorded by the first run
    changed: list[str]  # variables present in both with different digests
    only_in_a: list[str]
    only_in_b: list[str]

    @property
    def variables(self) -> list[str]:
        """Every variable path that differs at this point."""
        return self.changed + self.only_in_a + self.only_in_b


@dataclass(frozen=True)
class TraceComparison:
    """Result of comparing two traces point by point."""

    identical: bool
    compared_points: int
    first_divergence: Divergence | None
    # Moments recorded by one run only (different granularity, or a shorter run).
    unmatched_a: list[tuple[int, int, PointKind]] = field(default_factory=list)
    unmatched_b: list[tuple[int, int, PointKind]] = field(default_factory=list)


def _points(trace: Sequence[TracePoint | Mapping[str, Any]]) -> list[TracePoint]:
    points = [p if isinstance(p, TracePoint) else TracePoint.model_validate(p) for p in trace]
    return sorted(points, key=lambda p: p.key)


def diff_variables(
    a: Mapping[str, str], b: Mapping[str, str]
) -> tuple[list[str], list[str], list[str]]:
    """(changed, only in a, only in b) variable paths between two digest maps."""
    changed = [path for path, digest in a.items() if path in b and b[path] != digest]
    return changed, [p for p in a if p not in b], [p for p in b if p not in a]


def compare_traces(
    a: Sequence[TracePoint | Mapping[str, Any]], b: Sequence[TracePoint | Mapping[str, Any]]
) -> TraceComparison:
    """Compare at every moment both traces recorded; report the first that differs.

    Identical means: the same moments recorded, and equal fingerprints at every one.
    """
    points_a, points_b = _points(a), _points(b)
    by_key_b = {p.key: p for p in points_b}
    keys_a = {p.key for p in points_a}
    common = [p for p in points_a if p.key in by_key_b]
    first: Divergence | None = None
    for index, pa in enumerate(common):
        pb = by_key_b[pa.key]
        if pa.fingerprint != pb.fingerprint:
            changed, only_a, only_b = diff_variables(pa.variables, pb.variables)
            first = Divergence(index, pa, changed, only_a, only_b)
            break
    unmatched_a = [(p.epoch, p.step, p.kind) for p in points_a if p.key not in by_key_b]
    unmatched_b = [(p.epoch, p.step, p.kind) for p in points_b if p.key not in keys_a]
    identical = first is None and not unmatched_a and not unmatched_b and bool(common)
    return TraceComparison(identical, len(common), first, unmatched_a, unmatched_b)


@dataclass(frozen=True)
class Located:
    """Where two traces part, found by comparing combined fingerprints only.

    `first` and `last_equal` index `common` (the moments both traces recorded, in training
    order). `first` is None when every common moment is equal. `inspected` counts the
    moments whose fingerprints were compared.
    """

    common: list[tuple[TracePoint, TracePoint]]
    first: int | None
    last_equal: int | None
    inspected: int
    unmatched_a: list[tuple[int, int, PointKind]]
    unmatched_b: list[tuple[int, int, PointKind]]


def locate_divergence(
    a: Sequence[TracePoint | Mapping[str, Any]], b: Sequence[TracePoint | Mapping[str, Any]]
) -> Located:
    """The first common moment at which the runs' combined fingerprints differ.

    Training state evolves from the state before it, so once two runs differ they keep
    differing: the common moments form a run of equal points followed by a run of
    different ones, and the boundary is found by bisection in O(log n) comparisons. The
    first and last moments are compared first; if the last is equal the traces are scanned
    point by point, so a transient difference (state that later re-converged, which
    bisection would miss) is still reported. Only combined fingerprints are compared;
    per-variable digests are left to the caller, for the one point that matters.
    """
    points_a, points_b = _points(a), _points(b)
    by_key_b = {p.key: p for p in points_b}
    keys_a = {p.key for p in points_a}
    common = [(p, by_key_b[p.key]) for p in points_a if p.key in by_key_b]
    unmatched_a = [(p.epoch, p.step, p.kind) for p in points_a if p.key not in by_key_b]
    unmatched_b = [(p.epoch, p.step, p.kind) for p in points_b if p.key not in keys_a]

    def equal(i: int) -> bool:
        return common[i][0].fingerprint == common[i][1].fingerprint

    if not common:
        return Located(common, None, None, 0, unmatched_a, unmatched_b)
    last = len(common) - 1
    inspected = 1
    if equal(last):
        # No boundary to bisect for: make sure nothing in between differed.
        first = next((i for i in range(last) if not equal(i)), None)
        inspected += last
        last_equal = last if first is None else (first - 1 if first > 0 else None)
        return Located(common, first, last_equal, inspected, unmatched_a, unmatched_b)
    inspected += 1
    if not equal(0):
        return Located(common, 0, None, inspected, unmatched_a, unmatched_b)
    lo, hi = 0, last  # invariant: equal(lo) and not equal(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        inspected += 1
        if equal(mid):
            lo = mid
        else:
            hi = mid
    return Located(common, hi, lo, inspected, unmatched_a, unmatched_b)
