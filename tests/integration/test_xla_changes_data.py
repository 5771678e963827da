"""Switching `dataset.xla` changes the generated data: `repro validate` says so, and a
comparison of the two runs blames the data, not the runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.cli_runner import repro
from tests.integration.jobs import blobs_spec, run_job, write_spec
from worker.compare.verdict import build_report, describe, record_from_result
from worker.data.generators import gaussian_blobs
from worker.data.stateless_dataset import StatelessRngDataset


def _dataset(xla: bool) -> StatelessRngDataset:
    source = gaussian_blobs({"num_features": 8, "num_classes": 3}, batch_size=32)
    return StatelessRngDataset(
        source.batch_generator,
        batch_size=32,
        num_batches=6,
        base_seed=1234,
        xla_compile_generator=xla,
        epoch=1,
    )


def test_xla_makes_other_numbers_in_every_batch() -> None:
    plain, compiled = _dataset(False), _dataset(True)
    differing = 0
    for b in range(plain.num_batches):
        (x_plain, _), (x_xla, y_xla) = plain.make_batch(b), compiled.make_batch(b)
        # Same shapes and the same kind of values (labels in range), other draws.
        assert x_plain.shape == x_xla.shape and set(np.unique(y_xla.numpy())) <= {0, 1, 2}
        if not np.array_equal(x_plain.numpy(), x_xla.numpy()):
            differing += 1
            # Not rounding: the values are other samples of the distribution.
            assert float(np.max(np.abs(x_plain.numpy() - x_xla.numpy()))) > 0.1
    assert differing == plain.num_batches


def test_validate_warns_that_xla_changes_the_data(tmp_path: Path) -> None:
    spec = blobs_spec()
    spec["dataset"] = {**spec["dataset"], "xla": True}
    path = write_spec(spec, tmp_path, "xla.json")
    human = repro("validate", str(path), timeout=120)
    assert human.returncode == 0, human.stderr
    shown = " ".join(human.stderr.split())  # the terminal may wrap the warning
    assert "warning: dataset.xla is true" in shown and "every batch differs" in shown
    as_json = repro("validate", str(path), "--json", timeout=120)
    warnings = json.loads(as_json.stdout)["warnings"]
    assert len(warnings) == 1 and "stateless random ops" in warnings[0]
    plain_path = write_spec(blobs_spec(), tmp_path, "plain.json")
    plain = repro("validate", str(plain_path), "--json", timeout=120)
    assert json.loads(plain.stdout)["warnings"] == []


def test_comparing_runs_with_and_without_xla_says_the_data_differ(tmp_path: Path) -> None:
    spec = blobs_spec(training={**blobs_spec()["training"], "epochs": 1})
    xla_spec = {**spec, "dataset": {**spec["dataset"], "xla": True}}
    plain = run_job(spec, tmp_path / "plain")
    compiled = run_job(xla_spec, tmp_path / "xla")
    assert plain.returncode == 0 and compiled.returncode == 0, compiled.result.error
    assert plain.result.spec_hash != compiled.result.spec_hash
    report = build_report(
        record_from_result(plain.result, "plain"), record_from_result(compiled.result, "xla")
    )
    assert report["verdict"] == "diverged"
    assert [d["path"] for d in report["spec_diff"]] == ["dataset.xla"]
    assert report["cause"] == "data" and report["data_epochs_differing"] == [1]
    assert "input data differed" in describe(report)
