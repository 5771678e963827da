"""A misspelled spec field gets "did you mean ...?" from the server itself, so every client
shows it: a plain HTTP POST (JSON or YAML), the Python client's ApiError and `repro submit`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reprotrain import ApiError, Client
from tests.cli_runner import repro
from tests.integration.jobs import blobs_spec, write_spec
from tests.integration.service_procs import Service, running

HINT = "Extra inputs are not permitted; did you mean 'batch_size'?"


def _misspelled() -> dict[str, object]:
    spec = blobs_spec()
    spec["dataset"]["batch_sise"] = spec["dataset"].pop("batch_size")
    spec["training"]["epoch"] = spec["training"].pop("epochs")
    spec["model"]["zzz_qqq"] = 1  # close to no field: no suggestion
    return spec


def test_every_client_of_the_server_gets_the_field_a_misspelled_one_meant(
    tmp_path: Path,
) -> None:
    spec = _misspelled()
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service) as (svc, _):
        for body, content_type in (
            (json.dumps(spec), "application/json"),
            (yaml.safe_dump(spec), "application/yaml"),
        ):
            answer = svc.submit(body, content_type)
            assert answer.status_code == 422, answer.text
            errors = {e["loc"]: e for e in answer.json()["errors"]}
            assert errors["dataset.batch_sise"]["msg"] == HINT
            assert errors["dataset.batch_sise"]["suggestion"] == "dataset.batch_size"
            assert errors["training.epoch"]["msg"].endswith("did you mean 'epochs'?")
            assert errors["model.zzz_qqq"]["msg"] == "Extra inputs are not permitted"
            assert f"dataset.batch_sise: {HINT}" in answer.json()["detail"]

        with Client(svc.url, svc.admin_token) as client, pytest.raises(ApiError) as refused:
            client.submit(spec)
        assert refused.value.status_code == 422
        assert f"dataset.batch_sise: {HINT}" in str(refused.value)

        path = write_spec(spec, tmp_path, "typo.json")
        done = repro("submit", str(path), "--api", svc.url, "--token", svc.admin_token)
        assert done.returncode == 2, done.stderr
        assert "did you mean 'batch_size'?" in done.stderr
        assert "did you mean 'epochs'?" in done.stderr
        assert done.stdout == ""
        # Nothing was queued: the refused spec left no experiment behind.
        assert svc.client.get("/api/v1/experiments").json()["total"] == 0
