"""Rows held out by the `arrays` generator and never evaluated draw a warning, not an error:
the spec stays valid with the hash it always had; the README's example evaluates them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.cli_runner import repro
from worker.spec import ExperimentSpec, held_out_warnings

README = Path(__file__).resolve().parents[2] / "README.md"


def _spec(dataset: dict[str, Any]) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "name": "digits",
            "seed": 1,
            "dataset": dataset,
            "model": {"architecture": "small_cnn"},
            "training": {"epochs": 1, "loss": {"name": "sparse_categorical_crossentropy"}},
        }
    )


def _readme_arrays_example() -> dict[str, Any]:
    match = re.search(r"^dataset: \{generator: arrays.*$", README.read_text(), re.MULTILINE)
    assert match is not None
    dataset: dict[str, Any] = yaml.safe_load(match.group(0))["dataset"]
    # The README elides the digest; any well-formed one stands in for it.
    return {**dataset, "data": "sha256:" + "0" * 64}


def test_the_readme_example_evaluates_its_held_out_rows() -> None:
    dataset = _readme_arrays_example()
    assert dataset["params"]["eval_fraction"] > 0 and dataset["eval_batches"] > 0
    assert held_out_warnings(_spec(dataset)) == []


def test_held_out_rows_never_evaluated_warn_and_the_spec_stays_valid() -> None:
    dataset = {k: v for k, v in _readme_arrays_example().items() if k != "eval_batches"}
    spec = _spec(dataset)
    (warning,) = held_out_warnings(spec)
    assert "dataset.params.eval_fraction is 0.2" in warning
    assert "dataset.eval_batches is 0" in warning and "never evaluated" in warning
    # Writing eval_batches: 0 out is the same spec, with the same hash.
    assert _spec({**dataset, "eval_batches": 0}).spec_hash() == spec.spec_hash()


def test_nothing_held_out_or_another_generator_gives_no_warning() -> None:
    base = _readme_arrays_example()
    no_split = {**base, "eval_batches": 0, "params": {"num_classes": 10}}
    assert held_out_warnings(_spec(no_split)) == []
    blobs = {"generator": "gaussian_blobs", "batch_size": 8, "train_batches": 2}
    assert held_out_warnings(_spec({**blobs, "params": {"eval_fraction": 0.2}})) == []


def test_repro_validate_prints_the_warning(tmp_path: Path) -> None:
    dataset = {k: v for k, v in _readme_arrays_example().items() if k != "eval_batches"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(dataset).model_dump(mode="json")))
    done = repro("validate", str(path), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "never evaluated" in done.stdout + done.stderr
