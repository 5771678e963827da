"""Keras model definitions by digest against a real `repro serve`, on SQLite and PostgreSQL:
push, list, show, download; refusals (a Lambda layer, a custom object, too many parameters,
too many bytes, a wrong digest) name the reason and store nothing; a spec naming a
definition the server does not hold is refused at submit and at rerun."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa
import yaml

from tests.cli_runner import repro
from tests.integration.service_procs import Service
from tests.unit.test_keras_definition_checker import repeat_vector_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"
RESNET = (EXAMPLES / "resnet20.json").read_bytes()
MAX_PARAMETERS = 300_000  # above ResNet-20's 274,042
MAX_BYTES = 256 * 1024
SPEC: dict[str, Any] = yaml.safe_load(
    """
name: resnet-on-images
seed: 3
dataset:
  generator: arrays
  params: {num_classes: 10, scale: 0.00392156862745098}
  batch_size: 4
  train_batches: 2
model: {architecture: keras}
training:
  epochs: 1
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
"""
)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push(
    client: httpx.Client, body: bytes, *, name: str = "resnet20", digest: str | None = None
) -> httpx.Response:
    return client.post(
        "/api/v1/models",
        params={"name": name},
        content=body,
        headers={
            "Content-Type": "application/octet-stream",
            "X-Content-SHA256": digest or sha256(body),
        },
    )


class DefinitionsService(Service):
    """A server whose database this test may also reach directly (an operator's removal)."""

    database_url = ""


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DefinitionsService]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    svc = DefinitionsService(
        tmp_path / "data",
        database_url=url,
        env={
            "REPRO_MAX_MODEL_PARAMETERS": str(MAX_PARAMETERS),
            "REPRO_MAX_MODEL_DEFINITION_BYTES": str(MAX_BYTES),
        },
        extra=("--no-demo",),
    )
    svc.database_url = url or f"sqlite:///{tmp_path / 'data' / 'reprotrain.db'}"
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def stored_files(service: Service) -> list[Path]:
    root = service.data_dir / "artifacts" / "models"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def nothing_stored(service: Service) -> bool:
    listed = service.client.get("/api/v1/models").json()
    return listed["total"] == 0 and stored_files(service) == []


def run_ids(service: Service) -> list[int]:
    return [run["id"] for run in service.client.get("/api/v1/runs").json()["items"]]


def nothing_submitted(service: Service) -> bool:
    """No experiment and no run stored."""
    experiments = service.client.get("/api/v1/experiments").json()["total"]
    return experiments == 0 and run_ids(service) == []


def images(size: int = 32, classes: int = 10) -> bytes:
    """A small CIFAR-shaped dataset: uint8 images [16, size, size, 3], labels 0..classes-1."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(16, size, size, 3), dtype=np.uint8)
    y = np.arange(16, dtype=np.int64) % classes
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


def spec_using(digest: str, service: Service, data: bytes | None = None) -> str:
    """The spec training the definition of `digest` on `data` (pushed to `service`)."""
    data = images() if data is None else data
    pushed = service.client.post(
        "/api/v1/datasets",
        params={"name": "images"},
        content=data,
        headers={"Content-Type": "application/octet-stream", "X-Content-SHA256": sha256(data)},
    )
    assert pushed.status_code in (200, 201), pushed.text
    spec = json.loads(json.dumps(SPEC))
    spec["model"]["definition"] = digest
    spec["dataset"]["data"] = sha256(data)
    return json.dumps(spec)


def _changed(change: Any, name: str = "pool") -> bytes:
    config = json.loads(RESNET)
    layer = next(la for la in config["config"]["layers"] if la["config"]["name"] == name)
    change(layer)
    return json.dumps(config).encode()


def test_push_list_show_download(service: Service) -> None:
    first = push(service.client, RESNET)
    assert first.status_code == 201, first.text
    record = first.json()
    digest = sha256(RESNET)
    assert record["digest"] == digest
    assert record["format"] == "keras_json"
    assert record["parameter_count"] == 274_042
    assert record["layer_count"] == len(record["layers"]) == 73
    assert record["layers"][-1]["path"] == "resnet20/logits"
    assert record["pushed_by"] and record["runs"] == []
    again = push(service.client, RESNET, name="another label")
    assert again.status_code == 200 and again.json()["name"] == "resnet20"
    listed = service.client.get("/api/v1/models").json()
    assert listed["total"] == 1 and listed["items"][0]["digest"] == digest
    shown = service.client.get(f"/api/v1/models/{digest.removeprefix('sha256:')}")
    assert shown.status_code == 200 and shown.json()["layers"] == record["layers"]
    content = service.client.get(record["content_url"])
    assert content.status_code == 200 and content.content == RESNET
    assert service.client.get(f"/api/v1/models/sha256:{'0' * 64}").status_code == 404


REFUSED: dict[str, tuple[bytes, int, str]] = {
    "a build_config Keras would build otherwise": (
        # Keras builds it from input_shape (7,000 x 10); shapes_dict says 64 x 10.
        _changed(
            lambda la: la.update(
                build_config={
                    "input_shape": [None, 7000],
                    "shapes_dict": {"input_shape": [None, 64]},
                }
            ),
            "logits",
        ),
        422,
        "resnet20/logits: Dense: build_config.input_shape is [None, 7000]",
    ),
    "an activation bomb": (repeat_vector_model(2**28), 422, "REPRO_MAX_ACTIVATION_ELEMENTS"),
    "lambda layer": (
        _changed(lambda la: la.update(class_name="Lambda")),
        422,
        "resnet20/pool: Lambda",
    ),
    "custom object": (
        _changed(lambda la: la.update(class_name="MyPool", registered_name="mine>MyPool")),
        422,
        "resnet20/pool",
    ),
    "foreign module": (
        _changed(lambda la: la.update(module="my_layers")),
        422,
        "'my_layers'",
    ),
    "over the parameter limit": (
        _changed(lambda la: la["config"].update(units=100_000), "logits"),
        422,
        "REPRO_MAX_MODEL_PARAMETERS",
    ),
    "not json": (b"hello" * 10, 422, "invalid JSON"),
    "too large": (b" " * (MAX_BYTES + 1), 413, str(MAX_BYTES)),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_definitions_name_the_reason_and_store_nothing(service: Service, case: str) -> None:
    body, status, reason = REFUSED[case]
    answer = push(service.client, body)
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["detail"]
    assert nothing_stored(service)


def test_a_digest_that_does_not_match_the_bytes_stores_nothing(service: Service) -> None:
    claimed = sha256(b"something else")
    answer = push(service.client, RESNET, digest=claimed)
    assert answer.status_code == 400, answer.text
    assert claimed in answer.json()["detail"] and sha256(RESNET) in answer.json()["detail"]
    assert nothing_stored(service)


def test_unknown_digests_are_refused_at_submit_and_rerun(service: DefinitionsService) -> None:
    digest = sha256(RESNET)
    refused = service.submit(spec_using(digest, service), content_type="application/json")
    assert refused.status_code == 422, refused.text
    assert digest in refused.json()["detail"]
    assert refused.json()["errors"][0]["loc"] == "model.definition"
    assert service.client.get("/api/v1/experiments").json()["total"] == 0

    assert push(service.client, RESNET).status_code == 201
    accepted = service.submit(spec_using(digest, service), content_type="application/json")
    assert accepted.status_code == 201, accepted.text
    run_id = accepted.json()["run"]["id"]
    shown = service.client.get(f"/api/v1/models/{digest}").json()
    assert shown["runs"] == [run_id] and shown["runs_total"] == 1

    # An operator removes the definition: a rerun can no longer train it.
    engine = sa.create_engine(service.database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM model_definitions"))
    engine.dispose()
    rerun = service.client.post(f"/api/v1/runs/{run_id}/rerun")
    assert rerun.status_code == 422, rerun.text
    assert digest in rerun.json()["detail"]
    assert run_ids(service) == [run_id]  # the refused rerun added no run


def test_a_definition_the_data_cannot_feed_is_refused_at_submit(service: Service) -> None:
    assert push(service.client, RESNET).status_code == 201
    spec = json.loads(spec_using(sha256(RESNET), service, images(size=16)))
    refused = service.submit(json.dumps(spec), content_type="application/json")
    assert refused.status_code == 422, refused.text
    assert "(32, 32, 3); the data gives (16, 16, 3)" in refused.json()["detail"]
    assert refused.json()["errors"][0]["loc"] == "model.definition"
    assert nothing_submitted(service)
    spec = json.loads(spec_using(sha256(RESNET), service, images(classes=4)))
    spec["dataset"]["params"]["num_classes"] = 4
    refused = service.submit(json.dumps(spec), content_type="application/json")
    assert refused.status_code == 422 and "4 classes" in refused.json()["detail"]
    assert nothing_submitted(service)


def test_the_parameter_limit_is_applied_again_at_submit(
    tmp_path: Path, database_url: str | None
) -> None:
    # Pushed under a generous limit, submitted after the operator lowered it.
    data = tmp_path / "data"
    with_room = Service(data, database_url=database_url, extra=("--no-demo",)).wait_ready()
    try:
        assert push(with_room.client, RESNET).status_code == 201
    finally:
        with_room.stop()
    strict = Service(
        data,
        database_url=database_url,
        env={"REPRO_MAX_MODEL_PARAMETERS": "1000"},
        extra=("--no-demo",),
    )
    try:
        strict.wait_ready()
        spec = spec_using(sha256(RESNET), strict)
        refused = strict.submit(spec, content_type="application/json")
        assert refused.status_code == 422, refused.text
        assert "274042 parameters" in refused.json()["detail"]
        assert "REPRO_MAX_MODEL_PARAMETERS" in refused.json()["detail"]
        assert nothing_submitted(strict)
    finally:
        strict.stop()


def _repro(service: Service, *args: str) -> subprocess.CompletedProcess[str]:
    return repro(*args, "--api", service.url, env={"REPRO_TOKEN": service.admin_token}, timeout=120)


@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
def test_repro_model_push_list_show(service: Service, tmp_path: Path) -> None:
    path = tmp_path / "resnet20.json"
    path.write_bytes(RESNET)
    pushed = _repro(service, "model", "push", str(path), "--name", "resnet")
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == sha256(RESNET)
    assert "274042 parameters" in pushed.stderr
    listed = _repro(service, "model", "list", "--json")
    assert json.loads(listed.stdout)["items"][0]["name"] == "resnet"
    shown = _repro(service, "model", "show", sha256(RESNET))
    assert shown.returncode == 0, shown.stderr
    assert "resnet20/stage3_block3_conv2" in shown.stdout and "Conv2D" in shown.stdout
    bad = tmp_path / "lambda.json"
    bad.write_bytes(REFUSED["lambda layer"][0])
    refused = _repro(service, "model", "push", str(bad))
    assert refused.returncode != 0 and "Lambda" in refused.stderr


@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
def test_the_dashboard_shows_models_and_the_layer_table_of_runs(service: Service) -> None:
    digest = sha256(RESNET)
    assert push(service.client, RESNET).status_code == 201
    accepted = service.submit(spec_using(digest, service), content_type="application/json")
    assert accepted.status_code == 201, accepted.text
    run_id, experiment_id = accepted.json()["run"]["id"], accepted.json()["experiment"]["id"]
    browser = service.dashboard()
    listed = browser.get("/models").text
    assert '<a href="/models">Models</a>' in listed
    assert f'<a href="/models/{digest}">resnet20</a>' in listed
    shown = browser.get(f"/models/{digest}").text
    assert "resnet20/stage2_block1_project" in shown and "274,042" in shown
    assert f"/runs/{run_id}" in shown
    for page in (f"/runs/{run_id}", f"/experiments/{experiment_id}"):
        text = browser.get(page).text
        assert f'<a href="/models/{digest}">resnet20</a>' in text, page
        assert "resnet20/logits" in text and "Dense" in text, page


def _keras_archive(path: Path) -> Path:
    """A tiny built model saved as a `.keras` archive, weights and all."""
    import keras

    inputs = keras.Input((8,), name="features")
    outputs = keras.layers.Dense(4, name="logits")(keras.layers.Dense(16, name="hidden")(inputs))
    keras.Model(inputs, outputs, name="tiny").save(path)
    return path


@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
def test_a_keras_archive_keeps_its_architecture_and_its_weights_are_ignored(
    service: Service, tmp_path: Path
) -> None:
    archive = _keras_archive(tmp_path / "tiny.keras")
    body = archive.read_bytes()
    with zipfile.ZipFile(archive) as members:
        assert "model.weights.h5" in members.namelist()  # it does carry weights
    pushed = push(service.client, body, name="tiny")
    assert pushed.status_code == 201, pushed.text
    record = pushed.json()
    assert record["format"] == "keras_archive"
    paths = [layer["path"] for layer in record["layers"]]
    assert paths == ["tiny/features", "tiny/hidden", "tiny/logits"]
    assert record["parameter_count"] == 8 * 16 + 16 + 16 * 4 + 4
    assert "weights in it are ignored" in record["note"]
    shown = service.client.get(f"/api/v1/models/{sha256(body)}").json()
    assert shown["layers"] == record["layers"] and shown["note"] == record["note"]

    other = tmp_path / "other.keras"
    other.write_bytes(body)
    again = _repro(service, "model", "push", str(other), "--name", "tiny-again")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == sha256(body)
    assert "weights in it are ignored" in again.stderr
    plain = tmp_path / "plain.json"
    plain.write_bytes(RESNET)
    json_push = _repro(service, "model", "push", str(plain))
    assert json_push.returncode == 0 and "ignored" not in json_push.stderr


def test_the_activation_limit_is_applied_at_submit_for_the_spec_s_batch(
    service: Service,
) -> None:
    # 2**25 values per example pass at push; 16 of them in a batch are over 2**28.
    bomb = repeat_vector_model(2**22)
    assert push(service.client, bomb, name="repeat").status_code == 201
    x = np.zeros((32, 8), dtype=np.float32)
    buf = io.BytesIO()
    np.savez(buf, x=x, y=np.arange(32, dtype=np.int64) % 2)
    spec = json.loads(spec_using(sha256(bomb), service, buf.getvalue()))
    spec["dataset"]["params"] = {"num_classes": 2}
    spec["dataset"]["batch_size"] = 16
    refused = service.submit(json.dumps(spec), content_type="application/json")
    assert refused.status_code == 422, refused.text
    assert "bomb/repeat" in refused.json()["detail"]
    assert "for a batch of 16" in refused.json()["detail"]
    assert refused.json()["errors"][0]["loc"] == "model.definition"
    assert nothing_submitted(service)
    spec["dataset"]["batch_size"] = 8  # 2**28 exactly: within the limit
    accepted = service.submit(json.dumps(spec), content_type="application/json")
    assert accepted.status_code == 201, accepted.text
