"""Data-parallel jobs on two logical CPU devices, in fresh processes, with real TensorFlow."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.jobs import Finished, job_env, run_job, write_spec
from tests.integration.killable import KILL_VARIABLE, make_kill_plugin_site, replica_spec
from worker.data.dataset_format import file_digest
from worker.record.trace import compare_traces
from worker.result import JobResult
from worker.training.progress import parse_line

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plugin_paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return make_kill_plugin_site(tmp_path_factory.mktemp("kill-plugin"))


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory: pytest.TempPathFactory, plugin_paths: list[Path]) -> Finished:
    """An uninterrupted two-replica run with step checkpoints every 10 steps."""
    work = tmp_path_factory.mktemp("two-replicas")
    done = run_job(
        replica_spec(2), work, "--checkpoint-dir", str(work / "ckpt"), extra_paths=plugin_paths
    )
    assert done.returncode == 0, done.result.error
    return done


def _run_killed(
    spec: dict[str, Any], work: Path, plugin_paths: list[Path], after_step: int
) -> tuple[int, list[dict[str, Any]]]:
    """Run a job that SIGKILLs itself right after `after_step`: (return code, its events)."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "worker.run", "--spec", str(write_spec(spec, work))]
    cmd += ["--out", str(work / "result.json"), "--checkpoint-dir", str(work / "ckpt")]
    proc = subprocess.run(
        cmd,
        env={**job_env(plugin_paths), KILL_VARIABLE: str(after_step)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    events = [e for e in map(parse_line, proc.stderr.splitlines()) if e is not None]
    return proc.returncode, events


def _metrics(result: JobResult) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in result.metrics]


def test_two_replicas_rerun_in_a_fresh_process_is_bitwise_identical(
    tmp_path: Path, two_replicas: Finished, plugin_paths: list[Path]
) -> None:
    a = two_replicas.result
    b = run_job(replica_spec(2), tmp_path, extra_paths=plugin_paths).result
    assert b.status == "succeeded", b.error
    assert compare_traces(a.trace, b.trace).identical
    assert a.trace == b.trace and a.final_fingerprint == b.final_fingerprint
    assert [p.step for p in a.trace if p.kind == "step"] == list(range(5, 41, 5))
    assert _metrics(a) == _metrics(b)
    # The reduction is chosen, not left to the strategy, and recorded with the devices.
    dist = a.determinism["distribution"]
    assert dist["replicas"] == 2 and dist["device_kind"] == "logical_cpu"
    assert [d.rsplit(":", 1)[-1] for d in dist["devices"]] == ["0", "1"]
    assert dist["cross_device_ops"] == "ReductionToOneDevice" and dist["accumulation"] == "add_n"
    assert a.provenance["determinism"]["distribution"] == dist


def test_sigkill_after_step_37_resumes_at_step_30_and_ends_identical(
    tmp_path: Path, two_replicas: Finished, plugin_paths: list[Path]
) -> None:
    ckpt = tmp_path / "ckpt"
    returncode, events = _run_killed(replica_spec(2), tmp_path, plugin_paths, after_step=37)
    assert returncode == -9 and not (tmp_path / "result.json").exists()  # a real SIGKILL
    saved = [e["step"] for e in events if e["event"] == "checkpoint"]
    assert saved == [10, 20, 20, 30]  # step 20 ends epoch 1: a step and an epoch checkpoint
    assert sorted(p.name for p in ckpt.glob("step-*.json"))[-1] == "step-000000030.json"

    resumed = run_job(
        replica_spec(2),
        tmp_path,
        "--checkpoint-dir",
        str(ckpt),
        "--resume",
        extra_paths=plugin_paths,
    )
    r, ref = resumed.result, two_replicas.result
    assert resumed.returncode == 0, r.error
    assert [e for e in resumed.events if e["event"] == "resumed"] == [
        {"event": "resumed", "epoch": 2, "step": 30, "batch": 10, "kind": "step"}
    ]
    assert r.resumed_from_step == 30 and r.resumed_from_epoch is None
    # Nothing replayed: the resumed process trained steps 31..40 only.
    steps = [e["step"] for e in resumed.events if e["event"] == "checkpoint"]
    assert steps == [40, 40]
    assert r.trace == ref.trace and r.final_fingerprint == ref.final_fingerprint
    assert r.data_fingerprints == ref.data_fingerprints
    assert r.eval_data_fingerprint == ref.eval_data_fingerprint
    # The resumed epoch's running metrics continue from the checkpoint.
    assert _metrics(r) == _metrics(ref)


def test_data_is_independent_of_replicas_and_foreign_checkpoints_are_skipped(
    tmp_path: Path, two_replicas: Finished, plugin_paths: list[Path]
) -> None:
    one = run_job(
        replica_spec(1),
        tmp_path / "one",
        "--checkpoint-dir",
        str(tmp_path / "one" / "ckpt"),
        extra_paths=plugin_paths,
    )
    a, b = one.result, two_replicas.result
    assert one.returncode == 0, a.error
    assert "distribution" not in a.determinism  # one replica: the record is unchanged
    assert a.data_fingerprints == b.data_fingerprints
    assert a.eval_data_fingerprint == b.eval_data_fingerprint
    assert a.trace[0] == b.trace[0]  # the same initial weights; only training differs

    # Two replicas handed the one-replica checkpoints: every one skipped, none loaded.
    ckpt = tmp_path / "two" / "ckpt"
    shutil.copytree(tmp_path / "one" / "ckpt", ckpt)
    two = run_job(
        replica_spec(2),
        tmp_path / "two",
        "--checkpoint-dir",
        str(ckpt),
        "--resume",
        extra_paths=plugin_paths,
    )
    r = two.result
    assert two.returncode == 0, r.error
    assert r.resumed_from_step is None and r.trace == b.trace
    skipped = [w for w in r.warnings if w.startswith("skipped checkpoint")]
    assert len(skipped) == 6 and all("written with 1 replica(s)" in w for w in skipped)
    assert "this job has 2" in skipped[0]


def test_more_replicas_than_devices_fails_naming_the_count(
    tmp_path: Path, plugin_paths: list[Path]
) -> None:
    done = run_job(replica_spec(4), tmp_path, "--no-logical-devices", extra_paths=plugin_paths)
    assert done.returncode == 1 and done.result.status == "failed"
    assert done.result.error is not None and done.result.error.type == "DeviceError"
    assert "replicas is 4" in done.result.error.message


def _arrays_spec(digest: str, replicas: int) -> dict[str, Any]:
    """Stored uint8 images, cast to float32 and augmented in the input pipeline."""
    return {
        "name": "arrays-replicas",
        "seed": 3,
        "dataset": {
            "generator": "arrays",
            "data": digest,
            "params": {
                "eval_fraction": 0.25,
                "scale": 1 / 255,
                "crop_padding": 1,
                "flip_left_right": True,
            },
            "batch_size": 32,
            "train_batches": 6,
            "eval_batches": 2,
        },
        "model": {"architecture": "small_cnn", "params": {"filters": [4, 8], "dense": 8}},
        "training": {
            "epochs": 2,
            "optimizer": {"name": "adam", "params": {"learning_rate": 0.01}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "fingerprint_every_steps": 3,
        },
        "distribution": {"replicas": replicas},
    }


def test_stored_images_give_the_same_data_on_one_and_two_replicas(tmp_path: Path) -> None:
    """The `arrays` generator casts stored uint8 images to float32 before a batch is split:
    each of two replicas takes its rows of the same global batch, so the data fingerprints
    equal one replica's, and two runs on two replicas are bitwise identical."""
    rng = np.random.default_rng(5)
    path = tmp_path / "images.npz"
    np.savez(
        path,
        x=rng.integers(0, 256, (256, 8, 8, 1), dtype=np.uint8),
        y=rng.integers(0, 4, 256, dtype=np.int64),
    )
    runs = {
        name: run_job(
            _arrays_spec(file_digest(path), replicas),
            tmp_path / name,
            "--dataset-file",
            str(path),
        )
        for name, replicas in (("one", 1), ("two", 2), ("two-again", 2))
    }
    for done in runs.values():
        assert done.returncode == 0, done.result.error
    one, two, again = (runs[n].result for n in ("one", "two", "two-again"))
    assert two.determinism["distribution"]["replicas"] == 2
    assert one.data_fingerprints == two.data_fingerprints
    assert one.eval_data_fingerprint == two.eval_data_fingerprint
    assert one.trace[0] == two.trace[0]  # the same initial weights
    assert len(two.trace) > 3 and two.trace == again.trace
    assert two.final_fingerprint == again.final_fingerprint
