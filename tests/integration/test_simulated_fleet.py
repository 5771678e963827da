"""A fleet of worker pools as the Kubernetes overlays render them, simulated on one machine.

No cluster is reachable here, so each pool's pods are worker agents started the way its
StatefulSet starts them: the pool's image identities in `REPRO_IMAGE_*`, its agent options,
and its device count (a GPU pod's GPU becomes one logical CPU device). One API serves two
pools: "cpu" (two agents, two devices each) and "gpu" (one agent, one device). Runs of mixed
requirements are queued; each pool's KEDA trigger, evaluated against real `/metrics`
scrapes, must count exactly what that pool holds or could claim, and no run may be claimed
by a pool whose trigger did not count it. Agents are SIGTERMed mid-epoch as a scale-down
does: the run checkpoints the step it is at, is released and resumes elsewhere in its pool
or on the pod restarted with its volume. Nothing is lost or trained twice past its
checkpoint, and every rerun is pinned to the image its run trained on and claimed only by
that image's pool, also after the pool was scaled to zero.
"""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.jobs import blobs_spec, job_env
from tests.integration.service_procs import Service, WorkerProc
from tests.integration.test_pool_scaling_metrics import Samples, evaluate, pools
from tests.kustomize import OVERLAYS, rendered_pool

pytestmark = pytest.mark.slow

EPOCHS = 3
Runs = dict[int, dict[str, Any]]
Workers = dict[int, dict[str, Any]]


@dataclass
class Pool:
    """A worker pool as its overlay renders it."""

    name: str
    query: str  # the KEDA trigger's Prometheus query
    images: list[str]  # what its workers advertise: image ID, registry digest
    env: dict[str, str]  # what its pods are told about their image
    options: list[str]  # the agent's options in its pods, devices simulated on the CPU


def rendered_pools() -> dict[str, Pool]:
    """The cpu and gpu pools, their triggers and how their pods run the agent."""
    found = pools()
    out = {}
    for name, pool in found.items():
        worker = rendered_pool(OVERLAYS / name).worker
        # Its image identities and pool; not REPRO_EXPECT_GPUS: a simulated GPU is a CPU device.
        told = [
            e
            for e in worker["env"]
            if e["name"].startswith("REPRO_IMAGE_") or e["name"] == "REPRO_WORKER_POOL"
        ]
        env = {e["name"]: e["value"] for e in told}
        assert set(env) == {
            "REPRO_IMAGE_ID", "REPRO_IMAGE_DIGEST", "REPRO_IMAGE_REF", "REPRO_WORKER_POOL"
        }, env  # fmt: skip
        local = ("worker", "--api=", "--name=", "--work-dir=")  # set per simulated pod
        options = [a for a in worker["args"] if not a.startswith(local)]
        devices = pool["devices"].get("gpus") or pool["devices"]["cpu_devices"]
        if not any(a.startswith("--cpu-replicas=") for a in options):
            options.append(f"--cpu-replicas={devices}")  # no GPUs here: one CPU device each
        out[name] = Pool(name, pool["query"], pool["images"], env, options)
    assert out["cpu"].options.count("--cpu-replicas=2") == 1
    assert out["gpu"].options.count("--cpu-replicas=1") == 1
    return out


def run_samples(run: dict[str, Any], workers: Workers) -> Samples:
    """The series one run adds to a scrape (queued by what it needs, or held by what its
    worker advertises and the pool it is in), beside the one every scrape has."""
    live: Samples = [("reprotrain_workers_live", {}, float(len(workers)))]
    if run["status"] == "queued":
        labels = {"image": run["required_image"] or "", "replicas": str(run["replicas"])}
        needs = {"code": "false", "hardware": run["required_hardware"] or ""}
        return [("reprotrain_queued_runs", {**labels, **needs}, 1.0), *live]
    if run["status"] == "running":
        worker = workers[run["worker_id"]]
        held = {"devices": str(worker["devices"]), "pool": worker["pool"] or ""}
        return [
            *(
                ("reprotrain_held_runs", {"image": image, **held}, 1.0)
                for image in worker["images"]
            ),
            *live,
        ]
    return live


class Fleet:
    """The API, the pools' agents, and what was seen of them: who held which run, and each
    consistent scrape checked against the runs behind it."""

    def __init__(self, svc: Service, pools: dict[str, Pool], root: Path, paths: str) -> None:
        self.svc, self.pools, self.root, self.paths = svc, pools, root, paths
        self.tokens: dict[str, str] = {}
        self.agents: dict[str, WorkerProc] = {}
        self.stopping: set[str] = set()  # agents signalled on purpose
        self.holders: dict[int, set[str]] = defaultdict(set)  # run id -> agent names
        self.consistent = 0  # scrapes checked against an unchanged queue

    def start(self, name: str) -> WorkerProc:
        """A pod of pool `name.split('-')[0]`; the same name again is the pod restarted with
        its volume (work directory) and token."""
        pool = self.pools[name.split("-")[0]]
        token = self.tokens.setdefault(name, self.svc.token("worker", name))
        env = {"PYTHONPATH": self.paths, **pool.env}
        if name in self.agents:  # a pod restarted: the old process has exited
            self.agents[name].stop()
        agent = WorkerProc(
            self.svc.url, self.root / name, token=token, name=name, env=env,
            extra=tuple(pool.options),
        )  # fmt: skip
        self.agents[name] = agent
        self.stopping.discard(name)
        return agent

    def sigterm(self, name: str) -> None:
        """What a scale-down does to a pod: SIGTERM, then wait for it (not blocking here)."""
        self.stopping.add(name)
        self.agents[name].proc.send_signal(signal.SIGTERM)

    def runs(self) -> Runs:
        got = self.svc.client.get("/api/v1/runs", params={"limit": 500})
        assert got.status_code == 200, got.text
        return {r["id"]: r for r in got.json()["items"]}

    def scrape(self) -> Samples:
        got = self.svc.client.get("/metrics")
        assert got.status_code == 200, got.text
        return [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(got.text)
            for s in family.samples
        ]

    def observe(self) -> tuple[Runs, Workers, Samples | None]:
        """The runs, the workers, and a scrape when the runs did not change around it."""
        before = self.runs()
        samples = self.scrape()
        after = self.runs()
        workers = {w["id"]: w for w in self.svc.client.get("/api/v1/workers").json()}
        for run in after.values():
            if run["status"] == "running":
                self.holders[run["id"]].add(workers[run["worker_id"]]["name"])
        state = {i: (r["status"], r["worker_id"]) for i, r in after.items()}
        if state != {i: (r["status"], r["worker_id"]) for i, r in before.items()}:
            return after, workers, None
        for pool in self.pools.values():
            expected = sum(evaluate(pool.query, run_samples(r, workers)) for r in after.values())
            assert evaluate(pool.query, samples) == expected, (pool.name, state)
        self.consistent += 1
        return after, workers, samples

    def until(
        self, what: str, done: Callable[[Runs, Workers, Samples | None], bool], timeout: float = 300
    ) -> tuple[Runs, Workers, Samples | None]:
        """Observe until `done` says so; an agent that exits unasked fails the test."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.observe()
            if done(*seen):
                return seen
            for name, agent in self.agents.items():
                if name not in self.stopping and agent.proc.poll() is not None:
                    pytest.fail(f"agent {name} exited: {agent.log.read_text()[-3000:]}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.3)

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()


def spec(name: str, *, paced: bool, replicas: int = 1, image: str | None = None) -> str:
    """A tiny MLP; a paced one sleeps 0.2 s a step (values untouched), so each of its epochs
    lasts 4 s however fast the machine and a signal lands mid-epoch."""
    changes: dict[str, Any] = {"name": name, "distribution": {"replicas": replicas}}
    if paced:
        changes["model"] = {"architecture": "paced_mlp", "params": {"step_seconds": 0.2}}
    if image is not None:
        changes["environment"] = {"image": image}
    out = blobs_spec(**changes)
    out["dataset"].update(batch_size=64, train_batches=20 if paced else 3, eval_batches=1)
    out["training"]["epochs"] = EPOCHS if paced else 2
    return json.dumps(out)


def submit(svc: Service, body: str) -> int:
    got = svc.submit(body, "application/json")
    assert got.status_code == 201, got.text
    return int(got.json()["run"]["id"])


def counting(pools: dict[str, Pool], run: dict[str, Any]) -> set[str]:
    """The pools whose trigger counts this queued run."""
    return {p.name for p in pools.values() if evaluate(p.query, run_samples(run, {})) == 1}


def test_a_simulated_fleet_scales_on_claimable_work_and_loses_nothing(
    tmp_path: Path, postgres_url: str
) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    pools_ = rendered_pools()
    cpu, gpu = pools_["cpu"], pools_["gpu"]
    paths = job_env([make_plugin_site(tmp_path / "site"), PLUGIN_DIR])["PYTHONPATH"]
    service = Service(
        tmp_path / "data",
        database_url=postgres_url,
        env={"PYTHONPATH": paths, "REPRO_HEARTBEAT_SECONDS": "1"},
        extra=("--no-demo",),
    )
    fleet = Fleet(service, pools_, tmp_path / "pods", paths)
    try:
        service.wait_ready()
        _train_scale_down_and_rerun(fleet, cpu, gpu)
    finally:
        fleet.stop()
        service.stop()


def _train_scale_down_and_rerun(fleet: Fleet, cpu: Pool, gpu: Pool) -> None:
    svc = fleet.svc
    unknown = "sha256:" + "ef" * 32
    ids = {
        "cpu-pinned": submit(svc, spec("cpu-pinned", paced=True, replicas=2, image=cpu.images[1])),
        "gpu-pinned": submit(svc, spec("gpu-pinned", paced=True, image=gpu.images[0])),
        "any-one": submit(svc, spec("any-one", paced=False)),
        "any-two": submit(svc, spec("any-two", paced=False, replicas=2)),
        "no-pool-image": submit(svc, spec("no-pool-image", paced=False, image=unknown)),
        "too-many-devices": submit(
            svc, spec("too-many-devices", paced=False, replicas=2, image=gpu.images[0])
        ),
    }
    # Before any pod exists, the triggers count what each pool could claim: this is what
    # activates a pool from zero.
    runs, _, samples = fleet.until("a consistent scrape", lambda r, w, s: s is not None)
    assert samples is not None
    assert evaluate(cpu.query, samples) == 3  # cpu-pinned, any-one, any-two
    assert evaluate(gpu.query, samples) == 2  # gpu-pinned, any-one
    allowed = {run_id: counting(fleet.pools, runs[run_id]) for run_id in ids.values()}
    assert allowed[ids["no-pool-image"]] == allowed[ids["too-many-devices"]] == set()

    for name in ("cpu-0", "cpu-1", "gpu-0"):
        fleet.start(name)
    released = _scale_down_mid_epoch(fleet, [ids["cpu-pinned"], ids["gpu-pinned"]])
    (cpu_gone,) = [n for n, (rid, _) in released.items() if rid == ids["cpu-pinned"]]

    # The gpu pool is empty now: its trigger counts the released run, the cpu pool's does not.
    gpu_run = ids["gpu-pinned"]
    fleet.until(
        "the released gpu run to be counted by the gpu trigger alone",
        lambda r, w, s: (
            s is not None and r[gpu_run]["status"] == "queued" and evaluate(gpu.query, s) >= 1
        ),
    )
    fleet.start("gpu-0")  # the scaler brings the pod back, with its volume
    trained = [ids[k] for k in ("cpu-pinned", "gpu-pinned", "any-one", "any-two")]
    runs, workers, _ = fleet.until(
        "every claimable run to finish",
        lambda r, w, s: all(r[i]["status"] not in ("queued", "running") for i in trained),
        timeout=420,
    )
    by_name = {w["name"]: w["id"] for w in workers.values()}
    for run_id in trained:
        run = svc.client.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] == "succeeded", run["error"]
        assert run["attempt"] == 1, run  # a release is not an attempt; no lease ran out
        pool_names = {h.split("-")[0] for h in fleet.holders[run_id]}
        assert pool_names and pool_names <= allowed[run_id], (run_id, fleet.holders[run_id])
        trained_on = fleet.pools[workers[run["worker_id"]]["name"].split("-")[0]]
        assert run["provenance"]["image"]["id"] == trained_on.images[0]
        assert run["provenance"]["image"]["digest"] == trained_on.images[1]
        if run_id not in {rid for rid, _ in released.values()}:
            assert run["resumed_from_step"] is None, run  # never interrupted: one training
    for name, (run_id, at) in released.items():
        run = svc.client.get(f"/api/v1/runs/{run_id}").json()
        # Resumed from the checkpoint the scale-down left, not from scratch nor from older.
        assert run["resumed_from_step"] == at["checkpoint_step"], (name, at, run)
        assert run["result_summary"]["resumed_from_epoch"] == at["checkpoint_epoch"]
    cpu_run = svc.client.get(f"/api/v1/runs/{ids['cpu-pinned']}").json()
    assert cpu_run["worker_id"] != by_name[cpu_gone]  # resumed elsewhere in its pool
    assert svc.client.get(f"/api/v1/runs/{gpu_run}").json()["worker_id"] == by_name["gpu-0"]
    for key in ("no-pool-image", "too-many-devices"):  # counted by no pool, claimed by none
        run = svc.client.get(f"/api/v1/runs/{ids[key]}").json()
        assert run["status"] == "queued" and run["attempt"] == 0 and not fleet.holders[ids[key]]
        if key == "no-pool-image":
            assert f"no live worker advertises image {unknown}" in run["waiting_reason"]
        else:  # the image on one pool, the devices on another: no one worker has both
            assert "no live worker offers all it needs at once" in run["waiting_reason"]
        assert svc.client.post(f"/api/v1/runs/{ids[key]}/cancel").status_code == 200
    _reruns_are_pinned(fleet, trained)
    expiries = [v for n, _, v in fleet.scrape() if n == "reprotrain_lease_expiries_total"]
    assert expiries == [0.0]
    assert fleet.consistent >= 10, "too few consistent scrapes to have checked the triggers"


def _scale_down_mid_epoch(fleet: Fleet, targets: list[int]) -> dict[str, tuple[int, Any]]:
    """SIGTERM the agent holding each target run while it is mid-epoch in its first epoch
    (so not the last), wait for each to exit, and note the checkpoint each run was given
    back with (agent name -> (run id, run as released))."""
    signalled: dict[str, int] = {}
    released: dict[str, tuple[int, Any]] = {}

    def step(runs: Runs, workers: Workers, samples: Samples | None) -> bool:
        for run_id in targets:
            run, progress = runs[run_id], runs[run_id]["progress"] or {}
            if run_id in signalled.values() or run["status"] != "running":
                continue
            if progress.get("event") == "step" and progress.get("epoch") == 1:
                fleet.sigterm(name := workers[run["worker_id"]]["name"])
                signalled[name] = run_id
        for name, run_id in signalled.items():
            agent = fleet.agents[name]
            if name not in released and agent.proc.poll() is not None:
                assert agent.proc.returncode == 0, agent.log.read_text()[-3000:]
                at = fleet.svc.client.get(f"/api/v1/runs/{run_id}").json()
                released[name] = (run_id, at)
        return len(released) == len(targets)

    fleet.until("both pods to be scaled down mid-epoch", step, timeout=300)
    for name, (_, at) in released.items():
        log = fleet.agents[name].log.read_text()
        assert at["status"] != "succeeded", (name, at["status"], log[-3000:])
        # A step checkpoint where the SIGTERM found the job (the epoch's own checkpoint if it
        # landed while an epoch ended; on a loaded machine the job may be past epoch 1 by
        # then): never the run's end. The epochs before it left their checkpoints.
        step = at["checkpoint_step"]
        assert step is not None and 1 <= step < 20 * EPOCHS, (name, at)
        assert at["checkpoint_epoch"] == (step // 20 or None), (name, at)
    return released


def _reruns_are_pinned(fleet: Fleet, trained: list[int]) -> None:
    """Reruns pin the image their run trained on; a pool scaled to zero is asked for by its
    trigger alone, and its reruns wait for it while the other pool idles."""
    svc = fleet.svc
    fleet.sigterm("gpu-0")  # idle: the gpu pool scales to zero
    fleet.agents["gpu-0"].proc.wait(timeout=120)
    assert fleet.agents["gpu-0"].proc.returncode == 0
    pinned: dict[int, Pool] = {}
    originals = {i: svc.client.get(f"/api/v1/runs/{i}").json() for i in trained}
    # The gpu pool's reruns first: oldest first, an unpinned claim would take them.
    gpu_id = fleet.pools["gpu"].images[0]
    order = sorted(trained, key=lambda i: originals[i]["provenance"]["image"]["id"] != gpu_id)
    for run_id in order:
        # Every simulated pod is this CPU machine, whose class its runs record and no real GPU
        # pool would take: the reruns are pinned by image alone (test_hardware_classes and
        # test_pool_scaling_metrics pin them by class).
        got = svc.client.post(f"/api/v1/runs/{run_id}/rerun", params={"hardware": "any"})
        assert got.status_code == 202, got.text
        image = originals[run_id]["provenance"]["image"]["id"]
        assert got.json()["required_image"] == image
        (pool,) = [p for p in fleet.pools.values() if p.images[0] == image]
        pinned[got.json()["id"]] = pool
    on_gpu = [i for i, p in pinned.items() if p.name == "gpu"]
    on_cpu = [i for i, p in pinned.items() if p.name == "cpu"]
    assert on_gpu and on_cpu

    def cpu_done_gpu_waiting(runs: Runs, workers: Workers, samples: Samples | None) -> bool:
        if samples is None or any(runs[i]["status"] != "succeeded" for i in on_cpu):
            return False
        assert all(runs[i]["status"] == "queued" for i in on_gpu), [runs[i] for i in on_gpu]
        assert evaluate(fleet.pools["gpu"].query, samples) == len(on_gpu)
        assert evaluate(fleet.pools["cpu"].query, samples) == 0  # the idle pool asks for none
        return True

    fleet.until("the cpu pool's reruns", cpu_done_gpu_waiting, timeout=300)
    time.sleep(3)  # an idle cpu agent keeps claiming: it must still not take a gpu rerun
    runs, _, _ = fleet.observe()
    assert all(runs[i]["status"] == "queued" for i in on_gpu)
    fleet.start("gpu-0")  # activated from zero by its trigger
    fleet.until(
        "the gpu pool's reruns",
        lambda r, w, s: all(r[i]["status"] not in ("queued", "running") for i in on_gpu),
        timeout=300,
    )
    for rerun_id, pool in pinned.items():
        run = svc.client.get(f"/api/v1/runs/{rerun_id}").json()
        assert run["status"] == "succeeded", run["error"]
        assert run["verdict"] == "identical", run["verdict_report"]
        assert {h.split("-")[0] for h in fleet.holders[rerun_id]} == {pool.name}
        assert run["provenance"]["image"]["id"] == run["required_image"] == pool.images[0]
