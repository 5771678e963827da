"""Comparing runs whose code bundles differ: the report names the bundles and the files whose
digests differ (from the per-file manifests in provenance), flags them as changing results,
and its spec diff names the bundle digests."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from service.schemas import ComparisonReport
from worker.compare.verdict import RunRecord, build_report
from worker.record.fingerprint import combine
from worker.record.trace import TracePoint

VARS = ["model/hidden/kernel", "model/hidden/bias"]
OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64
SHARED = {"ring_layers/__init__.py": "1" * 64, "ring_layers/data.py": "2" * 64}


def _trace(epochs: int, diverge_at: int | None = None) -> list[TracePoint]:
    points = []
    for epoch in range(epochs + 1):
        variables = {v: hashlib.sha256(f"{v}-{epoch}".encode()).hexdigest() for v in VARS}
        if diverge_at is not None and epoch >= diverge_at:
            variables[VARS[0]] = hashlib.sha256(f"other-{epoch}".encode()).hexdigest()
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


def _code(digest: str, files: Mapping[str, str]) -> dict[str, Any]:
    return {"digest": digest, "name": "ring_layers", "version": "1.0", "files": dict(files)}


def _record(label: str, trace: Sequence[TracePoint], code: dict[str, Any] | None) -> RunRecord:
    spec: dict[str, Any] = {"name": "rings", "seed": [5, 0], "dataset": {"generator": "rings"}}
    provenance: dict[str, Any] = {"libraries": {"tensorflow": "2.21.0"}}
    if code is not None:
        spec["code"] = code["digest"]
        provenance["code"] = code
    return RunRecord(
        label=label,
        status="succeeded",
        spec_hash=f"sha256:{spec.get('code')}",
        granularity="epoch",
        final_fingerprint=trace[-1].fingerprint,
        trace=trace,
        data={e: f"data-{e}" for e in range(1, len(trace))},
        provenance=provenance,
        spec=spec,
    )


def test_one_changed_model_file_is_named_in_the_explanation_and_spec_diff() -> None:
    a = _record("run 1", _trace(2), _code(OLD, {**SHARED, "ring_layers/model.py": "3" * 64}))
    b = _record("run 2", _trace(2, 1), _code(NEW, {**SHARED, "ring_layers/model.py": "4" * 64}))
    report = ComparisonReport.model_validate(build_report(a, b))
    assert report.verdict == "diverged"
    assert report.code_bundles == {"a": OLD, "b": NEW}
    assert [(f.path, f.change) for f in report.code_files_differing] == [
        ("ring_layers/model.py", "changed")
    ]
    assert "ring_layers/model.py" in report.explanation
    assert "changes results" in report.explanation
    assert "ring_layers/data.py" not in report.explanation
    assert {"path": "code", "a": OLD, "b": NEW} in [d.model_dump() for d in report.spec_diff]
    flagged = {d.field: d for d in report.provenance_diff}
    assert flagged["code.files.ring_layers/model.py"].breaks_reproducibility
    assert flagged["code.digest"].breaks_reproducibility


def test_identical_weights_from_other_bundles_still_say_the_code_differs() -> None:
    # A comment-only change trains the same bits; the report still names the file.
    a = _record("run 1", _trace(2), _code(OLD, {**SHARED, "ring_layers/model.py": "3" * 64}))
    b = _record("run 2", _trace(2), _code(NEW, {**SHARED, "ring_layers/extra.py": "5" * 64}))
    report = ComparisonReport.model_validate(build_report(a, b))
    assert report.verdict == "identical"
    changes = {f.path: f.change for f in report.code_files_differing}
    assert changes == {"ring_layers/model.py": "removed", "ring_layers/extra.py": "added"}
    assert "ring_layers/extra.py (added)" in report.explanation
    assert "ring_layers/model.py (removed)" in report.explanation


def test_a_run_without_a_bundle_against_one_with() -> None:
    a = _record("run 1", _trace(2), None)
    b = _record("run 2", _trace(2, 1), _code(NEW, SHARED))
    report = ComparisonReport.model_validate(build_report(a, b))
    assert report.code_bundles == {"a": None, "b": NEW}
    assert report.explanation.startswith(f"Only the second run ran a code bundle ({NEW})")


def test_runs_of_one_bundle_report_no_code_difference() -> None:
    code = _code(OLD, SHARED)
    report = build_report(_record("run 1", _trace(2), code), _record("run 2", _trace(2), code))
    assert report["verdict"] == "identical"
    assert report["code_bundles"] is None and report["code_files_differing"] == []
    assert "code bundle" not in report["explanation"]
