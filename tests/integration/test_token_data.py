"""Integer token data on the `arrays` generator, and specs whose data cannot feed their model
refused at submit with the reason: real TensorFlow, a real `repro serve` on SQLite and
PostgreSQL, a real worker agent, and `repro validate` giving the server's answer."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.cli_runner import repro
from tests.integration.service_procs import Service, running
from tests.integration.test_datasets_api import digits_like, push, sha256
from worker.data.dataset_format import open_arrays
from worker.data.job_data import build_job_data
from worker.spec import ExperimentSpec

VOCAB = 20  # token ids in the pushed datasets run over 0..VOCAB-1
# A tiny transformer classifying token sequences of a stored dataset: a quarter held out.
TOKENS_SPEC: dict[str, Any] = yaml.safe_load(
    """
name: stored-tokens
seed: 5
dataset:
  generator: arrays
  params: {eval_fraction: 0.25}
  batch_size: 8
  train_batches: 4
  eval_batches: 1
model:
  architecture: tiny_transformer
  params: {embed_dim: 8, num_heads: 2, ff_dim: 8, num_blocks: 1, dropout: 0.0}
training:
  epochs: 2
  optimizer: {name: adam, params: {learning_rate: 0.01}}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
  metrics: [accuracy]
"""
)


def tokens_npz(n: int = 64, seq_len: int = 8, seed: int = 0) -> bytes:
    """Token sequences stored as int64 ids; the label says whether low ids are the majority."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCAB, size=(n, seq_len)).astype(np.int64)
    y = ((x < VOCAB // 2).sum(axis=1) > seq_len // 2).astype(np.int64)
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


def tokens_spec(digest: str, **changes: Any) -> dict[str, Any]:
    """The token spec on the dataset of `digest`; `changes` maps "a.b" paths to new values."""
    spec = copy.deepcopy(TOKENS_SPEC)
    spec["dataset"]["data"] = digest
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = spec
        for key in parents:
            node = node[key]
        node[last] = value
    return spec


# --- the generator in the job ---------------------------------------------------------------


def test_integer_x_stays_token_ids_for_a_token_model_and_becomes_float_for_others(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.npz"
    path.write_bytes(tokens_npz())
    data = open_arrays(path)
    highest = int(np.asarray(data["x"]).max())

    def batch_x(spec: dict[str, Any]) -> tuple[Any, int | None]:
        job = build_job_data(ExperimentSpec.model_validate(spec), (5, 0), data=data)
        x, _ = job.train.for_epoch(0).make_batch(0)
        return x, job.source.vocab_size

    x, vocab = batch_x(tokens_spec("sha256:" + "0" * 64))
    assert x.dtype.name == "int32" and x.shape == (8, 8)
    assert vocab == highest + 1
    _, vocab = batch_x(tokens_spec("sha256:" + "0" * 64, **{"dataset.params.vocab_size": 50}))
    assert vocab == 50
    x, _ = batch_x(tokens_spec("sha256:" + "0" * 64, **{"model": {"architecture": "gru"}}))
    assert x.dtype.name == "int32"
    # A model that does not take token ids gets float32, as integer data always did...
    mlp = tokens_spec("sha256:" + "0" * 64, **{"model": {"architecture": "mlp"}})
    x, vocab = batch_x(mlp)
    assert x.dtype.name == "float32" and vocab is None
    # ...unless a parameter says the ids stay integers (a user's own model).
    mlp["dataset"]["params"]["x_dtype"] = "int32"
    x, vocab = batch_x(mlp)
    assert x.dtype.name == "int32" and vocab == highest + 1


def test_a_token_spec_without_new_params_keeps_its_hash() -> None:
    # The new `arrays` params are optional: a spec that does not set them hashes as before.
    spec = ExperimentSpec.model_validate(tokens_spec("sha256:" + "1" * 64))
    assert "x_dtype" not in spec.canonical_json() and "vocab_size" not in spec.canonical_json()


# --- refusals at submit ------------------------------------------------------------------------

# (what is wrong, changes to the token spec, dataset to push, field, words of the reason)
MISFITS: list[tuple[str, dict[str, Any], str, str, str]] = [
    (
        "float images for a token model",
        {},
        "digits",
        "dataset.params.x",
        "takes integer token ids; 'x' holds float32",
    ),
    (
        "token ids outside the vocabulary",
        {"dataset.params.vocab_size": 10},
        "tokens",
        "dataset.params.vocab_size",
        "outside the vocabulary 0..9",
    ),
    (
        "more evaluation batches than held-out rows",
        {"dataset.eval_batches": 3},
        "tokens",
        "dataset.eval_batches",
        "3 evaluation batches of 8 need 24 held-out samples; the data has 16",
    ),
    (
        "a batch larger than the data",
        {"dataset.batch_size": 64, "dataset.train_batches": 1, "dataset.eval_batches": 0},
        "tokens",
        "dataset.train_batches",
        "needs 64 training samples; the data has 48",
    ),
    (
        "token sequences for an image model",
        {"model": {"architecture": "small_cnn"}},
        "tokens",
        "model.architecture",
        "small_cnn needs images [H, W, C], got samples (8,)",
    ),
    (
        "integer ids asked of float data",
        {"dataset.params.x_dtype": "int32", "model": {"architecture": "mlp"}},
        "digits",
        "dataset.params.x_dtype",
        "x_dtype int32 keeps integer token ids, but 'x' holds float32",
    ),
    (
        "labels outside the classes",
        {"dataset.params.num_classes": 5, "model": {"architecture": "mlp"}},
        "digits",
        "dataset.params.num_classes",
        "labels run from 0 to 9; classes must be 0..4",
    ),
]


def _datasets() -> dict[str, bytes]:
    return {"tokens": tokens_npz(), "digits": digits_like(n=64, seed=1)}


def test_specs_whose_data_does_not_fit_their_model_get_422_at_submit_and_store_nothing(
    database_url: str | None, tmp_path: Path
) -> None:
    service = Service(tmp_path / "data", database_url=database_url, extra=("--no-demo",))
    try:
        service.wait_ready()
        bodies = _datasets()
        for body in bodies.values():
            assert push(service.client, body).status_code == 201
        for what, changes, dataset, loc, reason in MISFITS:
            spec = tokens_spec(sha256(bodies[dataset]), **changes)
            refused = service.submit(json.dumps(spec), content_type="application/json")
            assert refused.status_code == 422, (what, refused.text)
            assert reason in refused.json()["detail"], (what, refused.text)
            assert refused.json()["errors"][0]["loc"] == loc, (what, refused.text)
        # A generator whose samples the architecture cannot take, known from its params.
        blobs = copy.deepcopy(TOKENS_SPEC)
        blobs["dataset"] = {"generator": "gaussian_blobs", "batch_size": 8, "train_batches": 4}
        refused = service.submit(json.dumps(blobs), content_type="application/json")
        assert refused.status_code == 422, refused.text
        assert "tiny_transformer needs token sequences" in refused.json()["detail"]
        assert service.client.get("/api/v1/experiments").json()["total"] == 0
        assert service.client.get("/api/v1/runs").json()["items"] == []
        # The spec that fits is accepted.
        accepted = service.submit(
            json.dumps(tokens_spec(sha256(bodies["tokens"]))), content_type="application/json"
        )
        assert accepted.status_code == 201, accepted.text
    finally:
        service.stop()


def test_repro_validate_with_the_dataset_file_gives_the_servers_answer(tmp_path: Path) -> None:
    files = {}
    for name, body in _datasets().items():
        files[name] = tmp_path / f"{name}.npz"
        files[name].write_bytes(body)
    cases = [MISFITS[1], MISFITS[2], MISFITS[4]]
    for what, changes, dataset, loc, reason in cases:
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(tokens_spec(sha256(b""), **changes)))
        out = repro("validate", str(spec_path), "--dataset", str(files[dataset]), "--json")
        assert out.returncode == 2, (what, out.stdout, out.stderr)
        answer = json.loads(out.stdout)
        assert answer["valid"] is False and reason in answer["error"], (what, answer)
        assert answer["errors"][0]["loc"] == loc
    spec_path.write_text(json.dumps(tokens_spec(sha256(b""))))
    out = repro("validate", str(spec_path), "--dataset", str(files["tokens"]))
    assert out.returncode == 0, out.stderr


# --- training on pushed token data --------------------------------------------------------------


@pytest.mark.slow
def test_token_models_train_on_a_pushed_token_dataset_and_rerun_identical(
    tmp_path: Path,
) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "node") as (svc, _):
        body = tokens_npz(seed=3)
        assert push(svc.client, body).status_code == 201
        gru = {"architecture": "gru", "params": {"embed_dim": 8, "units": 8}}
        run_ids = []
        for changes in ({}, {"model": gru, "training.epochs": 1}):
            spec = tokens_spec(sha256(body), **changes)
            submitted = svc.submit(json.dumps(spec), content_type="application/json")
            assert submitted.status_code == 201, submitted.text
            run_ids.append(submitted.json()["run"]["id"])
        for run_id in run_ids:
            run = svc.wait_run(run_id)
            assert run["status"] == "succeeded", run["error"]
            rerun = svc.client.post(f"/api/v1/runs/{run_id}/rerun")
            assert rerun.status_code == 202, rerun.text
            again = svc.wait_run(rerun.json()["id"])
            assert again["status"] == "succeeded", again["error"]
            assert again["verdict"] == "identical"
