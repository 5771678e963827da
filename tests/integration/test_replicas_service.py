"""Replicas and step checkpoints through the service: real API, real agents, real TensorFlow.

Workers advertise the devices they can give a job (GPUs, or logical CPU devices a CPU-only
worker allows); a run asking for more replicas than any live worker offers waits and says
why. A worker SIGKILLed mid-epoch loses only the steps since its last step checkpoint: the
run resumes elsewhere from it and ends bit for bit as an uninterrupted run. Runs of one
and of two replicas compare with their spec diff, equal data and the sizes of the weight
differences.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import repro
from tests.integration.jobs import blobs_spec, job_env, run_job
from tests.integration.service_procs import Service, running

pytestmark = pytest.mark.slow

TWO_DEVICES = {"REPRO_WORKER_CPU_REPLICAS": "2"}


def _tiny(replicas: int, name: str = "tiny-replicas") -> dict[str, Any]:
    spec = blobs_spec(name=name, distribution={"replicas": replicas})
    spec["dataset"].update(train_batches=3, eval_batches=0)
    spec["training"]["epochs"] = 2
    return spec


def _wait_for(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_run_needing_more_devices_than_any_live_worker_waits_and_says_why(
    tmp_path: Path, database_url: str | None
) -> None:
    service = Service(
        tmp_path / "data",
        database_url=database_url,
        env={"REPRO_MAX_REPLICAS": "8"},
        extra=("--no-demo",),
    )
    with running(service) as (svc, workers):
        workers += [svc.worker(tmp_path / f"two-{i}", env=TWO_DEVICES) for i in range(2)]

        def registered() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = svc.client.get("/api/v1/workers").json()
            return found if len(found) == 2 else []

        listed = _wait_for("both workers to register", registered)
        assert all(w["devices"] == 2 for w in listed)
        assert all(w["gpus"] == 0 and w["cpu_devices"] == 2 for w in listed)

        four = svc.submit(json.dumps(_tiny(4, "needs-four")), "application/json")
        assert four.status_code == 201, four.text
        four_id = four.json()["run"]["id"]
        assert four.json()["run"]["replicas"] == 4
        two = svc.submit(json.dumps(_tiny(2, "needs-two")), "application/json")
        assert two.status_code == 201, two.text

        # The older run asks for 4 devices: the claims pass it over and take the newer one.
        done = svc.wait_run(two.json()["run"]["id"])
        assert done["status"] == "succeeded", done["error"]
        assert done["replicas"] == 2 and done["worker_id"] in {w["id"] for w in listed}
        assert done["result_summary"]["determinism"]["distribution"]["replicas"] == 2

        waiting = svc.client.get(f"/api/v1/runs/{four_id}").json()
        assert waiting["status"] == "queued" and waiting["worker_id"] is None
        assert waiting["attempt"] == 0
        assert (
            "needs 4 replicas; the most devices any live worker offers is 2"
            in (waiting["waiting_reason"])
        )
        assert svc.client.get(f"/api/v1/runs/{done['id']}").json()["waiting_reason"] is None
        # `repro status` and `--wait` say why a run waits (once only `--json` did).
        api = ("--api", svc.url, "--token", svc.admin_token)
        shown = repro("status", str(four_id), *api)
        assert "waiting" in shown.stdout and "needs 4 replicas" in shown.stdout, shown.stdout
        again = tmp_path / "needs-four-again.json"
        again.write_text(json.dumps(_tiny(4, "needs-four-again")))
        waited = repro("submit", str(again), "--wait", "--timeout", "10", *api)
        assert waited.returncode == 1 and "gave up waiting" in waited.stderr
        assert "queued: needs 4 replicas" in waited.stderr, waited.stderr
        again_id = int(waited.stdout.split("run ")[1].split()[0])
        assert svc.client.post(f"/api/v1/runs/{again_id}/cancel").status_code == 200

        # Past the operator's maximum (REPRO_MAX_REPLICAS) or the spec's: refused at submit.
        for replicas, needle in ((16, "exceeds this server's limit of 8"), (65, "64")):
            refused = svc.submit(json.dumps(_tiny(replicas)), "application/json")
            assert refused.status_code == 422, refused.text
            assert refused.json()["errors"][0]["loc"].endswith("distribution.replicas")
            assert needle in refused.text
        assert svc.client.post(f"/api/v1/runs/{four_id}/cancel").status_code == 200


def _paced(plugins: list[Path]) -> tuple[dict[str, Any], dict[str, str]]:
    # 0.1 s a step (paced_mlp sleeps; values are untouched): an epoch of 24 steps lasts over
    # two seconds however fast the machine, so the test sees step checkpoints mid-epoch.
    spec = blobs_spec(
        name="paced-steps",
        dataset={**blobs_spec()["dataset"], "batch_size": 64, "train_batches": 24},
        model={"architecture": "paced_mlp", "params": {"step_seconds": 0.1}},
    )
    spec["training"].update(epochs=3, checkpoint_every_steps=4, fingerprint_every_steps=8)
    return spec, {"PYTHONPATH": job_env(plugins)["PYTHONPATH"]}


def _trace(points: list[dict[str, Any]]) -> list[tuple[str, int, int, str]]:
    return [(p["kind"], p["epoch"], p["step"], p["fingerprint"]) for p in points]


def test_worker_killed_mid_epoch_resumes_from_its_step_checkpoint_on_another(
    tmp_path: Path,
) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    plugins = [make_plugin_site(tmp_path / "site"), PLUGIN_DIR]
    spec, paths = _paced(plugins)
    env = {"REPRO_LEASE_SECONDS": "3", "REPRO_HEARTBEAT_SECONDS": "1", **paths}
    service = Service(tmp_path / "data", env=env, extra=("--no-demo",))
    with running(service) as (svc, workers):
        run_id = svc.submit(json.dumps(spec), "application/json").json()["run"]["id"]
        doomed = svc.worker(tmp_path / "doomed", env=paths)
        workers.append(doomed)  # stopped on the way out whatever happens

        def mid_second_epoch() -> bool:
            run = svc.client.get(f"/api/v1/runs/{run_id}").json()
            assert run["status"] in ("queued", "running"), run["error"]
            return run["checkpoint_step"] in (28, 32, 36)  # epoch 2 holds steps 25..48

        _wait_for("a step checkpoint in the middle of epoch 2", mid_second_epoch, timeout=240)
        doomed.kill()  # SIGKILL: no goodbye, the job process dies with it
        killed = svc.client.get(f"/api/v1/runs/{run_id}").json()
        resume_step = killed["checkpoint_step"]
        assert killed["status"] == "running" and killed["attempt"] == 1
        assert resume_step % 24 != 0, "the newest checkpoint must be mid-epoch"
        assert killed["checkpoint_epoch"] == 1  # an older epoch checkpoint is also there
        workers.append(svc.worker(tmp_path / "survivor", env=paths))
        done = svc.wait_run(run_id)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempt"] == 2
    assert done["resumed_from_step"] == resume_step
    assert done["result_summary"]["resumed_from_step"] == resume_step
    assert done["result_summary"]["resumed_from_epoch"] is None  # not an epoch checkpoint
    assert done["checkpoint_step"] == 72  # its end; the step checkpoints are gone

    reference = run_job(spec, tmp_path / "reference", extra_paths=plugins)
    assert reference.result.status == "succeeded", reference.result.error
    assert _trace(done["trace"]) == _trace([p.model_dump() for p in reference.result.trace])
    assert done["final_fingerprint"] == reference.result.final_fingerprint
    assert done["data_fingerprints"] == [d.model_dump() for d in reference.result.data_fingerprints]


def test_compare_of_one_and_two_replicas_reports_the_spec_diff_data_and_sizes(
    tmp_path: Path,
) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service) as (svc, workers):
        workers.append(svc.worker(tmp_path / "two", env=TWO_DEVICES))
        ids = [
            svc.submit(json.dumps(_tiny(n, "one-or-two")), "application/json").json()["run"]["id"]
            for n in (1, 2)
        ]
        runs = [svc.wait_run(i) for i in ids]
        assert [r["status"] for r in runs] == ["succeeded", "succeeded"], [r["error"] for r in runs]
        report = svc.client.get("/api/v1/compare", params={"a": ids[0], "b": ids[1]}).json()
        # The API and its token from the environment, not from options.
        admin = {"REPRO_API_URL": svc.url, "REPRO_TOKEN": svc.admin_token}
        pair = [str(i) for i in ids]
        cli = repro("compare", *pair, "--json", env=admin, timeout=120)
        text = repro("compare", *pair, env=admin, timeout=120)

    assert report["spec_diff"] == [{"path": "distribution.replicas", "a": 1, "b": 2}]
    # Batch b of epoch e holds the same rows whatever the replica count.
    assert report["data_epochs_equal"] == [1, 2] and report["data_epochs_differing"] == []
    assert report["points"] == 3  # initialisation and both epoch ends
    # The replicas' gradients are summed in another order than one device's: the weights
    # move apart, and the report says by how much.
    assert report["verdict"] == "diverged", report["explanation"]
    assert report["cause"] == "compute" and report["data"]["equal"] is True
    measured = [d for d in report["differences"] if d["max_abs_diff"] is not None]
    assert measured and all(d["max_abs_diff"] > 0 for d in measured)
    assert all(d["elements_differing"] >= 1 for d in measured)
    assert "distribution.replicas (1 vs 2)" in report["explanation"]

    assert cli.returncode == 1, cli.stderr  # not identical
    assert json.loads(cli.stdout)["spec_diff"] == report["spec_diff"]
    assert "spec differences:" in text.stdout and "distribution.replicas" in text.stdout
    assert "max |Δ|" in text.stdout
