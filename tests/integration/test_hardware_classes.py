"""Runs pinned to hardware classes, in a simulated fleet: workers of two GPU classes and a
CPU class speak the worker protocol over HTTP to a real `repro serve` (SQLite and
PostgreSQL), advertising their class as agents do and reporting it in provenance. A run
that needs a GPU is never claimed by the CPU worker; a run trained on class A is rerun only
on class A; a rerun sent to class B on request says so in its comparison, beside the
hardware change itself; the queue metric carries each run's requirement for the pools."""

from __future__ import annotations

from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration import test_server_verification as verification
from tests.integration.service_procs import Service
from tests.integration.test_server_verification import SEED001, ProtocolWorker, state

service = verification.service  # a real `repro serve` on SQLite, then on PostgreSQL

H100 = "gpu:nvidia-h100-80gb-hbm3:sm132:80gb:full:drv555"
A100 = "gpu:nvidia-a100-sxm4-40gb:sm108:40gb:full:drv550"
XEON = "cpu:genuineintel:intel-r-xeon-r-platinum-8480:avx512-core-amx"


class ClassedWorker(ProtocolWorker):
    """A worker of one hardware class and pool, as an agent registers and reports."""

    def __init__(self, svc: Service, name: str, hardware_class: str, pool: str) -> None:
        self.http = svc.client_for("worker", name)
        body = {"name": name, "images": [], "hardware_class": hardware_class, "pool": pool}
        answer = self.http.post("/api/v1/workers/register", json=body)
        assert answer.status_code == 201, answer.text
        self.id = answer.json()["id"]
        self.hardware_class = hardware_class

    def try_claim(self) -> int | None:
        answer = self.http.post(f"/api/v1/workers/{self.id}/claim")
        assert answer.status_code in (200, 204), answer.text
        return int(answer.json()["run"]["id"]) if answer.status_code == 200 else None

    def finish(self, run_id: int) -> None:
        """Train the run to the same weights every time, recording this worker's class."""
        trace = self.train(run_id, [state(1), state(2)])
        result = {
            "status": "succeeded",
            "trace": trace,
            "trace_granularity": "epoch",
            "final_fingerprint": trace[-1]["fingerprint"],
            "provenance": {"hardware": {"class": self.hardware_class}},
        }
        done = self.http.post(
            f"/api/v1/runs/{run_id}/complete", json={"worker_id": self.id, "result": result}
        )
        assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text


def _run(svc: Service, run_id: int) -> dict[str, Any]:
    answer = svc.client.get(f"/api/v1/runs/{run_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def _queued_by_hardware(svc: Service) -> dict[str, float]:
    text = svc.client.get("/metrics").text
    return {
        s.labels["hardware"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "reprotrain_queued_runs"
    }


def test_runs_go_only_to_the_hardware_class_they_need_and_an_override_is_reported(
    service: Service,
) -> None:
    cpu = ClassedWorker(service, "cpu-1", XEON, "reprotrain-worker-cpu")
    spec = SEED001.rstrip() + "\nenvironment:\n  hardware: GPU\n"  # written as people do
    created = service.submit(spec, **{"Idempotency-Key": "needs-a-gpu"})
    assert created.status_code == 201, created.text
    first = int(created.json()["run"]["id"])
    assert _run(service, first)["required_hardware"] == "gpu"
    assert _queued_by_hardware(service) == {"gpu": 1.0}

    # Only the CPU worker is live: it takes nothing, and the run says why it waits.
    assert cpu.try_claim() is None
    waiting = _run(service, first)["waiting_reason"]
    assert "needs hardware of class gpu and no live worker is of it" in waiting
    assert XEON in waiting

    h100 = ClassedWorker(service, "h100-1", H100, "reprotrain-worker-gpu-h100")
    a100 = ClassedWorker(service, "a100-1", A100, "reprotrain-worker-gpu-a100")
    assert h100.try_claim() == first
    h100.finish(first)

    # Its rerun needs its class: not the A100, not the CPU.
    rerun = service.client.post(f"/api/v1/runs/{first}/rerun")
    assert rerun.status_code == 202, rerun.text
    same = rerun.json()
    assert (same["required_hardware"], same["hardware_override"]) == (H100, None)
    assert a100.try_claim() is None and cpu.try_claim() is None
    assert h100.try_claim() == same["id"]
    h100.finish(same["id"])
    assert _run(service, same["id"])["verdict"] == "identical"

    # Sent to the A100 on request: claimed there only, and its comparison says so.
    refused = service.client.post(f"/api/v1/runs/{first}/rerun", params={"hardware": "tpu"})
    assert refused.status_code == 422, refused.text
    moved = service.client.post(
        f"/api/v1/runs/{first}/rerun", params={"hardware": "gpu:nvidia-a100-sxm4-40gb"}
    )
    assert moved.status_code == 202, moved.text
    other = moved.json()
    assert other["hardware_override"] == "gpu:nvidia-a100-sxm4-40gb"
    assert h100.try_claim() is None and cpu.try_claim() is None
    assert a100.try_claim() == other["id"]
    a100.finish(other["id"])
    report = service.client.get("/api/v1/compare", params={"a": first, "b": other["id"]})
    assert report.status_code == 200, report.text
    fields = {d["field"]: d for d in report.json()["provenance_diff"]}
    assert (fields["hardware.class"]["a"], fields["hardware.class"]["b"]) == (H100, A100)
    assert fields["hardware.class"]["breaks_reproducibility"] is True
    override = fields["placement.hardware_override"]
    assert (override["a"], override["b"]) == (None, "gpu:nvidia-a100-sxm4-40gb")
    assert "on request" in override["why"]

    # "any" lifts the pin: whichever worker asks first takes it, the CPU one included.
    anywhere = service.client.post(f"/api/v1/runs/{first}/rerun", params={"hardware": "any"})
    assert anywhere.json()["required_hardware"] is None
    assert cpu.try_claim() == anywhere.json()["id"]


def test_a_spec_naming_no_hardware_class_is_refused_with_the_form_of_one(
    service: Service,
) -> None:
    body = yaml.safe_load(SEED001)
    body["environment"] = {"hardware": "gpu:NVIDIA H100"}
    answer = service.client.post("/api/v1/experiments", json=body)
    assert answer.status_code == 422, answer.text
    assert "environment.hardware" in answer.text


def test_a_multi_host_run_counts_its_hosts_for_the_scaler_and_says_why_it_waits(
    service: Service,
) -> None:
    body = yaml.safe_load(SEED001)
    body["dataset"]["shards"] = 2
    body["distribution"] = {"hosts": 2}
    created = service.client.post("/api/v1/experiments", json=body)
    assert created.status_code == 201, created.text
    run = _run(service, int(created.json()["run"]["id"]))
    assert run["status"] == "queued"
    said = "trains on 2 workers at once and 0 live worker(s) can join a gang"
    assert said in run["waiting_reason"]
    assert _queued_by_hardware(service) == {"": 2.0}  # two workers' worth of demand
