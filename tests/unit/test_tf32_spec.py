"""`determinism.tf32` in the spec: its hash, the compare report and the run page's hazards."""

from __future__ import annotations

from typing import Any

import pytest

from worker.compare.spec_diff import diff_specs, why_it_matters
from worker.errors import SpecError
from worker.record.provenance import diff_provenance
from worker.spec import parse_spec

BASE: dict[str, Any] = {
    "name": "matmul-precision",
    "seed": 1,
    "dataset": {"generator": "gaussian_blobs", "batch_size": 8, "train_batches": 2},
    "model": {"architecture": "mlp", "params": {"hidden": [4]}},
    "training": {"epochs": 1, "loss": {"name": "sparse_categorical_crossentropy"}},
}


def test_a_null_tf32_keeps_the_hash_specs_had_before_the_field() -> None:
    before = parse_spec(BASE)
    explicit_null = parse_spec({**BASE, "determinism": {"tf32": None}})
    assert explicit_null.spec_hash() == before.spec_hash()
    assert "tf32" not in before.canonical_json()
    off = parse_spec({**BASE, "determinism": {"tf32": False}})
    on = parse_spec({**BASE, "determinism": {"tf32": True}})
    assert len({before.spec_hash(), off.spec_hash(), on.spec_hash()}) == 3


def test_tf32_takes_only_true_false_or_null() -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec({**BASE, "determinism": {"tf32": "yes"}})
    assert raised.value.errors[0]["loc"] == "determinism.tf32"


def test_compare_says_a_tf32_difference_changes_results() -> None:
    a = parse_spec({**BASE, "determinism": {"tf32": True}}).model_dump(mode="json")
    b = parse_spec({**BASE, "determinism": {"tf32": False}}).model_dump(mode="json")
    diff = diff_specs(a, b)
    assert [d["path"] for d in diff] == ["determinism.tf32"]
    assert "10 mantissa bits" in (why_it_matters(diff) or "")
    rows = diff_provenance({"determinism": {"tf32": True}}, {"determinism": {"tf32": False}})
    assert rows[0]["field"] == "determinism.tf32"
    assert rows[0]["breaks_reproducibility"] is True
    assert "TF32" in rows[0]["why"]


def test_the_run_page_warns_of_tf32_only_when_it_was_on_with_a_gpu() -> None:
    from service.dashboard.provenance_view import hazards
    from service.persistence.models import Run

    gpu = [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "compute_capability": "8.0"}]
    warning = "TF32 on: results differ between GPU models."
    on_gpu = Run(provenance={"determinism": {"tf32": True}, "gpus": gpu})
    assert warning in hazards(on_gpu)
    off_gpu = Run(provenance={"determinism": {"tf32": False}, "gpus": gpu})
    on_cpu = Run(provenance={"determinism": {"tf32": True}, "gpus": []})
    assert warning not in hazards(off_gpu) + hazards(on_cpu)
