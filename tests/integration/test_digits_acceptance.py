"""A real dataset end to end: scikit-learn's handwritten digits (1,797 8x8 images, bundled
with the package, no network) saved as .npz, a small CNN with augmentation trained on it by
`python -m worker.run` in fresh processes, as a worker runs jobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

from tests.integration.jobs import Finished, run_job
from worker.compare.verdict import build_report, record_from_result
from worker.data.dataset_format import file_digest
from worker.record.fingerprint import fingerprint_state
from worker.record.variable_reads import training_state
from worker.spec import ExperimentSpec

EPOCHS = 10
# 1,797 samples, 357 held out (round(1797 * 0.1987)): 1,440 training rows are exactly
# 90 batches of 16, so each epoch shows every training row once; 22 batches of 16
# evaluate 352 of the held-out rows.
PARAMS = {"eval_fraction": 0.1987, "scale": 1 / 16, "crop_padding": 1, "noise_stddev": 0.02}


def _spec(digest: str) -> dict[str, Any]:
    return {
        "name": "digits-cnn",
        "seed": 7,
        "dataset": {
            "generator": "arrays",
            "data": digest,
            "params": PARAMS,
            "batch_size": 16,
            "train_batches": 90,
            "eval_batches": 22,
        },
        "model": {
            "architecture": "small_cnn",
            "params": {"filters": [32, 64], "dropout": 0.1, "dense": 64},
        },
        "training": {
            "epochs": EPOCHS,
            "optimizer": {"name": "adam", "params": {"learning_rate": 0.003}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "metrics": ["accuracy"],
        },
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("digits")


@pytest.fixture(scope="module")
def digits(workdir: Path) -> Path:
    data = load_digits()
    path = workdir / "digits.npz"
    np.savez(path, x=data.images.astype(np.uint8)[..., np.newaxis], y=data.target.astype(np.int64))
    return path


@pytest.fixture(scope="module")
def full_run(workdir: Path, digits: Path) -> Iterator[Finished]:
    done = run_job(
        _spec(file_digest(digits)),
        workdir / "full",
        "--dataset-file",
        str(digits),
        "--export-model",
        str(workdir / "full" / "model.keras"),
        timeout=900,
    )
    assert done.returncode == 0, done.result.error
    yield done


def test_a_small_cnn_learns_the_held_out_digits(full_run: Finished, digits: Path) -> None:
    result = full_run.result
    assert result.status == "succeeded"
    assert result.metrics[-1]["eval_accuracy"] >= 0.9
    assert result.provenance["dataset"] == {
        "digest": file_digest(digits),
        "format": "npz",
        "samples": 1797,
        "arrays": {
            "x": {"shape": [1797, 8, 8, 1], "dtype": "uint8"},
            "y": {"shape": [1797], "dtype": "int64"},
        },
    }
    assert [d.epoch for d in result.data_fingerprints] == list(range(1, EPOCHS + 1))
    # Each epoch is its own permutation of the same rows: no two epochs' data are equal.
    assert len({d.fingerprint for d in result.data_fingerprints}) == EPOCHS


def test_a_rerun_is_identical(full_run: Finished, workdir: Path, digits: Path) -> None:
    again = run_job(
        _spec(file_digest(digits)), workdir / "rerun", "--dataset-file", str(digits), timeout=900
    )
    assert again.returncode == 0, again.result.error
    assert again.result.final_fingerprint == full_run.result.final_fingerprint
    assert again.result.trace == full_run.result.trace
    assert again.result.data_fingerprints == full_run.result.data_fingerprints
    assert again.result.eval_data_fingerprint == full_run.result.eval_data_fingerprint


def test_half_the_epochs_then_resume_is_identical(
    full_run: Finished, workdir: Path, digits: Path
) -> None:
    spec, where = _spec(file_digest(digits)), workdir / "resumed"
    checkpoints = str(where / "checkpoints")
    first = run_job(
        spec,
        where,
        "--dataset-file",
        str(digits),
        "--checkpoint-dir",
        checkpoints,
        "--stop-after-epoch",
        str(EPOCHS // 2),
        timeout=900,
    )
    assert first.result.status == "interrupted", first.result.error
    second = run_job(
        spec, where, "--dataset-file", str(digits), "--checkpoint-dir", checkpoints, "--resume"
    )
    assert second.returncode == 0, second.result.error
    assert second.result.resumed_from_epoch == EPOCHS // 2
    assert second.result.final_fingerprint == full_run.result.final_fingerprint
    assert second.result.data_fingerprints == full_run.result.data_fingerprints


def test_the_exported_model_holds_the_final_weights(full_run: Finished, workdir: Path) -> None:
    # Layer and seed-generator names are numbered per process, like the job's fresh one:
    # without this, earlier tests in this process name a loaded seed generator `..._2`.
    keras.backend.clear_session()
    model = keras.saving.load_model(workdir / "full" / "model.keras")
    exported = fingerprint_state(training_state(model)).variables
    final = full_run.result.trace[-1].variables
    trained = {path: digest for path, digest in final.items() if path.startswith("model/")}
    assert set(exported) == set(trained)
    differing = {path for path in trained if exported[path] != trained[path]}
    # Weights, biases and BatchNorm statistics are the run's final ones. The `.keras` format
    # does not keep a Dropout layer's random-number state, which only training uses.
    assert differing == {p for p in trained if p.endswith("seed_generator_state")}
    assert len(trained) - len(differing) == 14


def test_one_changed_pixel_is_another_dataset_with_other_data(
    full_run: Finished, workdir: Path, digits: Path
) -> None:
    with np.load(digits) as stored:
        x, y = stored["x"].copy(), stored["y"]
    x[0, 3, 4, 0] += 1
    changed = workdir / "digits-changed.npz"
    np.savez(changed, x=x, y=y)
    assert file_digest(changed) != file_digest(digits)
    spec = _spec(file_digest(changed))
    original_hash = ExperimentSpec.model_validate(_spec(file_digest(digits))).spec_hash()
    assert ExperimentSpec.model_validate(spec).spec_hash() != original_hash
    run = run_job(spec, workdir / "changed", "--dataset-file", str(changed), "--until-epoch", "1")
    assert run.returncode == 0, run.result.error
    assert run.result.data_fingerprints[0] != full_run.result.data_fingerprints[0]
    report = build_report(
        record_from_result(full_run.result, "original"), record_from_result(run.result, "changed")
    )
    assert report["verdict"] == "diverged"
    assert [d["path"] for d in report["spec_diff"]] == ["dataset.data"]
    assert report["cause"] == "data" and report["data"]["epoch"] == 1
    assert report["data_epochs_differing"] == [1]


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ((), "given no file"),
        (("--dataset-file", "{other}"), "has digest sha256:"),
    ],
)
def test_a_job_without_the_named_dataset_is_refused(
    workdir: Path, digits: Path, args: tuple[str, ...], reason: str
) -> None:
    other = workdir / "other.npz"
    np.savez(other, x=np.zeros((4, 8, 8, 1), dtype=np.uint8), y=np.zeros(4, dtype=np.int64))
    given = [a.format(other=other) for a in args]
    done = run_job(_spec(file_digest(digits)), workdir / f"refused-{len(args)}", *given)
    assert done.returncode == 2
    assert done.result.error is not None and reason in done.result.error.message
    assert "dataset.data" in done.result.error.message
