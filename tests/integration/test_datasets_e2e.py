"""A pushed dataset trained on end to end: a real `repro serve`, a real worker agent, real
TensorFlow on the CPU. The worker fetches the dataset once for the run and its rerun, the
run's provenance names the dataset, and the exported `.keras` model is listed and
downloadable as an artifact of the run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.integration.service_procs import Service, running
from tests.integration.test_datasets_api import digits_like, push, sha256, spec_using


def test_a_run_on_a_pushed_dataset_records_it_and_exports_its_model(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "node") as (svc, [worker]):
        body = digits_like(n=64, seed=5)
        digest = sha256(body)
        assert push(svc.client, body).status_code == 201
        submitted = svc.submit(spec_using(digest), content_type="application/json")
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["run"]["id"]
        run = svc.wait_run(run_id)
        assert run["status"] == "succeeded", run["error"]

        # Provenance says which bytes the run trained on, and their arrays.
        recorded = json.dumps(run["provenance"])
        assert digest in recorded
        assert "[64, 8, 8, 1]" in recorded or "[64,8,8,1]" in recorded.replace(" ", "")
        assert svc.client.get(f"/api/v1/datasets/{digest}").json()["runs"] == [run_id]

        # The final model, in Keras's native format, is an artifact with a download URL.
        listed = svc.client.get(f"/api/v1/runs/{run_id}/artifacts")
        assert listed.status_code == 200, listed.text
        [model] = [a for a in listed.json() if a["kind"] == "model"]
        assert model["name"] == "model.keras"
        download = svc.client.get(model["download_url"])
        assert download.status_code == 200
        assert hashlib.sha256(download.content).hexdigest() == model["sha256"]
        assert len(download.content) == model["size"]
        assert download.content[:2] == b"PK"  # a .keras file is a zip archive
        # The run page offers it too, to a person logged in to the dashboard.
        browser = svc.dashboard()
        page = browser.get(f"/runs/{run_id}").text
        link = f"/runs/{run_id}/artifacts/{model['id']}"
        assert f'<a href="{link}" download class="model-download">' in page
        assert browser.get(link).content == download.content

        # The rerun trains on the cached copy: fetched once, verified before each job.
        rerun = svc.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert rerun.status_code == 202, rerun.text
        again = svc.wait_run(rerun.json()["id"])
        assert again["status"] == "succeeded", again["error"]
        assert again["verdict"] == "identical"
        log = worker.log.read_text()
        assert log.count(f"dataset {digest} fetched") == 1, log[-3000:]
        cached = tmp_path / "node" / "datasets" / digest.removeprefix("sha256:")
        assert cached.read_bytes() == body
