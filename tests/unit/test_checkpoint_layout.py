"""The checkpoint layout of a built-in job, known from its spec without TensorFlow, is the
one a real job saves: every variable's path, dtype and shape, in order.

The slow tests build each built-in architecture with real TensorFlow and Keras, in a fresh
process as a worker does, for several parameter and optimizer variants, and compare the
training state the job checkpoints; one runs a real job and reads its checkpoint.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import REPO, blobs_spec, job_env, run_job
from worker.models import model_size as ms
from worker.models import registry
from worker.spec import parse_spec

TOKENS = {"generator": "token_sequences", "params": {"vocab_size": 20, "seq_len": 6}}
IMAGES = {"generator": "pattern_images", "params": {"image_size": 8, "channels": 2}}
PIXELS = {"generator": "pattern_images", "params": {"image_size": 4, "channels": 1}}
REGRESSION = {"generator": "regression", "params": {"num_features": 5, "targets": 3}}


def _spec(
    dataset: dict[str, Any] | None,
    architecture: str,
    params: dict[str, Any],
    optimizer: str = "adam",
    optimizer_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec = blobs_spec(model={"architecture": architecture, "params": params})
    if dataset is not None:
        spec["dataset"] = {**dataset, "batch_size": 4, "train_batches": 1, "eval_batches": 0}
    loss = "mse" if dataset is REGRESSION else "sparse_categorical_crossentropy"
    spec["training"] = {
        "epochs": 1,
        "optimizer": {"name": optimizer, "params": optimizer_params or {}},
        "loss": {"name": loss, "params": {}},
        "metrics": [],
    }
    return spec


VARIANTS: list[dict[str, Any]] = [
    _spec(None, "mlp", {"hidden": [32, 16], "dropout": 0.3, "batch_norm": True}),
    _spec(None, "mlp", {"hidden": []}, "sgd"),
    _spec(None, "mlp", {"hidden": [7, 5, 3], "dropout": 0.1}, "sgd", {"momentum": 0.9}),
    _spec(IMAGES, "mlp", {"hidden": [4], "batch_norm": True}, "rmsprop", {"centered": True}),
    _spec(TOKENS, "mlp", {"hidden": [6]}, "rmsprop", {"momentum": 0.5}),
    _spec(REGRESSION, "mlp", {"hidden": [9]}, "adagrad"),
    _spec(IMAGES, "small_cnn", {}, "adamax"),
    _spec(IMAGES, "small_cnn", {"filters": [4], "dense": 0, "dropout": 0}, "nadam"),
    _spec(PIXELS, "small_cnn", {"filters": [3, 2, 5], "kernel_size": 5}, "lion"),
    _spec(TOKENS, "tiny_transformer", {"embed_dim": 8, "num_blocks": 2}, "adamw"),
    _spec(TOKENS, "tiny_transformer", {"embed_dim": 12, "num_heads": 4, "dropout": 0}),
    _spec(TOKENS, "gru", {}, "adam", {"amsgrad": True, "name": "my.opt-1"}),
    _spec(TOKENS, "gru", {"embed_dim": 3, "units": 5, "dropout": 0.2}, "nadam"),
    _spec(
        None,
        "mlp",
        {"hidden": [4], "batch_norm": True},
        "adam",
        {"use_ema": True, "gradient_accumulation_steps": 2, "weight_decay": 0.1},
    ),
]

# Builds each spec's Job (model, optimizer, training state) as the job process does, and
# prints the (path, dtype, shape) of every variable its checkpoints hold.
_BUILD = """
import json, sys
from worker.record.variable_reads import read_state
from worker.spec import parse_spec
from worker.training.job import Job
from worker.training.seeds import resolve_seed
layouts = []
for doc in json.load(sys.stdin):
    spec = parse_spec(doc)
    job = Job(spec, resolve_seed(spec.seed))
    values = read_state(job.state)
    layouts.append([[p, a.dtype.name, list(a.shape)] for (p, _), a in zip(job.state, values)])
print(json.dumps(layouts))
"""


def layout_of(spec: dict[str, Any]) -> list[list[Any]]:
    """The TensorFlow-free layout of a spec, in the JSON form the build script prints."""
    parsed = parse_spec(spec)
    info = registry.sample_info(parsed)
    assert info is not None
    layout = ms.training_state_layout(
        parsed.model.architecture,
        parsed.model.params,
        info,
        optimizer=registry.OPTIMIZERS[parsed.training.optimizer.name],
        optimizer_params=parsed.training.optimizer.params,
    )
    return [[v.path, v.dtype, list(v.shape)] for v in layout]


@pytest.mark.parametrize("spec", VARIANTS, ids=lambda s: s["model"]["architecture"])
def test_the_model_part_of_a_layout_counts_the_parameters_keras_counts(
    spec: dict[str, Any],
) -> None:
    parsed = parse_spec(spec)
    info = registry.sample_info(parsed)
    assert info is not None
    variables = ms.MODEL_VARIABLES[parsed.model.architecture](parsed.model.params, info)
    weights = [v for v in variables if not v.path.endswith("seed_generator_state")]
    count = registry.parameter_count(parsed)
    assert sum(math.prod(v.shape) for v in weights) == count


@pytest.mark.slow
def test_the_layout_from_the_spec_is_the_training_state_tensorflow_builds() -> None:
    built = subprocess.run(
        [sys.executable, "-c", _BUILD],
        input=json.dumps(VARIANTS),
        env=job_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    layouts = json.loads(built.stdout.splitlines()[-1])
    for spec, real in zip(VARIANTS, layouts, strict=True):
        assert layout_of(spec) == real, spec["model"]


@pytest.mark.slow
def test_a_real_jobs_final_checkpoint_holds_the_layout_from_its_spec(tmp_path: Path) -> None:
    spec = VARIANTS[0]
    checkpoints = tmp_path / "checkpoints"
    done = run_job(spec, tmp_path, "--checkpoint-dir", str(checkpoints))
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((checkpoints / "epoch-000001.json").read_text())["manifest"]
    assert [[m["path"], m["dtype"], m["shape"]] for m in manifest] == layout_of(spec)
    assert list(done.result.trace[-1].variables) == [m["path"] for m in manifest]
