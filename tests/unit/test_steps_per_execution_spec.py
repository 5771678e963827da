"""`training.steps_per_execution` in the spec: in the hash only when not 1, bounded, and
`repro validate` says that N > 1 may change the bits against one step per call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import repro
from worker.errors import SpecError
from worker.spec import parse_spec


def _data(**training: Any) -> dict[str, Any]:
    return {
        "name": "looped",
        "seed": 1,
        "dataset": {"generator": "gaussian_blobs", "batch_size": 8, "train_batches": 4},
        "model": {"architecture": "mlp"},
        "training": {"epochs": 1, "loss": {"name": "sparse_categorical_crossentropy"}, **training},
    }


def test_one_step_per_execution_keeps_the_hash_every_other_value_changes_it() -> None:
    before = parse_spec(_data()).spec_hash()
    assert parse_spec(_data(steps_per_execution=1)).spec_hash() == before
    assert parse_spec(_data(steps_per_execution=1.0)).spec_hash() == before
    twenty = parse_spec(_data(steps_per_execution=20)).spec_hash()
    assert twenty != before
    assert parse_spec(_data(steps_per_execution=21)).spec_hash() != twenty


@pytest.mark.parametrize("value", [0, -1, 1_000_001, True, "20", 2.5])
def test_a_bad_steps_per_execution_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(_data(steps_per_execution=value))
    assert [e["loc"] for e in caught.value.errors] == ["training.steps_per_execution"]


def test_validate_says_steps_per_execution_changes_the_bits(tmp_path: Path) -> None:
    looped, plain = tmp_path / "looped.json", tmp_path / "plain.json"
    looped.write_text(json.dumps(_data(steps_per_execution=20)))
    plain.write_text(json.dumps(_data()))
    result = repro("validate", str(looped), "--json")
    assert result.returncode == 0, result.stderr
    (warning,) = json.loads(result.stdout)["warnings"]
    assert "training.steps_per_execution is 20" in warning
    assert "steps_per_execution 1" in warning and "bitwise identical" in warning
    plain_result = repro("validate", str(plain), "--json")
    assert json.loads(plain_result.stdout)["warnings"] == []
