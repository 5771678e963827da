"""Each worker pool's KEDA trigger, as the Kubernetes overlays render it, counts exactly the
runs that pool's workers can claim: its query is evaluated against a real `/metrics` scrape
after runs of several requirements were queued, and compared with what workers advertising
the pool's image (as its pods are told it) and devices then actually claim."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from service.app import create_app
from service.auth.tokens import create_token
from service.config import Settings
from service.persistence.migrate import upgrade
from service.persistence.models import Run
from tests.integration.jobs import REPO
from tests.kustomize import OVERLAYS, rendered_pool
from tests.unit.test_deploy_scaling import pool_value
from worker.node.executors.process import told_images

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
Samples = list[tuple[str, dict[str, str], float]]

H100 = "gpu:nvidia-h100-80gb-hbm3:sm132:80gb:full:drv555"
XEON = "cpu:genuineintel:intel-r-xeon-r-platinum-8480:avx512-core-amx"


def evaluate(query: str, samples: Samples) -> float:
    """The one number Prometheus gives `query` over one scrape (of one API replica)."""
    value = pool_value(query, samples)
    assert value is not None, f"no answer to {query}"
    return value


def pools() -> dict[str, dict[str, Any]]:
    """Per overlay: the trigger's query and what its workers advertise and offer."""
    found = {}
    for name in ("cpu", "gpu"):
        pool = rendered_pool(OVERLAYS / name)
        env, worker = pool.env, pool.worker
        gpus = int(worker.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        cpu = [int(a.split("=")[1]) for a in worker["args"] if a.startswith("--cpu-replicas=")]
        found[name] = {
            "query": pool.query,
            "images": told_images(env),
            "devices": {"gpus": gpus} if gpus else {"cpu_devices": cpu[0]},
            "pool": env["REPRO_WORKER_POOL"],
            "hardware_class": H100 if gpus else XEON,  # what its nodes would advertise
        }
    return found


async def scrape(client: httpx.AsyncClient) -> Samples:
    got = await client.get("/metrics")
    assert got.status_code == 200, got.text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(got.text)
        for s in family.samples
    ]


def test_each_pool_trigger_counts_what_the_pool_can_claim(tmp_path: Path) -> None:
    found = pools()
    cpu_id, cpu_digest = found["cpu"]["images"]
    gpu_id, gpu_digest = found["gpu"]["images"]
    unknown = "sha256:" + "ef" * 32
    # (required image, replicas, needs code, required hardware) of each queued run, oldest
    # first.
    runs = [
        (None, 1, False, None),  # either pool
        (gpu_id, 1, False, None),  # the GPU pool, by image ID
        (gpu_digest, 1, False, None),  # the GPU pool, by registry digest
        (cpu_id, 2, False, None),  # the CPU pool (two devices)
        (unknown, 1, False, None),  # no pool runs that image
        (None, 4, False, None),  # more devices than any pod offers
        (None, 1, True, None),  # a code bundle: process workers without --trust-code refuse it
        (gpu_id, 2, False, None),  # two devices on one-GPU pods
        (cpu_digest, 1, False, None),  # the CPU pool, by registry digest
        (None, 1, False, "gpu"),  # any GPU: the GPU pool only, never the CPU pool
    ]
    settings = Settings(data_dir=tmp_path / "data", lease_seconds=300)
    upgrade(settings.resolved_database_url)
    app = create_app(settings)
    with app.state.sessionmaker() as db:
        secrets = {r: create_token(db=db, name=r, role=r)[1] for r in ("admin", "worker")}

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        admin, worker = (
            httpx.AsyncClient(
                transport=transport,
                base_url="http://api",
                headers={"Authorization": f"Bearer {secrets[role]}"},
            )
            for role in ("admin", "worker")
        )
        ids = []
        for i, (image, replicas, code, needs) in enumerate(runs):
            spec = SEED001.replace("seed: 42", f"seed: {100 + i}")
            got = await admin.post(
                "/api/v1/experiments", content=spec, headers={"content-type": "application/yaml"}
            )
            assert got.status_code == 201, got.text
            ids.append(got.json()["run"]["id"])
            with app.state.sessionmaker() as db:
                db.execute(
                    update(Run)
                    .where(Run.id == ids[-1])
                    .values(
                        required_image=image,
                        replicas=replicas,
                        needs_code=code,
                        required_hardware=needs,
                    )
                )
                db.commit()
        samples = await scrape(admin)
        assert evaluate(found["gpu"]["query"], samples) == 4  # runs 1, 2, 3, 10
        assert evaluate(found["cpu"]["query"], samples) == 3  # runs 1, 4, 9

        workers = {}
        for name, pool in found.items():
            body = {
                "name": f"{name}-0",
                "images": pool["images"],
                **pool["devices"],
                "pool": pool["pool"],
                "hardware_class": pool["hardware_class"],
            }
            got = await worker.post("/api/v1/workers/register", json=body)
            assert got.status_code == 201, got.text
            workers[name] = got.json()["id"]
        # The GPU pod claims the oldest run either pool could take: now it counts as held by
        # the GPU pool, and the CPU pool no longer counts it.
        first = await worker.post(f"/api/v1/workers/{workers['gpu']}/claim")
        assert first.json()["run"]["id"] == ids[0]
        samples = await scrape(admin)
        assert evaluate(found["gpu"]["query"], samples) == 4
        assert evaluate(found["cpu"]["query"], samples) == 2

        claimed: dict[str, list[int]] = {"gpu": [ids[0]], "cpu": []}
        for name in ("cpu", "gpu"):
            path = f"/api/v1/workers/{workers[name]}/claim"
            while (got := await worker.post(path)).status_code == 200:
                claimed[name].append(got.json()["run"]["id"])
        assert sorted(claimed["gpu"]) == [ids[0], ids[1], ids[2], ids[9]]
        assert sorted(claimed["cpu"]) == [ids[3], ids[8]]
        samples = await scrape(admin)
        for name in ("cpu", "gpu"):  # what each pool holds keeps its pods
            assert evaluate(found[name]["query"], samples) == len(claimed[name])
        queued = sum(v for n, _, v in samples if n == "reprotrain_queued_runs")
        assert queued == 4  # the runs no pool can claim: counted, scaling no pool
        await admin.aclose()
        await worker.aclose()

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()
