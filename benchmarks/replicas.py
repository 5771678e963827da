"""Replicas and step checkpoints: what data-parallel training and mid-epoch checkpoints cost.

Every job runs through `python -m worker.run` in a fresh process, as a worker runs it.

- Replicas (information): steps/s of a spec with `distribution.replicas: 2` on two logical
  CPU devices against the same spec with one replica, alternating order, best epoch after
  the first. Logical devices share the machine's cores, so this shows the strategy's
  overhead on a CPU rather than a speed-up (on N GPUs each replica has its own device).
- Hosts (information): steps/s of `distribution: {hosts: 2, replicas: 1}` (two job
  processes on 127.0.0.1 joined by MultiWorkerMirroredStrategy's gRPC collectives, rank 0's
  epochs) against `{hosts: 1, replicas: 2}` (one process, two logical CPU devices), both
  with `dataset.shards: 2`. Both share the same two cores: this measures what the
  collective over sockets costs here, not scaling across machines.
- Step checkpoints: with `training.checkpoint_every_steps: 50`, the job's own timing of its
  step checkpoints (state fingerprint, npz and JSON written and renamed, digest, meta with
  the RNG states) as a share of its training time. The fsyncs run on a thread beside
  training (the job waits for them once, at its end) and are not in the share. Target: at
  most 3%.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.rounds import progress
from benchmarks.rows import Row
from benchmarks.training_cost import REPO, Trained, best_of, job_env, trained

CHECKPOINT_TARGET = 0.03
EVERY = 50


def spec(
    *, replicas: int, batches: int, epochs: int, every: int | None = None, hosts: int = 1
) -> dict[str, Any]:
    """A dense classifier of 64 features and 10 classes, batch 256 (in 2 row shards when
    it trains on several hosts, and when it is compared with them)."""
    training: dict[str, Any] = {
        "epochs": epochs,
        "optimizer": {"name": "adam", "params": {"learning_rate": 0.001}},
        "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
    }
    if every is not None:
        training["checkpoint_every_steps"] = every
    return {
        "name": f"bench-replicas-{replicas}",
        "seed": 20261123,
        "dataset": {
            "generator": "gaussian_blobs",
            "params": {"num_features": 64, "num_classes": 10},
            "batch_size": 256,
            "train_batches": batches,
        },
        "model": {"architecture": "mlp", "params": {"hidden": [256, 256]}},
        "training": training,
        "distribution": {"replicas": replicas, "hosts": hosts},
    }


def run(spec: dict[str, Any], workdir: Path, *args: str) -> dict[str, Any]:
    """Run one job to completion in a fresh process; its result document."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out = workdir / "spec.json", workdir / "result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "worker.run", "--spec", str(spec_path), "--out", str(out)]
    done = subprocess.run(
        [*cmd, *args],
        env=job_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if done.returncode != 0 or result.get("status") != "succeeded":
        error = (result.get("error") or {}).get("message") or done.stderr[-2000:]
        raise RuntimeError(f"{spec['name']}: the job did not succeed: {error}")
    return result


def run_hosts(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run one job on `distribution.hosts` processes of this machine; rank 0's result."""
    hosts = spec["distribution"]["hosts"]
    socks = [socket.socket() for _ in range(hosts)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    workers = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    for s in socks:
        s.close()
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    procs = []
    for rank in range(hosts):
        out = workdir / f"result-{rank}.json"
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        cmd = [sys.executable, "-m", "worker.run", "--spec", str(spec_path), "--out", str(out)]
        env = {**job_env(), "TF_CONFIG": json.dumps(config)}
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    codes = [p.wait(timeout=600) for p in procs]
    results: list[dict[str, Any]] = [
        json.loads((workdir / f"result-{r}.json").read_text()) for r in range(hosts)
    ]
    if any(codes) or any(r.get("status") != "succeeded" for r in results):
        errors = [(r.get("error") or {}).get("message") for r in results]
        raise RuntimeError(f"{spec['name']}: a host did not succeed: {errors}")
    return results[0]


def _sharded(case: dict[str, Any]) -> dict[str, Any]:
    case["dataset"]["shards"] = 2
    return case


def measure(quick: bool) -> list[Row]:
    batches, epochs = (20, 2) if quick else (40, 3)
    rates: dict[int, list[Trained]] = {1: [], 2: []}
    shares: list[tuple[float, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="reprotrain-bench-replicas-") as tmp:
        order = (1, 2) if quick else (1, 2, 2, 1)
        for n, replicas in enumerate(order):
            progress(f"replicas: {replicas} replica(s), round {n + 1} of {len(order)}")
            result = run(
                spec(replicas=replicas, batches=batches, epochs=epochs), Path(tmp) / str(n)
            )
            rates[replicas].append(trained(result))
        split: dict[int, list[Trained]] = {1: [], 2: []}
        for n, hosts in enumerate((2, 1) if quick else (2, 1, 1, 2)):
            progress(f"replicas: {hosts} host(s) x {2 // hosts} replica(s), round {n + 1}")
            case = _sharded(spec(replicas=2 // hosts, hosts=hosts, batches=batches, epochs=epochs))
            where = Path(tmp) / f"hosts-{n}"
            split[hosts].append(trained(run_hosts(case, where) if hosts > 1 else run(case, where)))
        for n in range(1):
            progress(f"replicas: step checkpoints every {EVERY} steps, round {n + 1}")
            work = Path(tmp) / f"ckpt-{n}"
            case = spec(replicas=1, batches=max(batches, EVERY), epochs=epochs + 1, every=EVERY)
            result = run(case, work, "--checkpoint-dir", str(work / "ckpt"))
            timings = result["timings"]
            written = len(list((work / "ckpt").glob("step-*.json")))
            shares.append((timings["step_checkpointing"], timings["training"], written))
    one, two = best_of(rates[1]), best_of(rates[2])
    config = f"mlp 256x256, batch 256 x {batches} steps/epoch, 2 logical CPU devices"
    rows = [
        Row(
            section="replicas",
            benchmark="2 replicas vs 1, steps/s",
            configuration=config,
            unit="steps/s",
            measured=two.steps_per_s,
            baseline=one.steps_per_s,
            ratio=two.steps_per_s / one.steps_per_s,
            params={"replicas": 2, "median_2": two.median_steps_per_s},
        )
    ]
    two_hosts, one_host = best_of(split[2]), best_of(split[1])
    rows.append(
        Row(
            section="replicas",
            benchmark="2 hosts x 1 replica vs 1 host x 2 replicas, steps/s",
            configuration=f"mlp 256x256, batch 256 in 2 shards x {batches} steps/epoch; two "
            "processes on 127.0.0.1 (gRPC ring all-reduce) vs two logical CPU devices",
            unit="steps/s",
            measured=two_hosts.steps_per_s,
            baseline=one_host.steps_per_s,
            ratio=two_hosts.steps_per_s / one_host.steps_per_s,
            params={"hosts": 2, "median_2_hosts": two_hosts.median_steps_per_s},
        )
    )
    spent, training, written = min(shares, key=lambda s: s[0] / s[1])
    share = spent / training
    per = spent / max(written, 1)
    rows.append(
        Row(
            section="replicas",
            benchmark=f"step checkpoints every {EVERY} steps, share of training",
            configuration=f"mlp 256x256 (1 MB of state with Adam's moments), {written} step "
            f"checkpoints of {per * 1000:.1f} ms",
            unit="s",
            measured=spent,
            baseline=training,
            ratio=share,
            target=f"<= {CHECKPOINT_TARGET:.2f}",
            met=share <= CHECKPOINT_TARGET,
            cause=""
            if share <= CHECKPOINT_TARGET
            else f"a step checkpoint costs {per * 1000:.1f} ms (fingerprint, npz write, "
            f"digest, meta); {EVERY} steps take "
            f"{training / max(1, written) * 1000:.0f} ms here: checkpoint less often on "
            "models this fast",
            params={"every": EVERY, "share": share, "per_checkpoint_s": per},
        )
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the section on its own and print its rows."""
    from benchmarks.rows import render_table

    print(render_table(measure("--quick" in (argv or sys.argv[1:]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
