"""The node's dataset cache against a real `repro serve` process: a dataset is downloaded
once for the jobs that use it, a damaged cache entry is discarded and fetched again, and a
worker token reads only the datasets of runs it holds."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.service_procs import Service
from tests.integration.test_datasets_api import digits_like, push, sha256, spec_using
from worker.node.client import ApiClient, ApiError
from worker.node.dataset_cache import DatasetCache, DatasetCacheError


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path / "data", extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def _submit(service: Service, digest: str) -> int:
    answer = service.submit(spec_using(digest), content_type="application/json")
    assert answer.status_code == 201, answer.text
    return int(answer.json()["run"]["id"])


def _worker(service: Service, name: str) -> tuple[ApiClient, int]:
    client = ApiClient(service.url, service.token("worker", name), retries=0)
    info = client.register(name, executors=["process"], images=[], gpu=None, hostname="test")
    return client, int(info["id"])


def test_two_jobs_download_once_and_a_damaged_entry_is_fetched_again(
    service: Service, tmp_path: Path
) -> None:
    body = digits_like(n=64)
    digest = sha256(body)
    assert push(service.client, body).status_code == 201
    runs = {_submit(service, digest), _submit(service, digest)}
    client, worker_id = _worker(service, "cache-node")
    with client:
        claimed = {client.claim(worker_id)["run"]["id"] for _ in runs}  # type: ignore[index]
        assert claimed == runs  # this worker now holds both runs that use the dataset

        cache = DatasetCache(tmp_path / "work" / "datasets", client)
        first = cache.fetch(digest)  # the first job
        second = cache.fetch(digest)  # the second job: verified, not downloaded again
        assert first == second == cache.path(digest)
        assert cache.downloads == 1
        assert first.read_bytes() == body
        assert stat.S_IMODE(first.stat().st_mode) == 0o444  # jobs cannot alter it
        assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no temp

        # One flipped byte on disk: found before use, discarded, fetched again.
        os.chmod(first, 0o644)
        damaged = bytearray(first.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        first.write_bytes(bytes(damaged))
        again = cache.fetch(digest)
        assert cache.downloads == 2
        assert again.read_bytes() == body

        # A truncated entry (a disk that filled up, say) too.
        os.chmod(again, 0o644)
        with open(again, "r+b") as fh:
            fh.truncate(100)
        assert cache.fetch(digest).read_bytes() == body
        assert cache.downloads == 3

        with pytest.raises(DatasetCacheError):
            cache.path("sha256:../../etc/passwd")


def test_a_worker_reads_only_datasets_of_runs_it_holds(service: Service, tmp_path: Path) -> None:
    held, other = digits_like(seed=1), digits_like(seed=2)
    for body in (held, other):
        assert push(service.client, body).status_code == 201
    _submit(service, sha256(held))
    client, worker_id = _worker(service, "holder")
    with client:
        cache = DatasetCache(tmp_path / "datasets", client)
        with pytest.raises(ApiError) as before:  # nothing held yet
            cache.fetch(sha256(held))
        assert before.value.status_code == 403
        assert client.claim(worker_id) is not None
        assert cache.fetch(sha256(held)).read_bytes() == held
        with pytest.raises(ApiError) as refused:  # pushed, but no held run uses it
            cache.fetch(sha256(other))
        assert refused.value.status_code == 403
        assert not cache.path(sha256(other)).exists()
        assert cache.downloads == 1
