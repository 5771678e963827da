"""The README's code-bundle walk-through, run as a user would against a real `repro serve` and
a process worker started with `--trust-code`: `repro code push examples/code` builds the
directory's wheel and prints its digest, `repro code list`/`show` find it, the example's spec
with that digest filled in trains and its rerun is identical, with the bundle's digest and
per-file manifest in provenance. Also: `Client().code.push(directory)`, and a loss a bundle
declares in `reprotrain.losses`, named by the spec, trained and rerun identical."""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.client import Client
from tests.cli_runner import repro
from tests.code_wheels import DATA_PY, MODEL_PY, make_wheel, ring_spec
from tests.integration.service_procs import Service, trusting_service
from tests.integration.test_code_bundles import pushed_digest

pytestmark = [pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "code"
PLACEHOLDER = "sha256:" + "0" * 64

# A loss a bundle declares: cross-entropy on logits times a `scale` param.
LOSS_PY = """\
from typing import Any

import keras


class ScaledCrossentropy(keras.losses.Loss):
    def __init__(self, scale: float, **kwargs: Any) -> None:
        super().__init__(name="scaled_crossentropy", **kwargs)
        self.scale = scale

    def call(self, y_true: Any, y_pred: Any) -> Any:
        ce = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        return self.scale * ce


def scaled_crossentropy(params: dict[str, Any]) -> Any:
    return ScaledCrossentropy(float(params.get("scale", 1.0)))
"""

LOSS_ENTRY_POINTS = """\
[reprotrain.generators]
test_rings = ring_bundle.data:rings

[reprotrain.architectures]
test_ring_mlp = ring_bundle.model:ring_mlp

[reprotrain.losses]
test_scaled_ce = ring_bundle.loss:scaled_crossentropy
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with trusting_service(tmp_path_factory.mktemp("code-push")) as svc:
        yield svc


def cli(service: Service, *args: str) -> str:
    done = repro(*args, "--api", service.url, "--token", service.admin_token, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def trained_and_rerun(service: Service, spec: str) -> tuple[dict[str, Any], dict[str, Any]]:
    created = service.submit(spec)
    assert created.status_code == 201, created.text
    first = service.wait_run(int(created.json()["run"]["id"]), timeout=300)
    assert first["status"] == "succeeded", first["error"]
    rerun = service.client.post(f"/api/v1/runs/{first['id']}/rerun")
    assert rerun.status_code == 202, rerun.text
    second = service.wait_run(int(rerun.json()["id"]), timeout=300)
    assert second["status"] == "succeeded", second["error"]
    return first, second


def test_push_the_example_directory_and_rerun_its_spec_identical(service: Service) -> None:
    digest = cli(service, "code", "push", str(EXAMPLE)).strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    listed = json.loads(cli(service, "code", "list", "--json"))["items"]
    [item] = [b for b in listed if b["digest"] == digest]
    assert {e["name"] for e in item["entry_points"]} == {"rings", "ring_mlp"}
    shown = cli(service, "code", "show", digest)
    assert digest in shown and "ring_layers/model.py" in shown and "ring_layers/data.py" in shown

    # As the README tells users: the placeholder digest replaced by the pushed one. The
    # example is already tiny (2 epochs of 8 batches of 32, 8 hidden units): trained as is.
    example = (EXAMPLE / "spec.yaml").read_text()
    assert PLACEHOLDER in example
    first, second = trained_and_rerun(service, example.replace(PLACEHOLDER, digest))
    assert second["verdict"] == "identical"
    assert second["final_fingerprint"] == first["final_fingerprint"]

    code = first["provenance"]["code"]
    assert code["digest"] == digest
    model_py = (EXAMPLE / "src" / "ring_layers" / "model.py").read_bytes()
    assert code["files"]["ring_layers/model.py"] == hashlib.sha256(model_py).hexdigest()
    record = service.client.get(f"/api/v1/code/{digest}").json()
    assert code["files"] == {f["path"]: f["sha256"] for f in record["files"]}
    assert record["runs"] == sorted([first["id"], second["id"]], reverse=True)


def test_client_pushes_a_directory(service: Service) -> None:
    with Client(service.url, service.admin_token) as client:
        bundle = client.code.push(EXAMPLE, name="rings-from-the-client")
        assert bundle.digest.startswith("sha256:")
        # The wheel is built with a fixed timestamp: the same files give the same digest.
        assert client.code.push(EXAMPLE).digest == bundle.digest
        assert client.code.get(bundle.digest).digest == bundle.digest
    assert {e.name for e in bundle.entry_points} == {"rings", "ring_mlp"}
    assert "ring_layers/model.py" in {f.path for f in bundle.files}


def loss_bundle() -> bytes:
    return make_wheel(
        {
            "ring_bundle/__init__.py": b"",
            "ring_bundle/data.py": DATA_PY.encode(),
            "ring_bundle/model.py": MODEL_PY.encode(),
            "ring_bundle/loss.py": LOSS_PY.encode(),
        },
        entry_points=LOSS_ENTRY_POINTS,
    )


def with_loss(spec: str, loss: str) -> str:
    builtin = "loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}"
    assert builtin in spec
    return spec.replace(builtin, f"loss: {loss}")


def test_a_loss_the_bundle_declares_trains_and_reruns_identical(service: Service) -> None:
    body = loss_bundle()
    digest = pushed_digest(service.client, body, name="rings-loss")
    spec = with_loss(ring_spec(digest), "{name: test_scaled_ce, params: {scale: 2.0}}")
    first, second = trained_and_rerun(service, spec)
    assert second["verdict"] == "identical"
    assert first["provenance"]["code"]["digest"] == digest
    loss_py = zipfile.ZipFile(io.BytesIO(body)).read("ring_bundle/loss.py")
    assert first["provenance"]["code"]["files"]["ring_bundle/loss.py"] == (
        hashlib.sha256(loss_py).hexdigest()
    )

    # A loss no built-in, plugin or the run's bundle declares: 422 naming the field.
    unknown = service.submit(with_loss(ring_spec(digest), "{name: no_such_loss}"))
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["errors"][0]["loc"] == "training.loss.name"
    assert "no_such_loss" in unknown.text and "test_scaled_ce" in unknown.text
