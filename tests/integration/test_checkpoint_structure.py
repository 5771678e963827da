"""At `complete` the server checks that the final checkpoint holds the run's variables.

A worker that uploads a self-consistent checkpoint (its reported fingerprint is the
checkpoint's) of arrays training never made used to pass. Now the variable paths, dtypes
and shapes are checked: for a built-in model (on a built-in generator or a stored dataset)
and for a stored Keras model definition against the layout the spec determines; for others
(plugins, code bundles) against the run's first trace point and its family's reference.
Workers here speak the protocol over HTTP to a real `repro serve` process, on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.integration.jobs import job_env
from tests.integration.service_procs import Service, running
from tests.integration.test_compare_runs_family import perturbable_spec
from tests.integration.test_server_verification import SEED001, Arrays, npz_of, run_of, state
from tests.integration.test_server_verification import point as trace_point
from worker.models import registry
from worker.models.definition_layout import definition_state_layout
from worker.models.keras_definition import read_definition
from worker.spec import parse_spec_text


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    svc = Service(tmp_path / "data", database_url=url, extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def mlp_state(seed: int) -> Arrays:
    """A training state of the seed-001 MLP (14 variables), as its job saves it."""
    return state(seed)


def point(kind: str, epoch: int, arrays: Arrays) -> dict[str, Any]:
    return trace_point(kind, epoch, 7 * epoch, arrays)


class Worker:
    """A registered worker that uploads the checkpoints the test gives it, self-consistently."""

    def __init__(self, svc: Service, name: str) -> None:
        self.http = svc.client_for("worker", name)
        answer = self.http.post("/api/v1/workers/register", json={"name": name, "images": []})
        assert answer.status_code == 201, answer.text
        self.id = answer.json()["id"]

    def claim(self) -> int:
        answer = self.http.post(f"/api/v1/workers/{self.id}/claim")
        assert answer.status_code == 200, answer.text
        return int(answer.json()["run"]["id"])

    def _upload(self, run_id: int, name: str, data: bytes, epoch: int) -> None:
        answer = self.http.post(
            f"/api/v1/runs/{run_id}/artifacts",
            params={"worker_id": self.id, "kind": "checkpoint", "name": name, "epoch": epoch},
            headers={"X-Content-SHA256": hashlib.sha256(data).hexdigest()},
            content=data,
        )
        assert answer.status_code == 201, answer.text

    def report(self, run_id: int, init: Arrays, epochs: list[Arrays]) -> httpx.Response:
        """Checkpoint each epoch's arrays and report a trace consistent with them."""
        trace = [point("init", 0, init)]
        for epoch, arrays in enumerate(epochs, start=1):
            npz = npz_of(arrays)
            manifest = [
                {"path": p, "dtype": a.dtype.name, "shape": list(a.shape)}
                for p, a in arrays.items()
            ]
            doc = {
                "format": 1,
                "epoch": epoch,
                "step": 7 * epoch,
                "arrays": f"epoch-{epoch:06d}.npz",
                "arrays_sha256": hashlib.sha256(npz).hexdigest(),
                "manifest": manifest,
                "meta": {},
            }
            self._upload(run_id, f"epoch-{epoch:06d}.npz", npz, epoch)
            self._upload(run_id, f"epoch-{epoch:06d}.json", json.dumps(doc).encode(), epoch)
            trace.append(point("epoch", epoch, arrays))
        result = {
            "status": "succeeded",
            "trace": trace,
            "trace_granularity": "epoch",
            "final_fingerprint": trace[-1]["fingerprint"],
        }
        return self.http.post(
            f"/api/v1/runs/{run_id}/complete", json={"worker_id": self.id, "result": result}
        )


def submit(svc: Service, spec: str, key: str, content_type: str = "application/yaml") -> int:
    created = svc.submit(spec, content_type, **{"Idempotency-Key": key})
    assert created.status_code == 201, created.text
    return int(created.json()["run"]["id"])


def test_a_forged_checkpoint_of_one_made_up_array_fails_and_is_never_a_reference(
    service: Service,
) -> None:
    worker = Worker(service, "forger")
    run_id = submit(service, SEED001, "forged")
    assert worker.claim() == run_id
    forged = {"model/made_up": np.array([1.0, 2.0, 3.0], dtype=np.float32)}
    answer = worker.report(run_id, mlp_state(0), [mlp_state(1), forged])
    assert answer.status_code == 200, answer.text
    run = run_of(service, run_id)
    assert run["status"] == "failed" and not run["is_reference"]
    assert run["final_fingerprint"] is None
    error = run["error"]
    assert error["type"] == "CheckpointStructureMismatch", error
    assert "unexpected model/made_up (float32 [3])" in error["message"]
    assert "missing model/dense_0/kernel" in error["message"]
    assert "the layout its spec determines" in error["message"]
    assert error["variables"][:2] == ["model/made_up", "model/dense_0/kernel"]
    assert run["reported_by"]["fingerprint"]["outcome"] == "structure"
    # The reported fingerprint was the checkpoint's own: only its structure gave it away.
    assert error["computed_fingerprint"] == error["reported_fingerprint"]

    # Its honest rerun is the family's reference; the forged run is nobody's.
    rerun_id = service.client.post(f"/api/v1/runs/{run_id}/rerun").json()["id"]
    assert worker.claim() == rerun_id
    done = worker.report(rerun_id, mlp_state(0), [mlp_state(1), mlp_state(2)])
    assert done.json()["status"] == "succeeded", done.text
    assert run_of(service, rerun_id)["is_reference"]
    listed = service.client.get("/api/v1/runs", params={"verdict": "reference"}).json()
    assert [r["id"] for r in listed["items"]] == [rerun_id]


def test_a_wrong_shape_or_dtype_names_the_variable(service: Service) -> None:
    worker = Worker(service, "reshaper")
    for n, change in enumerate(("shape", "dtype")):
        run_id = submit(service, SEED001, f"changed-{change}")
        assert worker.claim() == run_id
        final = mlp_state(2)
        kernel = final["model/output/kernel"]
        final["model/output/kernel"] = kernel.T.copy() if n == 0 else kernel.astype(np.float64)
        worker.report(run_id, mlp_state(0), [final])
        error = run_of(service, run_id)["error"]
        assert error["type"] == "CheckpointStructureMismatch"
        expected = (
            "model/output/kernel: shape [2, 8], expected [8, 2]"
            if n == 0
            else "model/output/kernel: dtype float64, expected float32"
        )
        assert expected in error["message"] and error["variables"] == ["model/output/kernel"]


def test_swapped_arrays_of_the_right_structure_pass_complete(service: Service) -> None:
    worker = Worker(service, "swapper")
    run_id = submit(service, SEED001, "swapped")
    assert worker.claim() == run_id
    final = mlp_state(2)
    a, b = "model/dense_0/kernel", "optimizer/adam/dense_0_kernel_momentum"
    assert final[a].shape == final[b].shape
    final[a], final[b] = final[b], final[a]
    answer = worker.report(run_id, mlp_state(0), [mlp_state(1), final])
    assert answer.status_code == 200, answer.text
    run = run_of(service, run_id)
    assert run["status"] == "succeeded" and run["is_reference"], run["error"]
    assert run["reported_by"]["fingerprint"]["outcome"] == "verified"


def push_dataset(client: httpx.Client) -> str:
    """A small stored dataset: its sample shapes are not in the spec."""
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(buffer, x=rng.standard_normal((20, 4)).astype(np.float32), y=np.arange(20) % 2)
    body = buffer.getvalue()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    answer = client.post(
        "/api/v1/datasets",
        params={"name": "structure-check"},
        content=body,
        headers={"Content-Type": "application/octet-stream", "X-Content-SHA256": digest},
    )
    assert answer.status_code == 201, answer.text
    return digest


def arrays_spec(digest: str) -> str:
    spec = json.loads(json.dumps(parse_spec_text(SEED001).model_dump(mode="json")))
    spec["dataset"] = {
        "generator": "arrays",
        "data": digest,
        "params": {"num_classes": 2},
        "batch_size": 4,
        "train_batches": 2,
    }
    return json.dumps(spec)


def test_a_forged_first_run_on_a_stored_dataset_fails_and_is_never_a_reference(
    service: Service,
) -> None:
    # The first run of its family: no reference yet, and a first trace point of its own.
    worker = Worker(service, "stored-data")
    spec = arrays_spec(push_dataset(service.client))
    forged_id = submit(service, spec, "forged-first", "application/json")
    assert worker.claim() == forged_id
    one = {"model/made_up": np.array([1.0, 2.0], dtype=np.float32)}
    worker.report(forged_id, one, [one, one])
    forged = run_of(service, forged_id)
    assert forged["status"] == "failed" and not forged["is_reference"]
    error = forged["error"]
    assert error["type"] == "CheckpointStructureMismatch", error
    assert "unexpected model/made_up (float32 [2])" in error["message"]
    assert "missing model/dense_0/kernel" in error["message"]
    assert "the layout its spec determines" in error["message"]

    # The MLP's state on the dataset's 4 features and 2 classes is what it must hold.
    honest_id = service.client.post(f"/api/v1/runs/{forged_id}/rerun").json()["id"]
    assert worker.claim() == honest_id
    done = worker.report(honest_id, mlp_state(0), [mlp_state(1), mlp_state(2)])
    assert done.json()["status"] == "succeeded", done.text
    assert run_of(service, honest_id)["is_reference"]


def small_definition() -> bytes:
    """A 58-parameter Keras definition: Dense(8) then Dense(2) on 4 features."""
    import keras

    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    hidden = keras.layers.Dropout(0.1)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2, name="logits")(hidden), name="small")
    assert model.count_params() == 58
    text: str = model.to_json()
    return text.encode()


def definition_spec(client: httpx.Client, definition: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(definition).hexdigest()
    answer = client.post(
        "/api/v1/models",
        params={"name": "small"},
        content=definition,
        headers={"Content-Type": "application/octet-stream", "X-Content-SHA256": digest},
    )
    assert answer.status_code == 201, answer.text
    spec = json.loads(json.dumps(parse_spec_text(SEED001).model_dump(mode="json")))
    spec["model"] = {"architecture": "keras", "definition": digest, "params": {}}
    return json.dumps(spec)


def definition_state(definition: bytes, seed: int) -> Arrays:
    """A training state holding what the definition's job holds, as a worker would save it."""
    spec = parse_spec_text(SEED001)
    layout = definition_state_layout(
        read_definition(definition),
        optimizer=registry.OPTIMIZERS[spec.training.optimizer.name],
        optimizer_params=spec.training.optimizer.params,
    )
    rng = np.random.default_rng(seed)
    return {v.path: rng.standard_normal(v.shape).astype(v.dtype) for v in layout}


def test_a_forged_first_run_of_a_model_definition_fails_and_is_never_a_reference(
    service: Service,
) -> None:
    definition = small_definition()
    worker = Worker(service, "definitions")
    forged_id = submit(
        service, definition_spec(service.client, definition), "forged", "application/json"
    )
    assert worker.claim() == forged_id
    one = {"model/made_up": np.arange(58, dtype=np.float32)}
    answer = worker.report(forged_id, one, [one, one])
    assert answer.status_code == 200, answer.text
    forged = run_of(service, forged_id)
    assert forged["status"] == "failed" and not forged["is_reference"]
    assert forged["final_fingerprint"] is None
    error = forged["error"]
    assert error["type"] == "CheckpointStructureMismatch", error
    assert "unexpected model/made_up (float32 [58])" in error["message"]
    assert "missing model/hidden/kernel" in error["message"]
    assert "the layout its model definition determines" in error["message"]
    assert forged["reported_by"]["fingerprint"]["outcome"] == "structure"

    # A wrong shape in an otherwise right state is named too.
    reshaped_id = service.client.post(f"/api/v1/runs/{forged_id}/rerun").json()["id"]
    assert worker.claim() == reshaped_id
    final = definition_state(definition, 2)
    final["model/logits/kernel"] = np.zeros((8, 3), dtype=np.float32)
    worker.report(reshaped_id, definition_state(definition, 0), [final])
    error = run_of(service, reshaped_id)["error"]
    assert error["type"] == "CheckpointStructureMismatch", error
    assert "model/logits/kernel: shape [8, 3], expected [8, 2]" in error["message"]

    # What the definition's job holds (with its dropout's seed state) verifies.
    honest_id = service.client.post(f"/api/v1/runs/{forged_id}/rerun").json()["id"]
    assert worker.claim() == honest_id
    states = [definition_state(definition, seed) for seed in range(3)]
    assert "model/seed_generator/seed_generator_state" in states[0]
    done = worker.report(honest_id, states[0], states[1:])
    assert done.json()["status"] == "succeeded", done.text
    assert run_of(service, honest_id)["is_reference"]


def test_plugin_models_are_checked_against_the_first_trace_point_and_the_reference(
    tmp_path: Path,
) -> None:
    # A plugin's model is built by code the server never imports: its layout is not known
    # here, so its runs are held to their first trace point and their family's reference.
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    plugins = {
        "PYTHONPATH": job_env([make_plugin_site(tmp_path / "site"), PLUGIN_DIR])["PYTHONPATH"]
    }
    with running(Service(tmp_path / "data", extra=("--no-demo",), env=plugins)) as (svc, _):
        _held_to_the_first_point_and_the_reference(svc)


def _held_to_the_first_point_and_the_reference(service: Service) -> None:
    worker = Worker(service, "plugin-runs")
    spec = json.dumps(perturbable_spec())
    first = submit(service, spec, "reference", "application/json")
    assert worker.claim() == first
    done = worker.report(first, mlp_state(0), [mlp_state(1), mlp_state(2)])
    assert done.json()["status"] == "succeeded", done.text

    # A made-up array the first trace point does not have.
    forged_id = service.client.post(f"/api/v1/runs/{first}/rerun").json()["id"]
    assert worker.claim() == forged_id
    forged = {**mlp_state(2), "model/made_up": np.zeros(3, dtype=np.float32)}
    worker.report(forged_id, mlp_state(0), [mlp_state(1), forged])
    forged_run = run_of(service, forged_id)
    assert forged_run["status"] == "failed" and not forged_run["is_reference"]
    error = forged_run["error"]
    assert error["type"] == "CheckpointStructureMismatch"
    assert "unexpected model/made_up (float32 [3])" in error["message"]
    assert "the variables of its first trace point" in error["message"]

    # The same paths from its first point on, but a shape the reference's checkpoint has not.
    def reshaped(seed: int) -> Arrays:
        state = mlp_state(seed)
        state["model/dense_0/kernel"] = np.zeros((4, 9), dtype=np.float32)
        return state

    other_id = service.client.post(f"/api/v1/runs/{first}/rerun").json()["id"]
    assert worker.claim() == other_id
    worker.report(other_id, reshaped(0), [reshaped(1), reshaped(2)])
    error = run_of(service, other_id)["error"]
    assert error["type"] == "CheckpointStructureMismatch"
    assert "model/dense_0/kernel: shape [4, 9], expected [4, 8]" in error["message"]
    assert "the final checkpoint of its family's reference" in error["message"]
    assert run_of(service, first)["is_reference"]
