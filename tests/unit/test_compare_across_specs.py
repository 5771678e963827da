"""Comparing runs of different specs, and the node's view of step checkpoints.

Two runs whose specs differ (another replica count, XLA, threads) get the spec diff and
the usual comparison at the trace points both recorded; runs of one spec keep the report
they always had. Step checkpoint files are uploaded and downloaded like epoch ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.schemas import ComparisonReport
from worker.compare.spec_diff import diff_specs
from worker.compare.verdict import RunRecord, build_report, describe
from worker.node.job_files import checkpoint_downloads, checkpoint_uploads
from worker.record.fingerprint import combine
from worker.record.trace import TracePoint

VARS = ["model/dense/kernel", "model/dense/bias"]


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


def _spec(replicas: int = 1, xla: bool = False) -> dict[str, Any]:
    return {
        "name": "blobs",
        "seed": [7, 0],
        "dataset": {"generator": "gaussian_blobs", "batch_size": 8, "xla": xla},
        "distribution": {"replicas": replicas},
    }


def _record(trace: Sequence[TracePoint], run_spec: Mapping[str, Any], **changes: Any) -> RunRecord:
    spec = run_spec
    fields: dict[str, Any] = {
        "label": "run",
        "status": "succeeded",
        "spec_hash": f"sha256:{sorted(spec['distribution'].items())}{spec['dataset']['xla']}",
        "granularity": "epoch",
        "final_fingerprint": trace[-1].fingerprint,
        "trace": trace,
        "data": {e: f"data-{e}" for e in range(1, len(trace))},
        "provenance": {"libraries": {"tensorflow": "2.21.0"}},
        "spec": spec,
    }
    return RunRecord(**{**fields, **changes})


def _reader(offset: float) -> Any:
    def read(epoch: int, paths: Sequence[str]) -> Mapping[str, np.ndarray]:
        return {p: np.full(3, 1.0 + offset * epoch, dtype=np.float32) for p in paths}

    return read


def test_runs_differing_only_in_replicas_get_the_spec_diff_data_and_weight_sizes() -> None:
    a = _record(_trace(3), _spec(1), checkpoint_epochs=[1, 2, 3], read_checkpoint=_reader(0.0))
    b = _record(
        _trace(3, diverge_at=1),
        _spec(2),
        checkpoint_epochs=[1, 2, 3],
        read_checkpoint=_reader(1e-6),
    )
    report = build_report(a, b)
    ComparisonReport.model_validate(report)  # what the API answers with
    assert report["verdict"] == "diverged"
    assert report["spec_diff"] == [{"path": "distribution.replicas", "a": 1, "b": 2}]
    assert report["data_epochs_equal"] == [1, 2, 3] and report["data_epochs_differing"] == []
    assert report["cause"] == "compute" and report["first_divergence"]["epoch"] == 1
    sizes = {d["variable"]: d for d in report["differences"]}
    assert sizes[VARS[0]]["max_abs_diff"] == pytest.approx(1e-6, rel=0.1)
    assert sizes[VARS[0]]["max_ulp"] > 0
    assert "distribution.replicas (1 vs 2)" in report["explanation"]
    assert "nondeterminism within the same environment" not in report["explanation"]
    assert "specs differ: distribution.replicas" in describe(report)


def _differing_from(trace: Sequence[TracePoint], start: int) -> list[TracePoint]:
    """`trace` with every variable different from the point at index `start` on."""
    changed = {
        p.epoch: {v: hashlib.sha256(f"x{d}".encode()).hexdigest() for v, d in p.variables.items()}
        for p in trace
    }
    return [
        p
        if i < start
        else TracePoint(
            kind=p.kind,
            epoch=p.epoch,
            step=p.step,
            fingerprint=combine(other.items()),
            variables=other,
        )
        for i, p in enumerate(trace)
        for other in [changed[p.epoch]]
    ]


def test_a_seed_change_is_the_cause_and_the_data_are_never_called_equal() -> None:
    """Two seeds: initial weights and every epoch's data differ. The report once said
    "the computation differed (data equal)" (cause compute) while listing all epochs'
    data as different; the cause is the spec's seed, in the report and its sentences."""
    seeded = {**_spec(), "seed": [8, 0]}
    a = _record(_trace(3), _spec())
    b = _record(
        _differing_from(_trace(3), 0),
        seeded,
        data={e: f"other-{e}" for e in range(1, 4)},
        spec_hash="sha256:other-seed",
    )
    report = build_report(a, b)
    ComparisonReport.model_validate(report)
    assert report["verdict"] == "diverged" and report["first_divergence"]["kind"] == "init"
    assert report["cause"] == "seed"
    assert report["data_epochs_differing"] == [1, 2, 3]
    line = describe(report)
    assert "data equal" not in line and "computation" not in line
    assert "seeds differ" in line
    assert "different seeds ([7, 0] vs [8, 0])" in report["explanation"]
    assert "the data of epochs 1, 2, 3 differ too" in report["explanation"]
    assert "before any data was used" not in report["explanation"]

    # Weights equal at initialisation, first different after epoch 2: still the seed.
    c = _record(_differing_from(_trace(3), 2), seeded, spec_hash="sha256:other-seed")
    later = build_report(a, c)
    assert later["cause"] == "seed" and later["first_divergence"]["epoch"] == 2
    assert "data equal" not in describe(later)


def test_initial_weights_that_differ_within_one_spec_never_call_the_data_equal() -> None:
    a = _record(_trace(3), _spec())
    b = _record(_differing_from(_trace(3), 0), _spec(), data={1: "data-1", 2: "x", 3: "y"})
    report = build_report(a, b)
    assert report["cause"] == "compute" and report["data"]["equal"] is None
    assert describe(report).endswith("the initial weights differ, before any data")
    assert "the data of epochs 2, 3 differ as well" in report["explanation"]
    same_data = build_report(a, _record(_differing_from(_trace(3), 0), _spec()))
    assert "differ as well" not in same_data["explanation"]


def test_runs_of_different_specs_that_train_the_same_bits_are_identical_with_the_diff() -> None:
    report = build_report(_record(_trace(2), _spec(xla=False)), _record(_trace(2), _spec(xla=True)))
    assert report["verdict"] == "identical"
    assert report["spec_diff"] == [{"path": "dataset.xla", "a": False, "b": True}]
    assert report["explanation"].startswith("The specs differ in dataset.xla (False vs True).")


def test_runs_of_one_spec_keep_the_report_they_had() -> None:
    spec = _spec(2)
    report = build_report(_record(_trace(3), spec), _record(_trace(3, diverge_at=2), spec))
    assert report["verdict"] == "diverged" and report["spec_diff"] == []
    assert "nondeterminism within the same environment" in report["explanation"]
    # Without the specs themselves there is nothing to diff: as before, incomparable.
    bare = build_report(
        _record(_trace(2), spec, spec=None), _record(_trace(2), _spec(1), spec=None)
    )
    assert bare["verdict"] == "incomparable"
    assert bare["reason"].startswith("the runs have different specs")


def test_different_granularity_across_specs_compares_the_common_points() -> None:
    fine = _trace(2)
    steps = [
        TracePoint(kind="step", epoch=1, step=2, fingerprint="blake3:" + "1" * 64, variables={})
    ]
    b = _record(sorted([*fine, *steps], key=lambda p: p.key), _spec(2), granularity="steps:2")
    report = build_report(_record(fine, _spec(1)), b)
    assert report["verdict"] == "incomparable"
    assert report["points"] == 3 and report["spec_diff"][0]["path"] == "distribution.replicas"
    assert "agree at all 3 trace points both recorded" in report["reason"]


def test_spec_diff_lists_every_leaf_with_both_values() -> None:
    a = {"training": {"epochs": 3, "optimizer": {"name": "adam"}}, "seed": [1, 0]}
    b = {"training": {"epochs": 3, "optimizer": {"name": "sgd"}}, "seed": [2, 0], "x": True}
    assert diff_specs(a, b) == [
        {"path": "seed", "a": [1, 0], "b": [2, 0]},
        {"path": "training.optimizer.name", "a": "adam", "b": "sgd"},
        {"path": "x", "a": None, "b": True},
    ]
    assert diff_specs(a, None) == [] and diff_specs(a, dict(a)) == []


def test_step_checkpoints_upload_and_download_like_epoch_ones(tmp_path: Path) -> None:
    event = {
        "event": "checkpoint",
        "epoch": 4,
        "step": 30,
        "batch": 6,
        "path": "step-000000030.json",
    }
    assert checkpoint_uploads(tmp_path, event) == (
        None,
        tmp_path / "step-000000030.npz",
        tmp_path / "step-000000030.json",
    )
    epoch_event = {"event": "checkpoint", "epoch": 2, "step": 16, "path": "epoch-000002.json"}
    assert checkpoint_uploads(tmp_path, epoch_event)[0] == 2
    with pytest.raises(ValueError, match="not a checkpoint event"):
        checkpoint_uploads(tmp_path, {**event, "step": 31})  # the name says another step
    files = [{"name": "step-000000030.json"}, {"name": "step-000000030.npz"}]
    assert [f["name"] for f in checkpoint_downloads(files)] == [
        "step-000000030.npz",
        "step-000000030.json",
    ]
    for bad in (
        [{"name": "step-000000030.npz"}, {"name": "step-000000040.json"}],
        [{"name": "../step-000000030.npz"}, {"name": "step-000000030.json"}],
        [{"name": "step-30.npz"}, {"name": "step-30.json"}],
    ):
        with pytest.raises(ValueError):
            checkpoint_downloads(bad)


def test_the_command_line_table_says_why_a_size_is_missing() -> None:
    """Shapes that differ leave the sizes "-": the table once showed no reason."""
    from service.cli.report import report_lines

    def wider(epoch: int, paths: Sequence[str]) -> Mapping[str, np.ndarray]:
        return {p: np.ones(4, dtype=np.float32) for p in paths}

    a = _record(_trace(3), _spec(1), checkpoint_epochs=[1, 2, 3], read_checkpoint=_reader(0.0))
    b = _record(
        _trace(3, diverge_at=1), _spec(2), checkpoint_epochs=[1, 2, 3], read_checkpoint=wider
    )
    lines = report_lines(build_report(a, b))
    row = next(line for line in lines if line.lstrip().startswith(VARS[0]))
    assert "different dtype/shape: float32[3] vs float32[4]" in row, lines


def test_runs_of_different_models_are_incomparable_not_diverged() -> None:
    """An N-way compare of unrelated experiments said `diverged` for each pair."""
    from worker.compare.verdict import verdict_of

    def renamed(trace: Sequence[TracePoint]) -> list[TracePoint]:
        out = []
        for p in trace:
            variables = {f"model/conv/{k.split('/')[-1]}": v for k, v in p.variables.items()}
            variables["model/conv/extra"] = "ab" * 32
            out.append(
                TracePoint(
                    kind=p.kind,
                    epoch=p.epoch,
                    step=p.step,
                    fingerprint=combine(variables.items()),
                    variables=variables,
                )
            )
        return out

    cnn_spec = {**_spec(), "model": {"architecture": "cnn"}}
    a = _record(_trace(3), _spec())
    b = _record(renamed(_trace(3)), cnn_spec, spec_hash="sha256:cnn")
    verdict, reason = verdict_of(a, b)
    assert verdict == "incomparable"
    assert (
        reason == "they train different models (2 variables only in run, 3 only in run, 0 in both)"
    )
    report = build_report(a, b)
    assert report["verdict"] == "incomparable" and report["spec_diff"]
    assert "different models" in report["explanation"]
    # Other shapes of the same variables (a wider layer) stay a divergence.
    wider = _record(_trace(3, diverge_at=0), {**_spec(), "model": {"hidden": [24]}}, spec_hash="w")
    assert verdict_of(a, wider)[0] == "diverged"
