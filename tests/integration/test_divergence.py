"""Divergence diagnosis with planted nondeterminism: in the data, in the compute, per step."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from service.cli.local import verdict
from tests.cli_runner import repro
from tests.integration.jobs import blobs_spec, job_env, run_job
from tests.integration.service_procs import Service, running

pytestmark = pytest.mark.slow

PERTURB = "REPRO_TEST_PERTURB"
TARGET = "model/hidden/kernel"


@pytest.fixture
def plugin_paths(tmp_path: Path) -> list[Path]:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    return [make_plugin_site(tmp_path / "site"), PLUGIN_DIR]


def perturbed_spec(epochs: int = 3) -> dict[str, Any]:
    """4 steps an epoch; the perturbed_mlp plugin nudges TARGET when REPRO_TEST_PERTURB says."""
    spec = blobs_spec(model={"architecture": "perturbed_mlp", "params": {}})
    spec["dataset"]["train_batches"] = 4
    spec["training"]["epochs"] = epochs
    return spec


def test_stateful_rng_in_the_data_is_diagnosed_as_the_input_pipeline(
    tmp_path: Path, plugin_paths: list[Path]
) -> None:
    spec = blobs_spec(
        dataset={**blobs_spec()["dataset"], "generator": "entropy_noise", "params": {}},
        determinism={"op_determinism": False},  # op determinism refuses stateful RNG ops
    )
    runs = [run_job(spec, tmp_path / name, extra_paths=plugin_paths) for name in "ab"]
    assert [r.returncode for r in runs] == [0, 0], runs[0].result.error

    report = verdict(runs[0].result, runs[1].result)

    assert report["verdict"] == "diverged"
    assert report["first_divergence"]["kind"] == "epoch"
    assert report["first_divergence"]["epoch"] == 1
    assert report["last_identical"]["kind"] == "init"
    assert report["cause"] == "data"
    assert report["data"]["equal"] is False and report["data"]["epoch"] == 1
    assert report["data_epochs_differing"] == [1, 2, 3, 4]  # every epoch: 4 in blobs_spec
    assert "input pipeline diverged in epoch 1" in report["explanation"]
    assert "entropy_noise" in report["explanation"]  # the job's stateful-RNG warning


def test_one_ulp_after_an_epoch_is_found_at_that_epoch_in_that_variable(
    tmp_path: Path, plugin_paths: list[Path]
) -> None:
    spec = perturbed_spec()
    clean = run_job(
        spec, tmp_path / "clean", "--checkpoint-dir", str(tmp_path / "ck-clean"),
        extra_paths=plugin_paths,
    )  # fmt: skip
    env = {PERTURB: f"{TARGET}@epoch:2", "REPRO_NUMERIC_ENV_VARS": PERTURB}
    nudged = run_job(
        spec, tmp_path / "nudged", "--checkpoint-dir", str(tmp_path / "ck-nudged"),
        extra_paths=plugin_paths, env=env,
    )  # fmt: skip
    assert clean.returncode == nudged.returncode == 0, nudged.result.error

    report = verdict(clean.result, nudged.result)

    assert report["verdict"] == "diverged"
    assert (report["first_divergence"]["kind"], report["first_divergence"]["epoch"]) == ("epoch", 2)
    assert report["last_identical"]["epoch"] == 1
    assert report["variables"] == [TARGET]
    assert report["layers"] == {"model/hidden": [TARGET]}
    [size] = report["differences"]
    assert size["variable"] == TARGET and size["max_ulp"] == 1
    assert size["elements_differing"] == 1 and 0 < size["max_abs_diff"] < 1e-6
    assert report["differences_measured_at"] == {
        "epoch": 2,
        "label": "end of epoch 2",
        "at_divergence": True,
    }
    assert report["cause"] == "compute" and report["data"]["equal"] is True
    assert report["data_epochs_differing"] == []
    # Exactly the field that differs between the two runs' environments, flagged first.
    assert [(d["field"], d["a"], d["b"]) for d in report["provenance_diff"]] == [
        (f"environment.{PERTURB}", None, f"{TARGET}@epoch:2")
    ]
    assert report["provenance_diff"][0]["breaks_reproducibility"] is True
    assert "1 ULP" in report["explanation"] and "computation diverged" in report["explanation"]


def test_different_thread_settings_show_exactly_those_fields(
    tmp_path: Path, plugin_paths: list[Path]
) -> None:
    spec = perturbed_spec(epochs=1)
    a = run_job(spec, tmp_path / "a", extra_paths=plugin_paths, env={"TF_NUM_INTEROP_THREADS": "1"})
    b = run_job(spec, tmp_path / "b", extra_paths=plugin_paths, env={"TF_NUM_INTEROP_THREADS": "2"})
    assert a.returncode == b.returncode == 0, a.result.error
    report = verdict(a.result, b.result)
    assert [(d["field"], d["a"], d["b"]) for d in report["provenance_diff"]] == [
        ("environment.TF_NUM_INTEROP_THREADS", "1", "2")
    ]
    assert report["verdict"] == "identical"  # this model's CPU kernels do not care
    assert "TF_NUM_INTEROP_THREADS" in report["explanation"]


def _wait(svc: Service, path: str, done: Any, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc: dict[str, Any] = svc.client.get(path).json()
        if done(doc):
            return doc
        time.sleep(0.5)
    raise TimeoutError(f"{path}: {doc}\n{svc.log.read_text()[-3000:]}")


def test_service_diagnoses_refines_to_the_step_and_audits(
    tmp_path: Path, plugin_paths: list[Path], database_url: str | None
) -> None:
    paths = {"PYTHONPATH": job_env(plugin_paths)["PYTHONPATH"]}
    # A short lease: a stopped worker stops counting as live (for spreading audit copies) soon.
    leases = {"REPRO_LEASE_SECONDS": "6", "REPRO_HEARTBEAT_SECONDS": "2"}
    # The plugin reads PERTURB: the operator lists it, so provenance records its value.
    leases["REPRO_NUMERIC_ENV_VARS"] = PERTURB
    service = Service(
        tmp_path / "data", database_url=database_url, extra=("--no-demo",), env={**paths, **leases}
    )
    flaky_env = {**paths, PERTURB: f"{TARGET}@step:6"}  # step 6 is in epoch 2 (4 steps each)
    with running(service) as (svc, workers):
        steady = svc.worker(tmp_path / "steady", env=paths)
        workers.append(steady)
        first = svc.submit(json.dumps(perturbed_spec()), "application/json").json()["run"]["id"]
        assert svc.wait_run(first)["status"] == "succeeded"
        steady.stop()
        workers.append(svc.worker(tmp_path / "flaky", env=flaky_env))
        rerun = svc.client.post(f"/api/v1/runs/{first}/rerun").json()["id"]
        second = svc.wait_run(rerun)
        assert second["status"] == "succeeded", second["error"]

        # Stored with the rerun, against the family's reference.
        stored = second["verdict_report"]
        assert second["verdict"] == "diverged" and second["reference_run_id"] == first
        assert stored["first_divergence"]["label"] == "end of epoch 2"
        assert stored["cause"] == "compute"
        assert TARGET in stored["variables"]
        target = next(d for d in stored["differences"] if d["variable"] == TARGET)
        assert target["max_ulp"] >= 1 and target["max_abs_diff"] > 0
        fields = [d["field"] for d in stored["provenance_diff"]]
        assert fields[0] == f"environment.{PERTURB}"  # flagged first
        assert "worker.name" in fields and "worker.hostname" not in fields

        # The same report on demand, and from the CLI.
        asked = svc.client.get("/api/v1/compare", params={"a": first, "b": rerun}).json()
        assert {k: v for k, v in asked.items() if k not in ("a", "b")} == {
            k: v for k, v in stored.items() if k not in ("a", "b")
        }
        api = ("--api", svc.url, "--token", svc.admin_token)
        shown = repro("compare", str(first), str(rerun), *api, env=paths)
        assert shown.returncode == 1, shown.stderr
        assert shown.stdout.startswith("diverged at end of epoch 2")
        assert "max ULP" in shown.stdout and f"environment.{PERTURB}" in shown.stdout

        # Refinement: each side re-traced step by step on its own worker from epoch 1.
        workers.append(svc.worker(tmp_path / "steady", env=paths))
        done = repro("compare", str(first), str(rerun), "--refine", "--json", *api, env=paths)
        assert done.returncode == 1, done.stderr
        refined = json.loads(done.stdout)["refinement"]
        assert refined["status"] == "finished", refined
        assert (refined["epoch"], refined["from_epoch"]) == (2, 1)
        assert refined == svc.client.get(f"/api/v1/compare/refine/{refined['id']}").json()
        report = refined["report"]
        assert report["verdict"] == "diverged"
        assert report["first_divergence"]["kind"] == "step"
        assert (report["first_divergence"]["epoch"], report["first_divergence"]["step"]) == (2, 6)
        assert report["last_identical"]["step"] == 5
        assert report["variables"] == [TARGET]
        assert "after step 6" in report["explanation"]
        retraces = svc.client.get("/api/v1/runs", params={"kind": "refine"}).json()["items"]
        assert sorted(r["id"] for r in retraces) == sorted(r["id"] for r in refined["runs"])
        assert all(r["kind"] == "refine" for r in retraces)

        # An audit of 3 copies of a deterministic spec, spread over both live workers.
        spec_file = tmp_path / "blobs.json"
        spec_file.write_text(json.dumps(blobs_spec()))
        done = repro("submit", str(spec_file), "--copies", "3", "--wait", "--json", *api, env=paths)
        assert done.returncode == 0, done.stderr
        audit_id = json.loads(done.stdout)["id"]
        audit = svc.client.get(f"/api/v1/repro-audits/{audit_id}").json()
        assert audit == json.loads(done.stdout)
        assert audit["agree"] is True, audit
        assert len(audit["copies"]) == 3 and audit["distinct_workers"] == 2
        assert [c["verdict"] for c in audit["copies"]] == [None, "identical", "identical"]
        assert audit["summary"].startswith("all 3 copies identical on 2 workers")
        shown = repro("audit-copies", str(audit_id), *api, env=paths)
        assert shown.returncode == 0 and "all 3 copies identical" in shown.stdout
