"""Datasets that differ only in held-out rows train the same bits, and the comparison says
why: training never read the differing row; whether evaluation read it is told too (real
TensorFlow on the CPU, jobs in fresh processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.jobs import Finished, run_job
from worker.compare.verdict import build_report, record_from_result
from worker.data.dataset_format import file_digest, open_arrays
from worker.data.job_data import build_job_data
from worker.spec import ExperimentSpec

SAMPLES = 100  # eval_fraction 0.2: 80 training rows, 20 held out
BATCH = 10


def _spec(digest: str, eval_batches: int = 1) -> dict[str, Any]:
    return {
        "name": "held-out-rows",
        "seed": 5,
        "dataset": {
            "generator": "arrays",
            "data": digest,
            "params": {"num_classes": 2, "eval_fraction": 0.2},
            "batch_size": BATCH,
            "train_batches": 8,
            "eval_batches": eval_batches,
        },
        "model": {"architecture": "mlp", "params": {"hidden": [4]}},
        "training": {"epochs": 2, "loss": {"name": "sparse_categorical_crossentropy"}},
    }


def _save(path: Path, x: np.ndarray) -> Path:
    np.savez(path, x=x, y=np.arange(SAMPLES, dtype=np.int64) % 2)
    return path


def _held_out_in_order(path: Path) -> list[int]:
    """The held-out rows in the order evaluation reads them (each row's features are its id)."""
    spec = ExperimentSpec.model_validate(_spec(file_digest(path), eval_batches=2))
    data = build_job_data(spec, (5, 0), data=open_arrays(path))
    assert data.eval is not None
    return [int(r) for b in data.eval.as_dataset().as_numpy_iterator() for r in b[0][:, 0]]


def _train(path: Path, workdir: Path) -> Finished:
    run = run_job(_spec(file_digest(path)), workdir, "--dataset-file", str(path))
    assert run.returncode == 0, run.result.error
    return run


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("heldout")
    x = np.repeat(np.arange(SAMPLES, dtype=np.float32)[:, None], 4, axis=1)
    original = _save(where / "original.npz", x)
    held_out = _held_out_in_order(original)
    assert len(held_out) == 2 * BATCH
    # eval_batches 1 reads the first 10 held-out rows; the other 10 nobody reads.
    evaluated, unread = held_out[0], held_out[BATCH]
    files = {"original": original}
    for name, row in (("evaluated", evaluated), ("unread", unread)):
        changed = x.copy()
        changed[row, 1] += 1
        files[name] = _save(where / f"{name}.npz", changed)
    return files


@pytest.fixture(scope="module")
def original_run(datasets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Finished:
    return _train(datasets["original"], tmp_path_factory.mktemp("original"))


@pytest.mark.parametrize(
    ("changed", "evaluation"), [("evaluated", "differs"), ("unread", "is equal")]
)
def test_a_changed_held_out_row_is_explained(
    changed: str,
    evaluation: str,
    datasets: dict[str, Path],
    original_run: Finished,
    tmp_path: Path,
) -> None:
    run = _train(datasets[changed], tmp_path)
    report = build_report(
        record_from_result(original_run.result, "original"), record_from_result(run.result, changed)
    )
    assert report["verdict"] == "identical"
    assert [d["path"] for d in report["spec_diff"]] == ["dataset.data"]
    assert report["data_epochs_equal"] == [1, 2] and report["data_epochs_differing"] == []
    digests = file_digest(datasets["original"]), file_digest(datasets[changed])
    assert (
        f"The datasets differ ({digests[0]} vs {digests[1]}) only in rows training never read"
        in report["explanation"]
    )
    assert f"the evaluation data {evaluation}." in report["explanation"]
    # Another dataset is never reported as harmless to the bits.
    digest_row = next(d for d in report["provenance_diff"] if d["field"] == "dataset.digest")
    assert digest_row["breaks_reproducibility"] is True
