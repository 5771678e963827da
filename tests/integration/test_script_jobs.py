"""Your own training script as a run, end to end against a real `repro serve` and a process
worker started with `--trust-code`: `repro run train.py -- ARGS` ships the script's directory
by digest and the worker runs it with the run's seed; `repro rerun` gives `identical` for
both examples (a Keras `model.fit` script and a custom GradientTape loop); a one-line change
(a layer width) gives `diverged`, cause compute, naming the changed file; a changed `--lr`
argument is named by the spec diff; data drawn differently is named as the cause. The
server checks each final fingerprint against the uploaded checkpoint of the last epoch, as
it does for every run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import repro
from tests.integration.service_procs import Service, WorkerProc, trusting_service

pytestmark = [pytest.mark.slow]

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "scripts"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with trusting_service(tmp_path_factory.mktemp("script-jobs")) as svc:
        yield svc


def cli(service: Service, *args: str, expect: int = 0) -> str:
    # The API's options before a `--`, after which everything is the script's.
    command, rest = args[0], args[1:]
    api = ("--api", service.url, "--token", service.admin_token)
    done = repro(command, *api, *rest, timeout=600)
    assert done.returncode == expect, done.stdout + done.stderr
    return done.stdout


def run_script(service: Service, script: Path, *args: str, seed: int = 7) -> dict[str, Any]:
    """`repro run SCRIPT --wait -- ARGS`: the finished run's detail."""
    out = cli(service, "run", str(script), "--seed", str(seed), "--wait", "--", *args)
    run_id = int(re.search(r"\brun (\d+)\b", out).group(1))  # type: ignore[union-attr]
    run: dict[str, Any] = service.client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "succeeded", run.get("error")
    return run


def compare(service: Service, a: int, b: int) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(cli(service, "compare", str(a), str(b), "--json", expect=1))
    return report


@pytest.mark.parametrize(
    ("script", "args"),
    [("fit_digits.py", ["--epochs", "2"]), ("gradient_tape.py", ["--epochs", "2"])],
)
def test_a_script_run_reruns_identical(service: Service, script: str, args: list[str]) -> None:
    first = run_script(service, SCRIPTS / script, *args)
    spec = first["spec"]
    assert spec["kind"] == "script"
    assert spec["script"] == {"entry": script, "args": args}
    assert spec["seed"] == [7, 0]
    provenance = first["provenance"]
    assert script in provenance["code"]["files"]
    assert provenance["script_run"]["params"]["epochs"] == 2
    assert provenance["seed"] == [7, 0]
    assert [row["epoch"] for row in first["metrics"]] == [1, 2]
    # Succeeded: the server recomputed the final fingerprint from the uploaded checkpoint.
    assert first["final_fingerprint"] == first["trace"][-1]["fingerprint"]
    assert first["checkpoint_epoch"] == 2
    assert [d["epoch"] for d in first["data_fingerprints"]] == [1, 2]
    assert first["result_summary"]["determinism"]["reseed"].startswith("at reprotrain.init()")
    # What the script printed last (its stdout) reached the server with the log's end.
    printed = f": {first['final_fingerprint']}\n"  # `run ID: FINGERPRINT`, its last line
    job_log = service.client.get(f"/api/v1/runs/{first['id']}/log").json()
    assert printed in job_log["text"] and job_log["attempts"] == [1], job_log["text"][-2000:]
    assert printed in cli(service, "logs", str(first["id"]))

    out = cli(service, "rerun", str(first["id"]), "--wait")
    assert "identical" in out, out
    rerun_id = int(re.search(r"\brun (\d+)\b", out).group(1))  # type: ignore[union-attr]
    rerun = service.client.get(f"/api/v1/runs/{rerun_id}").json()
    assert rerun["verdict"] == "identical"
    assert rerun["final_fingerprint"] == first["final_fingerprint"]

    page = service.dashboard().get(f"/runs/{rerun_id}")
    assert page.status_code == 200, page.text[-2000:]
    assert script in page.text and "identical" in page.text


def test_a_changed_width_and_a_changed_argument_are_named(service: Service, tmp_path: Path) -> None:
    directory = tmp_path / "digits"
    shutil.copytree(SCRIPTS, directory)
    script = directory / "fit_digits.py"
    base = run_script(service, script, "--epochs", "1")

    text = script.read_text()
    assert 'add_argument("--width", type=int, default=16)' in text
    script.write_text(text.replace("default=16)", "default=24)"))
    wider = run_script(service, script, "--epochs", "1")
    report = compare(service, base["id"], wider["id"])
    assert report["verdict"] == "diverged"
    assert report["cause"] == "compute"
    assert report["first_divergence"]["kind"] == "init"
    assert [f["path"] for f in report["code_files_differing"]] == ["fit_digits.py"]
    assert "fit_digits.py" in report["explanation"]

    script.write_text(text)
    faster = run_script(service, script, "--epochs", "1", "--lr", "0.01")
    report = compare(service, base["id"], faster["id"])
    assert report["verdict"] == "diverged"
    fields = {d["path"]: (d["a"], d["b"]) for d in report["spec_diff"]}
    assert fields == {"script.args.--lr": (None, "0.01")}, report["spec_diff"]
    assert "script.args.--lr" in report["explanation"]


def test_changed_data_is_named_as_the_cause(service: Service, tmp_path: Path) -> None:
    """The custom loop wraps its batches with run.dataset: data drawn with another spread
    gives the same initial weights and a divergence in epoch 1 whose cause is the data."""
    directory = tmp_path / "blobs"
    shutil.copytree(SCRIPTS, directory)
    script = directory / "gradient_tape.py"
    base = run_script(service, script, "--epochs", "1")
    assert [d["epoch"] for d in base["data_fingerprints"]] == [1]

    text = script.read_text()
    assert "stddev=3.0" in text
    script.write_text(text.replace("stddev=3.0", "stddev=3.5"))
    spread = run_script(service, script, "--epochs", "1")
    report = compare(service, base["id"], spread["id"])
    assert report["verdict"] == "diverged"
    assert report["first_divergence"]["kind"] == "epoch"
    assert report["cause"] == "data", report["explanation"]
    assert [f["path"] for f in report["code_files_differing"]] == ["gradient_tape.py"]
    assert "input pipeline diverged in epoch 1" in report["explanation"]


def test_a_script_the_server_cannot_run_is_refused_at_submit(
    service: Service, tmp_path: Path
) -> None:
    from service.client.script_bundle import build_script_wheel
    from tests.integration.test_code_bundles import pushed_digest

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.py").write_text("import reprotrain\n")
    wheel = build_script_wheel(tmp_path / "d", "train.py", tmp_path / "out")
    code = pushed_digest(service.client, wheel.read_bytes(), name="d")

    def refused(spec: dict[str, Any]) -> list[str]:
        answer = service.client.post("/api/v1/experiments", json=spec)
        assert answer.status_code == 422, answer.text
        return [e["loc"] for e in answer.json()["errors"]]

    spec = {"kind": "script", "name": "d", "script": {"entry": "other.py"}, "code": code}
    assert refused(spec) == ["script.entry"]
    assert refused({**spec, "code": "sha256:" + "0" * 64}) == ["code"]
    assert refused({**spec, "script": {"entry": "../train.py"}}) == ["script.entry"]

    done = repro("run", str(tmp_path / "d" / "train.py"), "--out", "x.json", timeout=60)
    assert done.returncode == 2
    assert "a script run does not take --out" in done.stderr


def test_a_script_stopped_after_epoch_2_of_4_resumes_identical_and_spot_checks_verify(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "digits"
    shutil.copytree(SCRIPTS, directory)
    script = directory / "fit_digits.py"
    # A pause after each epoch (after its checkpoint) leaves time to stop the worker there;
    # sleeping changes no number.
    text = script.read_text()
    pause = "keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: time.sleep(2))"
    assert "callbacks=[run.keras_callback()]" in text
    script.write_text(
        "import time\n"
        + text.replace(
            "callbacks=[run.keras_callback()]", f"callbacks=[run.keras_callback(), {pause}]"
        )
    )
    service = Service(tmp_path / "data", extra=("--no-demo",))
    workers: list[WorkerProc] = []

    def worker(name: str) -> WorkerProc:
        token = service.token("worker", name)
        workers.append(
            WorkerProc(
                service.url, tmp_path / name, token=token, name=name, extra=("--trust-code",)
            )
        )
        return workers[-1]

    try:
        service.wait_ready()
        first = worker("first")
        reference = run_script(service, script, "--epochs", "4")

        out = cli(service, "run", str(script), "--seed", "7", "--", "--epochs", "4")
        run_id = int(re.search(r"\brun (\d+)\b", out).group(1))  # type: ignore[union-attr]
        deadline = time.monotonic() + 300
        while (service.client.get(f"/api/v1/runs/{run_id}").json()["checkpoint_epoch"] or 0) < 2:
            assert time.monotonic() < deadline, first.log.read_text()[-3000:]
            time.sleep(0.1)
        first.signal(signal.SIGTERM)  # the job is in its pause after epoch 2
        stopped = service.client.get(f"/api/v1/runs/{run_id}").json()
        assert stopped["status"] == "queued", stopped
        # Epoch 2's, unless a slow machine let the poll see it only after epoch 3's came.
        assert stopped["checkpoint_epoch"] in (2, 3), stopped
        assert f"run {run_id} interrupted" in first.log.read_text()

        second = worker("second")
        done = service.wait_run(run_id, timeout=300)
        assert f"run {run_id} attempt" in second.log.read_text()

        # The reference, trained by the first worker alone, spot-checked by the second: each
        # of its four epochs replayed from the checkpoint before it, bit for bit.
        out = cli(service, "spot-check", str(reference["id"]), "--segments", "4", "--wait")
        assert "verified" in out, out
        checked = service.client.get(f"/api/v1/runs/{reference['id']}").json()
        assert checked["spot_check"] == "verified"
    finally:
        for w in workers:
            w.stop()
        service.stop()
    assert done["status"] == "succeeded", done["error"]
    assert done["result_summary"]["resumed_from_epoch"] == stopped["checkpoint_epoch"]
    assert [p["epoch"] for p in done["trace"] if p["kind"] == "epoch"] == [1, 2, 3, 4]
    assert [row["epoch"] for row in done["metrics"]] == [1, 2, 3, 4]
    assert done["final_fingerprint"] == reference["final_fingerprint"]
    assert done["trace"] == reference["trace"]


def test_a_shuffle_before_init_reruns_identical(service: Service, tmp_path: Path) -> None:
    """The worker seeds Python's and NumPy's generators before the script starts, so even
    a split drawn before `init()` is the same on every run of it."""
    from tests.unit.test_script_specs import SHUFFLES_FIRST

    (tmp_path / "d").mkdir()
    script = tmp_path / "d" / "train.py"
    script.write_text(SHUFFLES_FIRST)
    first = run_script(service, script)
    assert not [w for w in first["result_summary"]["warnings"] if "was drawn from" in w]
    out = cli(service, "rerun", str(first["id"]), "--wait")
    assert "identical" in out, out


def test_a_script_run_by_hand_is_recorded_and_retrained_on_a_worker(
    service: Service, tmp_path: Path
) -> None:
    """`python fit_digits.py` with REPRO_API_URL and REPRO_TOKEN set: the script's own run,
    on this machine, is recorded on the server with its metrics, params, trace and data
    fingerprints, marked as run by hand (no image). A plain rerun is refused with the way
    to do it; `repro rerun ID --on-worker` retrains it on a worker, and the comparison
    lists what differs between the two environments."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env.update(
        {
            "REPRO_API_URL": service.url,
            "REPRO_TOKEN": service.admin_token,
            "REPRO_SCRIPT_RUNS_DIR": str(tmp_path / "runs"),
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "fit_digits.py"), "--epochs", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"reprotrain: recording run (\d+) at (\S+)", done.stderr)
    assert found is not None, done.stderr[-3000:]
    run_id = int(found.group(1))
    assert found.group(2) == f"{service.url}/runs/{run_id}"

    by_hand = service.client.get(f"/api/v1/runs/{run_id}").json()
    assert by_hand["status"] == "succeeded", by_hand["error"]
    assert by_hand["origin"] == "by_hand" and by_hand["worker_id"] is None
    assert by_hand["spec"]["kind"] == "script"
    assert by_hand["spec"]["script"] == {"entry": "fit_digits.py", "args": ["--epochs", "2"]}
    assert by_hand["spec"]["seed"] == [42, 0]  # the script's own seed=, recorded
    provenance = by_hand["provenance"]
    assert provenance["execution"]["by_hand"] is True
    assert provenance["image"]["reference"] is None and provenance["image"]["id"] is None
    assert provenance["script_run"]["params"] == {"epochs": 2, "lr": 0.003, "width": 16, "seed": 42}
    assert [row["epoch"] for row in by_hand["metrics"]] == [1, 2]
    assert [p["kind"] for p in by_hand["trace"]] == ["init", "epoch", "epoch"]
    assert by_hand["final_fingerprint"] == by_hand["trace"][-1]["fingerprint"]
    assert [d["epoch"] for d in by_hand["data_fingerprints"]] == [1, 2]
    assert by_hand["reported_by"]["fingerprint"]["outcome"] == "not_checked"

    refused = repro(
        "rerun", str(run_id), "--api", service.url, "--token", service.admin_token, timeout=60
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"repro rerun {run_id} --on-worker" in refused.stderr

    out = cli(service, "rerun", str(run_id), "--on-worker", "--wait")
    rerun_id = int(re.search(r"\brun (\d+)\b", out).group(1))  # type: ignore[union-attr]
    rerun = service.client.get(f"/api/v1/runs/{rerun_id}").json()
    assert rerun["origin"] == "worker" and rerun["worker_id"] is not None
    # The same libraries on the same machine: the worker's rerun is bitwise the same.
    assert rerun["verdict"] == "identical", rerun["verdict_report"]
    assert rerun["final_fingerprint"] == by_hand["final_fingerprint"]
    differing = {d["field"]: d for d in rerun["verdict_report"]["provenance_diff"]}
    assert differing["execution.by_hand"]["a"] is True, sorted(differing)
    assert "run by hand" in differing["execution.by_hand"]["why"]


def test_a_run_by_hand_takes_only_its_own_result_once(service: Service, tmp_path: Path) -> None:
    """What the server accepts of a run by hand: a script experiment only; its result from
    the token that started it (or an admin), of its own spec, once (a repeat is answered as
    recorded); no worker claims it meanwhile, and no worker's run takes such a report."""
    from reprotrain import ApiError, Client

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.py").write_text("import reprotrain\n")
    submitter = service.token("submitter", "by-hand")
    with Client(service.url, token=submitter) as mine:  # closed: its socket with it
        script = tmp_path / "d" / "train.py"
        run, bundle = mine.record_script_run(script, ["--x"], name="d", seed=[3, 0])
        assert run.status == "running" and run.spec_hash

        training = {"kind": "train", "name": "not-a-script"}
        answer = service.client_for("submitter").post("/api/v1/experiments/by-hand", json=training)
        assert answer.status_code == 422, answer.text

        point = {"kind": "epoch", "epoch": 1, "step": 3, "fingerprint": "blake3:" + "a" * 64}
        result = {
            "status": "succeeded",
            "spec_hash": run.spec_hash,
            "seed": [3, 0],
            "trace": [{**point, "variables": {}}],
            "final_fingerprint": point["fingerprint"],
            "metrics": [{"epoch": 1, "step": 3, "loss": 0.5}],
        }
        other = service.client_for("submitter", "someone-else")
        assert other.post(f"/api/v1/runs/{run.id}/result", json=result).status_code == 403
        with pytest.raises(ApiError) as wrong:
            mine.report_result(run.id, {**result, "spec_hash": "sha256:" + "0" * 64})
        assert wrong.value.status_code == 422

        recorded = mine.report_result(run.id, result)
        assert recorded.status == "succeeded" and recorded.final_fingerprint == point["fingerprint"]
        again = mine.report_result(run.id, result)  # the answer was lost: the same run
        assert again.id == run.id and again.final_fingerprint == recorded.final_fingerprint
        with pytest.raises(ApiError) as changed:
            mine.report_result(run.id, {**result, "final_fingerprint": "blake3:" + "b" * 64})
        assert changed.value.status_code == 409

        queued = mine.submit_script(tmp_path / "d" / "train.py", seed=3)  # a worker's run
        answer = service.client.post(f"/api/v1/runs/{queued.id}/result", json=result)
        assert answer.status_code == 409, answer.text
        assert "trained by a worker" in answer.text
        assert service.client.get(f"/api/v1/runs/{run.id}").json()["worker_id"] is None
        assert bundle.digest == run.spec["code"]
