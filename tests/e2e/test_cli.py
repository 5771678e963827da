"""The `repro` command line as a user runs it: real subprocesses, real training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import repro
from tests.integration.jobs import REPO, blobs_spec, write_spec
from worker.record.fingerprint import combine

pytestmark = pytest.mark.slow


def test_validate_reports_hash_or_field_errors(tmp_path: Path) -> None:
    ok = repro(
        "validate", str(write_spec(blobs_spec(), tmp_path, "ok.json")), "--json", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["spec_hash"].startswith("sha256:")
    bad_spec = blobs_spec(model={"architecture": "mlp", "params": {"hidden": "wide"}})
    bad = repro("validate", str(write_spec(bad_spec, tmp_path, "bad.json")), "--json", cwd=tmp_path)
    assert bad.returncode == 2
    assert json.loads(bad.stdout)["errors"][0]["loc"] == "model.params.hidden"


def test_verify_runs_example_and_rerun_and_compare_explains_a_divergence(tmp_path: Path) -> None:
    done = repro(
        "verify",
        str(REPO / "examples" / "seed001.yaml"),
        "--workdir",
        str(tmp_path),
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "identical"
    run, rerun = Path(report["run"]), Path(report["rerun"])
    assert json.loads(run.read_text())["final_fingerprint"] == report["fingerprint"]

    same = repro("compare", str(run), str(rerun), cwd=tmp_path)
    assert same.returncode == 0 and same.stdout.startswith("identical")

    # Plant a difference in one variable from epoch 2 on, as a nondeterministic kernel would.
    doc: dict[str, Any] = json.loads(rerun.read_text())
    for point in doc["trace"]:
        if point["epoch"] >= 2:
            point["variables"]["model/output/bias"] = "11" * 32
            point["fingerprint"] = combine(point["variables"].items())
    doc["final_fingerprint"] = doc["trace"][-1]["fingerprint"]
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps(doc))
    diverged = repro("compare", str(run), str(planted), "--json", cwd=tmp_path)
    assert diverged.returncode == 1
    verdict = json.loads(diverged.stdout)
    assert verdict["verdict"] == "diverged"
    assert verdict["first_divergence"]["label"] == "end of epoch 2"
    assert verdict["variables"] == ["model/output/bias"]
    assert verdict["cause"] == "compute"


def test_run_fails_clearly_on_a_bad_spec(tmp_path: Path) -> None:
    spec = write_spec("name: x\nseed: 1\n", tmp_path, "bad.yaml")
    done = repro("run", str(spec), "--out", str(tmp_path / "r.json"), cwd=tmp_path)
    assert done.returncode == 2
    assert "dataset: Field required" in done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"


def test_submit_wait_and_rerun_wait_against_a_service(tmp_path: Path) -> None:
    from tests.integration.service_procs import Service, running

    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "worker") as (svc, _):
        api = ("--api", svc.url, "--token", svc.admin_token)
        submitted = repro(
            "submit",
            str(REPO / "examples" / "seed001.yaml"),
            "--wait",
            "--json",
            *api,
            cwd=tmp_path,
        )
        assert submitted.returncode == 0, submitted.stderr
        first = json.loads(submitted.stdout)
        assert first["status"] == "succeeded" and first["verdict"] is None
        again = repro("rerun", str(first["id"]), "--wait", *api, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert f"verdict vs run {first['id']}: identical" in again.stdout
        table = repro("status", *api, cwd=tmp_path)
        assert table.returncode == 0 and "identical" in table.stdout
        ids = sorted(
            r["id"]
            for r in json.loads(repro("status", "--json", *api, cwd=tmp_path).stdout)["items"]
        )
        same = repro("compare", str(ids[0]), str(ids[1]), *api, cwd=tmp_path)
        assert same.returncode == 0 and same.stdout.startswith("identical")
        missing = repro("rerun", "9999", *api, cwd=tmp_path)
        assert missing.returncode == 2 and "404" in missing.stderr
