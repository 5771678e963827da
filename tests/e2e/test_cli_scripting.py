"""The `repro` command line against a real server and worker, as scripts and people use it:
results on stdout, diagnostics on stderr, the API's reasons, and a live `submit --wait`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runner import repro
from tests.integration.jobs import blobs_spec, write_spec

pytestmark = pytest.mark.slow


def test_results_on_stdout_and_submit_wait_shows_epochs_and_metrics(tmp_path: Path) -> None:
    from tests.integration.service_procs import Service, running

    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "worker") as (svc, _):
        api = ("--api", svc.url)  # the token in the environment: on the command line it warns
        token = {"REPRO_TOKEN": svc.admin_token}
        # Epochs long enough (a few seconds) for the worker's reports to land in each.
        tiny = blobs_spec()
        tiny["dataset"]["train_batches"] = 3000
        tiny["training"]["epochs"] = 3
        spec = write_spec(tiny, tmp_path)
        waited = repro("submit", str(spec), "--wait", *api, cwd=tmp_path, env=token)
        assert waited.returncode == 0, waited.stderr
        # Into a pipe the progress is one line per finished epoch, on stderr.
        for epoch in (1, 2, 3):
            assert f"epoch {epoch}/3 done" in waited.stderr
        assert "0/?" not in waited.stderr
        last = waited.stdout.strip().splitlines()[-1]
        assert last.startswith("epoch 3 ") and "loss " in last and "accuracy " in last

        status = repro("status", *api, cwd=tmp_path, env=token)
        assert status.returncode == 0, status.stderr
        assert "succeeded" in status.stdout and "succeeded" not in status.stderr
        listing = repro("status", "--json", *api, cwd=tmp_path, env=token)
        run = json.loads(listing.stdout)["items"][0]
        assert run["final_fingerprint"] in status.stdout  # whole, not cut

        data = tmp_path / "table.npz"
        np.savez(data, x=np.zeros((40, 3), np.float32), y=np.arange(40) % 2)
        digest = repro("dataset", "push", str(data), *api, cwd=tmp_path, env=token).stdout.strip()
        listed = repro("dataset", "list", *api, cwd=tmp_path, env={"COLUMNS": "80", **token})
        assert listed.returncode == 0, listed.stderr
        assert digest in listed.stdout and "table.npz" not in listed.stderr

        refused = repro("dataset", "show", digest[:19], *api, cwd=tmp_path, env=token)
        assert refused.returncode == 2
        first, *reasons = refused.stderr.strip().splitlines()
        assert first.startswith("error 422:")
        assert any("digest" in line for line in reasons), refused.stderr
