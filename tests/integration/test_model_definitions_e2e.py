"""A pushed Keras model definition trained end to end: a real `repro serve`, a real worker
agent, real TensorFlow on the CPU. ResNet-20 (examples/models) on a pushed CIFAR-shaped
dataset trains, records the definition's digest and layers in its provenance, and its
rerun is `identical`; the integer-token text classifier trains too."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.integration.service_procs import Service, running

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"
sys.path.insert(0, str(EXAMPLES))
import make_datasets  # type: ignore[import-not-found]  # noqa: E402

sys.path.remove(str(EXAMPLES))


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _push(svc: Service, route: str, body: bytes, name: str) -> str:
    answer = svc.client.post(
        f"/api/v1/{route}",
        params={"name": name},
        content=body,
        headers={"Content-Type": "application/octet-stream", "X-Content-SHA256": sha256(body)},
    )
    assert answer.status_code == 201, answer.text
    digest: str = answer.json()["digest"]
    return digest


def _npz(x: np.ndarray, y: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, x=x, y=y)
    return buf.getvalue()


def _example_spec(name: str, definition: str, data: str, **dataset: Any) -> str:
    """The example spec, made small: few batches, one epoch."""
    spec = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    spec["model"]["definition"] = definition
    spec["dataset"].update(data=data, **dataset)
    spec["training"]["epochs"] = 1
    return json.dumps(spec)


def test_resnet20_trains_records_its_definition_and_reruns_identical(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "node") as (svc, _):
        resnet = (EXAMPLES / "resnet20.json").read_bytes()
        definition = _push(svc, "models", resnet, "resnet20")
        data = _push(svc, "datasets", _npz(*make_datasets.cifar_like(64)), "cifar-like")
        spec = _example_spec(
            "resnet20", definition, data, batch_size=8, train_batches=2, eval_batches=1
        )
        submitted = svc.submit(spec, content_type="application/json")
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["run"]["id"]
        run = svc.wait_run(run_id, timeout=600)
        assert run["status"] == "succeeded", run["error"]
        recorded = run["provenance"]["model_definition"]
        assert recorded["digest"] == definition
        assert recorded["parameter_count"] == 274_042
        assert recorded["layers"]["resnet20/logits"]["class_name"] == "Dense"
        assert svc.client.get(f"/api/v1/models/{definition}").json()["runs"] == [run_id]

        rerun = svc.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert rerun.status_code == 202, rerun.text
        again = svc.wait_run(rerun.json()["id"], timeout=600)
        assert again["status"] == "succeeded", again["error"]
        assert again["final_fingerprint"] == run["final_fingerprint"]
        assert again["verdict"] == "identical"


def test_the_text_classifier_trains_on_integer_tokens_and_reruns_identical(
    tmp_path: Path,
) -> None:
    # The definition's int32 input keeps the ids integers: no dataset.params.x_dtype needed.
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "node") as (svc, _):
        text = (EXAMPLES / "text_classifier.json").read_bytes()
        definition = _push(svc, "models", text, "text-classifier")
        data = _push(svc, "datasets", _npz(*make_datasets.tokens(64)), "tokens")
        spec = json.loads(
            _example_spec(
                "text_classifier", definition, data, batch_size=8, train_batches=2, eval_batches=1
            )
        )
        spec["dataset"]["params"].pop("x_dtype", None)
        submitted = svc.submit(json.dumps(spec), content_type="application/json")
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["run"]["id"]
        run = svc.wait_run(run_id, timeout=600)
        assert run["status"] == "succeeded", run["error"]
        assert run["provenance"]["model_definition"]["digest"] == definition

        rerun = svc.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert rerun.status_code == 202, rerun.text
        again = svc.wait_run(rerun.json()["id"], timeout=600)
        assert again["status"] == "succeeded", again["error"]
        assert again["verdict"] == "identical"

        # Ids past the Embedding's input_dim (1000) are refused at submit, not in the job.
        x, y = make_datasets.tokens(64)
        x[0, 4] = 5098
        wider = _push(svc, "datasets", _npz(x, y), "tokens-5k")
        spec["dataset"]["data"] = wider
        spec["dataset"]["params"].pop("vocab_size", None)  # the ids' range is the data's
        refused = svc.submit(json.dumps(spec), content_type="application/json")
        assert refused.status_code == 422, refused.text
        assert "the Embedding 'embedding' looks up ids 0..999" in refused.json()["detail"]
        assert "token ids run to 5098" in refused.json()["detail"]
