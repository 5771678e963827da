"""N runs compared at once: every pair's verdict, the spec and environment fields that differ
among them, and their metric curves (`GET /api/v1/compare/runs`, the N-way compare page).

Pairs grow with N squared, so no pair's full report is built here: a rerun's verdict against
its reference is read as kept, any other pair's verdict is decided from the runs' statuses,
specs and trace and final fingerprints, loaded once per run. The two-run report (one link
per pair) has the detail: where, in which variables, by how much.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from service.errors import InvalidQuery
from service.persistence.models import Run, Verdict
from service.schemas import MAX_ID
from service.verification.comparisons import record_of
from worker.compare.spec_diff import classify_provenance, diff_specs
from worker.compare.verdict import RunRecord, verdict_of
from worker.record.provenance import diff_provenance

_LOC = "query.runs"
_UNSET = object()


def _refuse(message: str) -> InvalidQuery:
    return InvalidQuery(message, errors=[{"loc": _LOC, "msg": message}])


def parse_run_ids(values: Iterable[str], *, max_runs: int) -> list[int]:
    """Run ids from `runs=1,2,3` (or `runs` repeated), in order, each once; InvalidQuery (422)
    for a value that is not a run id, fewer than two runs or more than `max_runs`."""
    ids: dict[int, None] = {}
    for value in values:
        for part in value.split(","):
            text = part.strip()
            if not text:
                continue
            if not text.isascii() or not text.isdigit() or len(text) > 10:
                raise _refuse(f"{text[:20]!r} is not a run id")
            number = int(text)
            if not 1 <= number <= MAX_ID:
                raise _refuse(f"{number} is not a run id (1 to {MAX_ID})")
            ids[number] = None
            if len(ids) > max_runs:
                raise _refuse(
                    f"at most {max_runs} runs can be compared at once (REPRO_MAX_COMPARE_RUNS)"
                )
    if len(ids) < 2:
        raise _refuse("name at least two different runs, e.g. runs=1,2")
    return list(ids)


def _load_runs(db: Session, ids: Sequence[int]) -> list[Run]:
    found = {
        r.id: r
        for r in db.scalars(
            select(Run).where(Run.id.in_(ids)).options(selectinload(Run.experiment))
        )
    }
    missing = [i for i in ids if i not in found]
    if missing:
        names = ", ".join(map(str, missing))
        raise _refuse(f"no run {names}" if len(missing) == 1 else f"no runs {names}")
    return [found[i] for i in ids]


def _stored_verdicts(db: Session, ids: Sequence[int]) -> dict[frozenset[int], str]:
    """Verdicts kept for reruns against their reference, for pairs among `ids`."""
    rows = db.execute(
        select(Verdict.run_id, Verdict.reference_run_id, Verdict.verdict).where(
            Verdict.run_id.in_(ids), Verdict.reference_run_id.in_(ids)
        )
    )
    return {frozenset((run, reference)): verdict for run, reference, verdict in rows}


def _pairs(
    records: Sequence[RunRecord], runs: Sequence[Run], stored: Mapping[frozenset[int], str]
) -> list[dict[str, Any]]:
    """Every pair once, run a before run b in the order asked."""
    out = []
    for i, a in enumerate(runs):
        for j in range(i + 1, len(runs)):
            b = runs[j]
            verdict, reason = verdict_of(records[i], records[j])
            kept = stored.get(frozenset((a.id, b.id)))
            if kept is not None and kept != verdict:
                verdict, reason = kept, "as recorded when the rerun finished"
            out.append(
                {"a": a.id, "b": b.id, "verdict": verdict, "reason": reason,
                 "stored": kept is not None}
            )  # fmt: skip
    return out


def _across(
    diffs: Sequence[Sequence[Mapping[str, Any]]], key: str, count: int
) -> list[dict[str, Any]]:
    """Fields differing among N runs from the diffs of runs 1..N-1 against run 0: a field two
    runs disagree on differs from run 0 in at least one of them, so none is missed."""
    fields: dict[str, dict[str, Any]] = {}
    for i, diff in enumerate(diffs, start=1):
        for d in diff:
            name = str(d[key])
            row = fields.setdefault(
                name,
                {"field": name, "values": [d["a"]] + [_UNSET] * (count - 1),
                 "breaks_reproducibility": bool(d.get("breaks_reproducibility")),
                 "why": d.get("why")},
            )  # fmt: skip
            row["values"][i] = d["b"]
    for row in fields.values():
        row["values"] = [row["values"][0] if v is _UNSET else v for v in row["values"]]
    rows = [r for r in fields.values() if len({repr(v) for v in r["values"]}) > 1]
    return sorted(rows, key=lambda r: (not r["breaks_reproducibility"], r["field"]))


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _curves(runs: Sequence[Run]) -> dict[str, list[dict[str, Any]]]:
    """Each metric's (epoch, value) points per run, loss first; runs without it left out."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        series: dict[str, list[tuple[float, float]]] = {}
        for row in run.metrics or []:
            if not isinstance(row, Mapping):
                continue
            epoch = _finite(row.get("epoch"))
            for name, value in row.items():
                y = _finite(value)
                if epoch is None or y is None or name in ("epoch", "step", "seconds"):
                    continue
                series.setdefault(str(name), []).append((epoch, y))
        for name, points in series.items():
            curves.setdefault(name, []).append({"run": run.id, "points": points})
    return dict(sorted(curves.items(), key=lambda item: (item[0] != "loss", item[0])))


def compare_runs(db: Session, *, run_ids: Sequence[int]) -> dict[str, Any]:
    """The N-way comparison of these runs (see `ManyRunsComparison`); InvalidQuery (422)
    naming the ids of runs that do not exist."""
    runs = _load_runs(db, run_ids)
    records = [record_of(db, r, strict=False) for r in runs]
    first = records[0]
    spec_diffs = [
        [{**d, "field": d["path"]} for d in diff_specs(first.spec, r.spec)] for r in records[1:]
    ]
    environment_diffs = [
        classify_provenance(diff_provenance(first.provenance, r.provenance)) for r in records[1:]
    ]
    return {
        "runs": [r.id for r in runs],
        "pairs": _pairs(records, runs, _stored_verdicts(db, run_ids)),
        "spec_diff": _across(spec_diffs, "field", len(runs)),
        "environment_diff": _across(environment_diffs, "field", len(runs)),
        "curves": _curves(runs),
    }
