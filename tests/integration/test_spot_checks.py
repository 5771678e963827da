"""Spot checks against a real server and workers training a tiny model: segments replayed
from kept checkpoints on another worker, bit for bit; a worker that nudged one weight by one
ULP in one epoch is caught exactly when the sample includes that segment; the retention
policy keeps the checkpoints it says, and the store holds no other file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from service.verification.spot_checks import catch_chance, pick_segments
from tests.cli_runner import repro
from tests.integration.jobs import job_env
from tests.integration.service_procs import Service, running
from tests.integration.test_compare_runs_family import PERTURB, TARGET, perturbable_spec

pytestmark = pytest.mark.slow

EPOCHS = 4  # four segments: 0->1, 1->2, 2->3, 3->4
NUDGED = 3  # the flaky worker nudges TARGET after epoch 3: segment 2 (2->3) shows it


def spec(epochs: int = EPOCHS) -> dict[str, Any]:
    found = perturbable_spec()
    found["name"] = "spot-checked"
    found["training"]["epochs"] = epochs
    return found


def poll(svc: Service, path: str, done: Callable[[Any], bool], timeout: float, what: str) -> Any:
    """GET `path` until `done` holds for its answer; TimeoutError naming `what` and the last
    answer when it never does."""
    deadline = time.monotonic() + timeout
    while True:
        found = svc.client.get(path).json()
        if done(found):
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {found} {svc.log.read_text()[-3000:]}")
        time.sleep(0.2)


def wait_check(svc: Service, check_id: int, timeout: float = 300) -> dict[str, Any]:
    ended = poll(
        svc,
        f"/api/v1/spot-checks/{check_id}",
        lambda c: c["status"] != "pending",
        timeout,
        f"spot check {check_id} still pending",
    )
    return cast(dict[str, Any], ended)


def policy_check(svc: Service, run_id: int) -> dict[str, Any]:
    """The spot check the policy queued for a succeeded run: it is queued just after the
    run's result is committed, so a client may see the run succeeded a moment before it."""
    path = f"/api/v1/runs/{run_id}/spot-checks"
    [check] = poll(svc, path, bool, 30, f"run {run_id} got no spot check")
    return cast(dict[str, Any], check)


def seed_where(including: bool) -> int:
    """A seed whose 2 of 4 segments include (or leave out) the nudged segment."""
    return next(s for s in range(1000) if (NUDGED - 1 in pick_segments(EPOCHS, 2, s)) == including)


def test_a_nudged_epoch_is_caught_when_sampled_and_only_then(tmp_path: Path) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    plugins = {
        "PYTHONPATH": job_env([make_plugin_site(tmp_path / "site"), PLUGIN_DIR])["PYTHONPATH"]
    }
    with running(Service(tmp_path / "data", extra=("--no-demo",), env=plugins)) as (svc, _):
        flaky = svc.worker(tmp_path / "flaky", env={**plugins, PERTURB: f"{TARGET}@epoch:{NUDGED}"})
        try:
            created = svc.submit(json.dumps(spec()), "application/json")
            run_id = created.json()["run"]["id"]
            assert svc.wait_run(run_id)["status"] == "succeeded"
            # The flaky worker stays up and idle: replays still go to the other worker.
            clean = svc.worker(tmp_path / "clean", env=plugins)
            try:
                caught = spot_check(svc, run_id, seed_where(including=True))
                passed = spot_check(svc, run_id, seed_where(including=False))
            finally:
                clean.stop()
        finally:
            flaky.stop()

    assert caught["status"] == "failed", caught["report"]
    report = caught["report"]
    failure = report["first_failure"]
    assert failure["segment"]["index"] == NUDGED - 1
    assert failure["segment"]["from_epoch"] == NUDGED - 1
    assert failure["segment"]["to_epoch"] == NUDGED
    assert failure["report"]["verdict"] == "diverged"
    assert failure["report"]["variables"] == [TARGET]
    assert failure["report"]["first_divergence"]["epoch"] == NUDGED
    assert failure["report"]["cause"] == "compute"  # the same data: the arithmetic differed
    ulps = failure["report"]["differences"][0]["max_ulp"]
    assert ulps == 1, failure["report"]["differences"]

    assert passed["status"] == "verified", passed["report"]
    for found in (caught, passed):
        rows = found["report"]["segments"]
        assert [r["index"] for r in rows] == pick_segments(EPOCHS, 2, int(found["seed"]))
        assert all(r["worker"] == "clean" and not r["same_worker"] for r in rows)
        assert found["report"]["catch_chance"] == {
            "0.1": round(1 - 0.9**2, 4),
            "0.5": round(1 - 0.5**2, 4),
        }
        assert found["report"]["catch_chance"]["0.1"] == round(catch_chance(2, 0.1), 4)
        assert found["report"]["cost"]["share"] > 0


def spot_check(svc: Service, run_id: int, seed: int, segments: int = 2) -> dict[str, Any]:
    asked = svc.client.post(
        f"/api/v1/runs/{run_id}/spot-checks", json={"segments": segments, "seed": seed}
    )
    assert asked.status_code == 202, asked.text
    assert asked.json()["seed"] == str(seed)
    return wait_check(svc, asked.json()["id"])


def stored_files(data_dir: Path) -> set[str]:
    return {p.name for p in (data_dir / "artifacts").rglob("*") if p.is_file()}


@pytest.mark.parametrize("policy", ["every:2", "final"])
def test_retention_keeps_what_it_says_and_the_cli_verifies(
    tmp_path: Path, database_url: str | None, policy: str
) -> None:
    env = {"REPRO_KEEP_CHECKPOINTS": policy}
    found = spec(epochs=5)
    found["model"]["architecture"] = "mlp"
    found["model"]["params"] = {"hidden": [8]}
    service = Service(tmp_path / "data", database_url=database_url, extra=("--no-demo",), env=env)
    with running(service, tmp_path / "w1", tmp_path / "w2") as (svc, _):
        run_id = svc.submit(json.dumps(found), "application/json").json()["run"]["id"]
        assert svc.wait_run(run_id)["status"] == "succeeded"
        kept = [2, 4, 5] if policy == "every:2" else [5]
        wanted = sorted(f"epoch-{e:06d}.{x}" for e in kept for x in ("json", "npz"))
        # The policy cuts the checkpoints just after the result is committed.
        listed = poll(
            svc,
            f"/api/v1/runs/{run_id}/artifacts",
            lambda arts: sorted(a["name"] for a in arts if a["kind"] == "checkpoint") == wanted,
            30,
            f"run {run_id} did not keep just {wanted}",
        )
        # Nothing stored that no artifact names: dropped checkpoints left no file behind.
        assert stored_files(svc.data_dir) == {a["sha256"] for a in listed}

        env_cli = {"REPRO_API_URL": svc.url, "REPRO_TOKEN": svc.admin_token}
        done = repro("spot-check", str(run_id), "--segments", "2", "--wait", env=env_cli)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "verified" in done.stdout
        checks = svc.client.get(f"/api/v1/runs/{run_id}/spot-checks").json()
        segments = checks[0]["segments"]
        # Segments run between kept checkpoints: 0->2, 2->4, 4->5 for every:2; 0->5 for final.
        points = [0, *kept]
        assert all(
            (s["from_epoch"], s["to_epoch"]) == (points[s["index"]], points[s["index"] + 1])
            for s in segments
        )
        listed_runs = svc.client.get("/api/v1/runs", params={"spot_check": "verified"}).json()
        assert [r["id"] for r in listed_runs["items"]] == [run_id]
        metrics = svc.client.get("/metrics").text
        assert 'reprotrain_spot_checks_total{outcome="verified"} 1.0' in metrics


def test_swapped_arrays_pass_complete_and_every_run_is_checked_by_policy(tmp_path: Path) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    plugins = {
        "PYTHONPATH": job_env([make_plugin_site(tmp_path / "site"), PLUGIN_DIR])["PYTHONPATH"]
    }
    found = spec(epochs=3)
    found["model"]["architecture"] = "twin_mlp"
    # Every succeeded training is spot-checked on all its three segments.
    env = {**plugins, "REPRO_SPOT_CHECK_SEGMENTS": "3"}
    with running(Service(tmp_path / "data", extra=("--no-demo",), env=env)) as (svc, _):
        dishonest = svc.worker(
            tmp_path / "dishonest", env={**plugins, "REPRO_TEST_SWAP": "epoch:3"}
        )
        try:
            run_id = svc.submit(json.dumps(found), "application/json").json()["run"]["id"]
            run = svc.wait_run(run_id)
            # Right structure, self-consistent: the server's checks at complete pass it.
            assert run["status"] == "succeeded", run["error"]
            clean = svc.worker(tmp_path / "clean", env=plugins)
            try:
                done = wait_check(svc, policy_check(svc, run_id)["id"])
            finally:
                clean.stop()
        finally:
            dishonest.stop()
        listed = svc.client.get("/api/v1/runs", params={"spot_check": "failed"}).json()
        assert [r["id"] for r in listed["items"]] == [run_id]

    assert done["requested_by"] is None  # the policy asked, not a person
    assert done["status"] == "failed", done["report"]
    failure = done["report"]["first_failure"]
    assert (failure["segment"]["from_epoch"], failure["segment"]["to_epoch"]) == (2, 3)
    assert sorted(failure["report"]["variables"]) == ["model/first/bias", "model/second/bias"]
    verdicts = [s["verdict"] for s in done["report"]["segments"]]
    assert verdicts == ["identical", "identical", "diverged"]


def test_step_segments_replay_mid_epoch_and_catch_a_nudged_step(tmp_path: Path) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    plugins = {
        "PYTHONPATH": job_env([make_plugin_site(tmp_path / "site"), PLUGIN_DIR])["PYTHONPATH"]
    }
    found = spec(epochs=2)
    found["dataset"]["train_batches"] = 10
    found["training"]["checkpoint_every_steps"] = 4  # 4, 8, 12, 16; epochs end at 10, 20
    with running(Service(tmp_path / "data", extra=("--no-demo",), env=plugins)) as (svc, _):
        flaky = svc.worker(tmp_path / "flaky", env={**plugins, PERTURB: f"{TARGET}@step:13"})
        try:
            run_id = svc.submit(json.dumps(found), "application/json").json()["run"]["id"]
            assert svc.wait_run(run_id)["status"] == "succeeded"
            clean = svc.worker(tmp_path / "clean", env=plugins)
            try:
                done = spot_check(svc, run_id, seed=1, segments=6)
            finally:
                clean.stop()
        finally:
            flaky.stop()

    rows = done["report"]["segments"]
    spans = [(r["from_step"], r["to_step"], r["from_kind"], r["to_kind"]) for r in rows]
    assert spans == [
        (0, 4, "epoch", "step"),
        (4, 8, "step", "step"),
        (8, 10, "step", "epoch"),
        (10, 12, "epoch", "step"),
        (12, 16, "step", "step"),
        (16, 20, "step", "epoch"),
    ]
    # Only the stretch holding step 13 fails; later ones start from its nudged checkpoint.
    assert [r["verdict"] for r in rows] == ["identical"] * 4 + ["diverged", "identical"]
    failure = done["report"]["first_failure"]
    # Nudged at step 13, three steps before the segment's end: by then it spread further.
    assert TARGET in failure["report"]["variables"]
    assert failure["report"]["first_divergence"]["step"] == 16
    assert failure["report"]["cause"] == "compute"


def test_the_trainer_alone_never_verifies_its_own_run(tmp_path: Path) -> None:
    found = spec(epochs=2)
    found["model"]["architecture"] = "mlp"
    found["model"]["params"] = {"hidden": [8]}
    env = {"REPRO_SPOT_CHECK_OTHER_WORKER_SECONDS": "4"}
    service = Service(tmp_path / "data", extra=("--no-demo",), env=env)
    with running(service, tmp_path / "trainer") as (svc, _):
        run_id = svc.submit(json.dumps(found), "application/json").json()["run"]["id"]
        assert svc.wait_run(run_id)["status"] == "succeeded"
        env_cli = {"REPRO_API_URL": svc.url, "REPRO_TOKEN": svc.admin_token}
        ask = ("spot-check", str(run_id), "--segments", "1", "--wait")
        # Only the trainer is live: its replay would prove nothing, so none is made.
        alone = repro(*ask, "--json", env=env_cli)
        assert alone.returncode == 1, alone.stdout + alone.stderr
        assert json.loads(alone.stdout)["status"] == "no-other-worker"
        # ... and it said why it waited while it did, not only once the wait was over.
        assert "waiting: 1 replay waits for a worker of another identity" in alone.stderr
        assert "--allow-trainer" in alone.stderr
        # Asked for explicitly, the trainer replays it: bit for bit, and labelled as no proof.
        own = repro(*ask, "--allow-trainer", env=env_cli)
        assert own.returncode == 3, own.stdout + own.stderr
        assert "self-consistent" in own.stdout
        assert "proves nothing about a dishonest worker" in own.stdout
        newest = svc.client.get(f"/api/v1/runs/{run_id}/spot-checks").json()[0]
    report = newest["report"]
    assert report["allow_trainer"] is True and report["independent_segments"] == 0
    assert [(r["worker"], r["same_worker"], r["verdict"]) for r in report["segments"]] == [
        ("trainer", True, "identical")
    ]
    assert report["catch_chance"] == {"0.1": 0.0, "0.5": 0.0}
