"""`distribution.hosts`: one run trained by several job processes, one per host, under
MultiWorkerMirroredStrategy, each generating only its own shards of every batch. Here the
hosts are processes on 127.0.0.1, each given the cluster as `TF_CONFIG`, as a gang's
members are."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gang import Gang, free_addresses
from tests.integration.jobs import (
    blobs_spec,
    job_env,
    read_result,
    write_spec,
)
from tests.integration.jobs import run_job as run_one
from worker.compare.verdict import build_report, record_from_result
from worker.result import JobResult

pytestmark = pytest.mark.slow


def _spec(hosts: int, replicas: int = 1, **training: Any) -> dict[str, Any]:
    base = blobs_spec()
    return blobs_spec(
        dataset={**base["dataset"], "shards": 2},
        training={**base["training"], **training},
        distribution={"hosts": hosts, "replicas": replicas},
    )


def _files(directory: Path) -> list[Path]:
    return sorted(directory.iterdir()) if directory.exists() else []


def _trained(spec: dict[str, Any], root: Path, *args: str) -> JobResult:
    """Rank 0's result of a gang that trained `spec` to its end (every member succeeded)."""
    given = root / "m1" / "ckpt"  # what a resumed member was given
    before = _files(given)
    members = Gang(spec, root, *args).wait()
    for m in members:
        assert m.returncode == 0, (m.result.error, m.stderr[-3000:])
    lead, other = members[0].result, members[1].result
    # Rank 0 alone writes checkpoints and fingerprints the data; every member trains alike.
    assert lead.checkpoints and lead.data_fingerprints
    assert _files(given) == before and other.data_fingerprints == []
    assert [p.step for p in other.trace] == [p.step for p in lead.trace]
    assert [m["loss"] for m in other.metrics] == [m["loss"] for m in lead.metrics]
    return lead


def _same_run(a: JobResult, b: JobResult) -> None:
    assert a.final_fingerprint is not None
    assert a.final_fingerprint == b.final_fingerprint
    assert a.trace == b.trace
    assert a.data_fingerprints == b.data_fingerprints
    assert a.step_metrics == b.step_metrics


def test_hosts_rerun_identically_and_train_on_the_rows_one_host_would(
    tmp_path: Path,
) -> None:
    first = _trained(_spec(2), tmp_path / "h2-a")
    again = _trained(_spec(2), tmp_path / "h2-b")
    _same_run(first, again)  # a rerun of the same cluster size: bitwise
    assert first.determinism["distribution"]["strategy"] == "MultiWorkerMirroredStrategy"

    one_host_two = run_one(_spec(1, 2), tmp_path / "h1x2")  # logical CPUs
    one_host_one = run_one(_spec(1, 1), tmp_path / "h1x1")
    for run in (one_host_two, one_host_one):
        assert run.returncode == 0, run.result.error
        # Batch b of epoch e holds the same rows however the global batch is split.
        assert run.result.data_fingerprints == first.data_fingerprints
        assert run.result.eval_data_fingerprint == first.eval_data_fingerprint
    # Two replicas in all either way: each gradient is a sum of two terms, exact in any
    # order, so one host of two devices ends with the same bits as two hosts of one.
    assert one_host_two.result.final_fingerprint == first.final_fingerprint

    # One device sums its gradient over the whole batch at once: other bits, same data.
    report = build_report(
        record_from_result(one_host_one.result, "a"), record_from_result(first, "b")
    )
    assert report["verdict"] == "diverged" and report["cause"] == "compute"
    assert report["data_epochs_equal"] == [1, 2, 3, 4]
    paths = {d["path"] for d in report["spec_diff"]}
    assert paths == {"distribution.hosts"}, report["spec_diff"]

    # Two hosts of two logical CPU devices each: bitwise again, on the same rows; four
    # terms are summed in another order than two, so other bits than two hosts of one.
    four = _trained(_spec(2, 2), tmp_path / "h2x2-a")
    _same_run(four, _trained(_spec(2, 2), tmp_path / "h2x2-b"))
    assert four.determinism["distribution"]["device_kind"] == "logical_cpu"
    assert four.data_fingerprints == first.data_fingerprints
    report = build_report(record_from_result(four, "a"), record_from_result(first, "b"))
    assert report["verdict"] == "diverged" and report["cause"] == "compute"
    assert report["data_epochs_equal"] == [1, 2, 3, 4]


def _wait_for_step_checkpoint(directory: Path, gang: Gang, timeout: float = 240) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(directory.glob("step-*.json")) if directory.exists() else []
        if found:
            return found[-1]
        assert all(p.poll() is None for p in gang.procs), "a member ended before the kill"
        time.sleep(0.1)
    raise TimeoutError(f"no step checkpoint in {directory}")


def test_a_killed_member_stops_the_gang_which_resumes_identically_from_rank_0(
    tmp_path: Path,
) -> None:
    spec = _spec(2, epochs=3, checkpoint_every_steps=10)
    spec["dataset"]["train_batches"] = 40
    straight = _trained(spec, tmp_path / "straight")

    gang = Gang(spec, tmp_path / "killed")
    _wait_for_step_checkpoint(gang.dirs[0] / "ckpt", gang)
    gang.procs[1].send_signal(signal.SIGKILL)
    t_kill = time.monotonic()
    gang.procs[1].wait()
    gang.logs[1].close()
    survivor = gang.member(0, timeout=120)
    stopped_after = time.monotonic() - t_kill
    # The survivor does not hang on its peer: its next collective fails, and it says so.
    assert survivor.returncode != 0 and survivor.result.status == "failed"
    assert survivor.result.error is not None and survivor.result.error.phase == "training"
    assert survivor.result.error.type == "ClusterError"
    assert "the cluster lost a member" in survivor.result.error.message
    assert stopped_after < 60, stopped_after

    # A new gang resumes from rank 0's checkpoints, copied to every member.
    resumed_root = tmp_path / "resumed"
    for r in range(2):
        shutil.copytree(gang.dirs[0] / "ckpt", resumed_root / f"m{r}" / "ckpt")
    resumed = _trained(spec, resumed_root, "--resume")
    assert resumed.resumed_from_step is not None or resumed.resumed_from_epoch is not None
    _same_run(straight, resumed)


def test_a_member_whose_cluster_never_forms_fails_saying_so(tmp_path: Path) -> None:
    spec_path = write_spec(_spec(2), tmp_path)
    addresses = free_addresses(2)
    cluster = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}}
    out = tmp_path / "result.json"
    alone = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker.run",
            "--spec",
            str(spec_path),
            "--out",
            str(out),
            "--join-timeout",
            "8",
        ],
        env={**job_env(), "TF_CONFIG": json.dumps(cluster)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert alone.returncode == 1
    result = read_result(out)
    assert result.status == "failed" and result.error is not None
    assert result.error.type == "ClusterError"
    assert "did not form within 8 s" in result.error.message
    assert addresses[1] in result.error.message  # the member it waited for


def test_a_member_without_its_cluster_is_refused_before_training(tmp_path: Path) -> None:
    run = run_one(_spec(2), tmp_path)
    assert run.returncode == 2 and run.result.error is not None
    assert run.result.error.phase == "spec"
    assert "TF_CONFIG is not set" in run.result.error.message
