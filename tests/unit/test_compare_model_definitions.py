"""Two runs of different Keras model definitions: the comparison lists the layers whose
config differs, flags the difference as changing results, and says so in its explanation."""

from __future__ import annotations

import hashlib
from typing import Any

from service.schemas import ComparisonReport
from worker.compare.verdict import RunRecord, build_report
from worker.record.fingerprint import combine
from worker.record.trace import TracePoint

DEF_A = "sha256:" + "a" * 64
DEF_B = "sha256:" + "b" * 64


def _trace(salt: str) -> list[TracePoint]:
    points = []
    for epoch in range(3):
        variables = {"model/dense/kernel": hashlib.sha256(f"{epoch}{salt}".encode()).hexdigest()}
        kind = "init" if epoch == 0 else "epoch"
        fingerprint = combine(variables.items())
        points.append(
            TracePoint(
                kind=kind, epoch=epoch, step=epoch * 2, fingerprint=fingerprint, variables=variables
            )
        )
    return points


def _layer(class_name: str, config: str) -> dict[str, Any]:
    return {"class_name": class_name, "parameters": 10, "config_sha256": config}


def _record(digest: str, layers: dict[str, Any], salt: str) -> RunRecord:
    trace = _trace(salt)
    return RunRecord(
        label="run",
        status="succeeded",
        spec_hash=f"sha256:spec-{digest}",
        granularity="epoch",
        final_fingerprint=trace[-1].fingerprint,
        trace=trace,
        data={1: "blake3:d1", 2: "blake3:d2"},
        provenance={"model_definition": {"digest": digest, "layers": layers}},
        spec={"name": "m", "model": {"architecture": "keras", "definition": digest}},
    )


BASE = {"net/conv": _layer("Conv2D", "c1"), "net/bn": _layer("BatchNormalization", "b1")}


def test_the_layers_whose_config_differs_are_listed_and_flagged() -> None:
    other = {"net/conv": _layer("Conv2D", "c2"), "net/head": _layer("Dense", "h1")}
    report = build_report(_record(DEF_A, BASE, "x"), _record(DEF_B, other, "y"))
    assert report["model_layers_differing"] == [
        {"layer": "net/bn", "change": "removed", "class_a": "BatchNormalization", "class_b": None},
        {"layer": "net/conv", "change": "changed", "class_a": "Conv2D", "class_b": "Conv2D"},
        {"layer": "net/head", "change": "added", "class_a": None, "class_b": "Dense"},
    ]
    text = report["explanation"]
    assert text.startswith(f"The runs trained different model definitions ({DEF_A} vs {DEF_B})")
    assert "changes results" in text and "net/conv (Conv2D, changed)" in text
    digest_row = next(
        d for d in report["provenance_diff"] if d["field"] == "model_definition.digest"
    )
    assert digest_row["breaks_reproducibility"] and "model definition" in digest_row["why"]
    shown = ComparisonReport.model_validate(report)  # the API and the compare page keep it
    assert [m.layer for m in shown.model_layers_differing] == ["net/bn", "net/conv", "net/head"]


def test_the_same_definition_lists_nothing() -> None:
    report = build_report(_record(DEF_A, BASE, "x"), _record(DEF_A, BASE, "x"))
    assert report["verdict"] == "identical"
    assert report["model_layers_differing"] == []
    assert "model definitions" not in report["explanation"]
