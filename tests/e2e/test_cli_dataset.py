"""`repro run SPEC --dataset FILE`: a local run trains on the dataset its spec names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runner import repro
from tests.integration.jobs import write_spec
from worker.data.dataset_format import file_digest

pytestmark = pytest.mark.slow


def test_run_with_a_dataset_trains_on_it_and_exports_the_model(tmp_path: Path) -> None:
    data = tmp_path / "table.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.normal(size=(120, 6)).astype(np.float32), y=np.arange(120) % 3)
    spec = write_spec(
        {
            "name": "table",
            "seed": 1,
            "dataset": {
                "generator": "arrays",
                "data": file_digest(data),
                "params": {"eval_fraction": 0.2},
                "batch_size": 16,
                "train_batches": 6,
                "eval_batches": 1,
            },
            "model": {"architecture": "mlp"},
            "training": {"epochs": 1, "loss": {"name": "sparse_categorical_crossentropy"}},
        },
        tmp_path,
    )
    model = tmp_path / "model.keras"
    done = repro(
        "run", str(spec), "--dataset", str(data), "--export-model", str(model), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["provenance"]["dataset"]["digest"] == file_digest(data)
    assert model.stat().st_size > 0
    missing = repro("run", str(spec), "--out", str(tmp_path / "r2.json"), cwd=tmp_path)
    assert missing.returncode == 2
    assert "given no file" in " ".join(missing.stderr.split())
