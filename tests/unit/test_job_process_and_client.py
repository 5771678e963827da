"""The agent's pure logic, its parent-death hook, and the API client's own transport behaviour.

The client tests use `httpx.MockTransport` only to exercise what the client itself does
(retries, error mapping, the upload digest header, download verification); they say nothing
about the server. The agent against the real API is tested end to end elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from worker.node.client import ApiClient, ApiError, ApiUnreachable, ArtifactCorrupt, LeaseLost
from worker.node.executors.process import job_environment
from worker.node.job_files import (
    StderrTail,
    checkpoint_downloads,
    checkpoint_uploads,
    describe_exit,
)

REPO = Path(__file__).resolve().parents[2]

# -- agent: pure logic ------------------------------------------------------------------------


def test_checkpoint_event_uploads_npz_before_json(tmp_path: Path) -> None:
    epoch, first, last = checkpoint_uploads(
        tmp_path, {"event": "checkpoint", "epoch": 2, "path": "epoch-000002.json"}
    )
    assert (epoch, first, last) == (
        2,
        tmp_path / "epoch-000002.npz",
        tmp_path / "epoch-000002.json",
    )


@pytest.mark.parametrize(
    "event",
    [
        {"event": "checkpoint", "epoch": 2, "path": "../epoch-000002.json"},
        {"event": "checkpoint", "epoch": 3, "path": "epoch-000002.json"},
        {"event": "checkpoint", "epoch": 2, "path": "epoch-000002.npz"},
        {"event": "checkpoint", "epoch": 2},
    ],
)
def test_checkpoint_event_from_elsewhere_is_refused(
    tmp_path: Path, event: dict[str, object]
) -> None:
    with pytest.raises(ValueError):
        checkpoint_uploads(tmp_path, event)


def test_offered_checkpoint_downloads_json_last() -> None:
    json_file = {"name": "epoch-000004.json", "artifact_id": "a", "sha256": "0" * 64}
    npz_file = {"name": "epoch-000004.npz", "artifact_id": "b", "sha256": "1" * 64}
    assert checkpoint_downloads([json_file, npz_file]) == [npz_file, json_file]


@pytest.mark.parametrize(
    "names",
    [
        ["epoch-000004.npz", "../../etc/epoch-000004.json"],
        ["epoch-000004.npz", "epoch-000005.json"],
        ["epoch-000004.json"],
        ["epoch-000004.npz", "epoch-000004.json", "epoch-000004.json"],
        ["epoch-000004.npz", "epoch-000004.json", "model.h5"],
    ],
)
def test_offered_checkpoint_with_odd_files_is_refused(names: list[str]) -> None:
    with pytest.raises(ValueError):
        checkpoint_downloads([{"name": n, "artifact_id": n, "sha256": ""} for n in names])


def test_stderr_tail_keeps_the_last_lines_cut_to_width() -> None:
    tail = StderrTail(lines=3, width=5)
    for line in ["one", "two", "three", "four", "a much longer line"]:
        tail.add(line)
    assert tail.text() == "three\nfour\na muc…"


def test_exit_codes_read_as_codes_or_signals() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL"


def test_job_environment_drops_the_reexec_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_JOB_REEXEC", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    env = job_environment()
    assert "REPRO_JOB_REEXEC" not in env
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"  # an operator's choice wins over the default


# -- agent: a killed agent leaves no orphan job ------------------------------------------------

_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from worker.node.executors.process import pdeathsig_preexec
    hook = pdeathsig_preexec() if sys.argv[1] == "hook" else None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             preexec_fn=hook)
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead; only its reaping is left to init


@contextlib.contextmanager
def _orphan_after_parent_killed(mode: str) -> Iterator[int]:
    """The pid of a child whose parent was just SIGKILLed (the child is killed afterwards)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        [sys.executable, "-c", _PARENT, mode], stdout=subprocess.PIPE, text=True, env=env
    ) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
    try:
        yield child
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_child_with_pdeathsig_dies_with_its_parent() -> None:
    with _orphan_after_parent_killed("hook") as child:
        assert _wait_for(lambda: not _alive(child), 5.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_child_without_pdeathsig_outlives_its_parent() -> None:
    """The control: without the hook the orphan lives on, so the test above means something."""
    with _orphan_after_parent_killed("none") as child:
        time.sleep(0.5)
        assert _alive(child)


# -- client: transport behaviour against httpx.MockTransport ----------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


def _client(handler: Handler) -> ApiClient:
    return ApiClient(
        "http://api.test", "tok", transport=httpx.MockTransport(handler), retries=2, backoff=0
    )


def test_connection_errors_are_retried_then_reported() -> None:
    calls: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) < 3:
            raise httpx.ConnectError("refused", request=request)
        assert request.headers["Authorization"] == "Bearer tok"
        return httpx.Response(200, json={"id": "r1", "status": "queued"})

    assert _client(flaky).run("r1")["id"] == "r1"
    assert len(calls) == 3

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ApiUnreachable):
        _client(down).claim("w1")


def test_a_post_that_may_have_arrived_is_not_repeated() -> None:
    calls: list[str] = []

    def timeout(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ReadTimeout("no answer", request=request)

    with pytest.raises(ApiUnreachable):
        _client(timeout).complete("r1", "w1", {"status": "succeeded"})
    assert calls == ["/api/v1/runs/r1/complete"]


def test_errors_map_to_api_error_and_409_on_a_lease_to_lease_lost() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/missing"):
            return httpx.Response(404, json={"detail": "run not found"})
        return httpx.Response(409, json={"detail": "not held"})

    client = _client(answer)
    with pytest.raises(ApiError) as missing:
        client.run("missing")
    assert (missing.value.status_code, missing.value.detail) == (404, "run not found")
    with pytest.raises(LeaseLost):
        client.heartbeat("r1", "w1", {"event": "step"})
    with pytest.raises(LeaseLost):
        client.release("r1", "w1", "bye")
    with pytest.raises(LeaseLost):
        client.upload_artifact("r1", "w1", Path(__file__), kind="k", name="n", epoch=1)
    with pytest.raises(ApiError) as cancel:  # a conflict outside the worker protocol
        client.cancel("r1")
    assert type(cancel.value) is ApiError and cancel.value.status_code == 409


def test_upload_streams_the_file_with_its_sha256(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)  # more than one read block
    path = tmp_path / "epoch-000001.npz"
    path.write_bytes(data)
    seen: list[httpx.Request] = []

    def store(request: httpx.Request) -> httpx.Response:
        if not seen:  # the first attempt never connects: the retry must resend everything
            seen.append(request)
            raise httpx.ConnectError("refused", request=request)
        body = request.read()
        seen.append(request)
        digest = hashlib.sha256(body).hexdigest()
        return httpx.Response(201, json={"id": "a1", "sha256": digest, "size": len(body)})

    answer = _client(store).upload_artifact(
        "r1", "w1", path, kind="checkpoint", name=path.name, epoch=1
    )
    request = seen[-1]
    assert request.headers["X-Content-SHA256"] == hashlib.sha256(data).hexdigest()
    assert request.headers["Content-Length"] == str(len(data))
    assert request.headers["Content-Type"] == "application/octet-stream"
    assert dict(request.url.params) == {
        "worker_id": "w1",
        "kind": "checkpoint",
        "name": "epoch-000001.npz",
        "epoch": "1",
    }
    assert answer["size"] == len(data) and answer["sha256"] == hashlib.sha256(data).hexdigest()


def test_download_keeps_only_bytes_that_match_the_digest(tmp_path: Path) -> None:
    data = b"checkpoint bytes"

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=data)

    client = _client(serve)
    good = client.download_artifact(
        "a1", tmp_path / "ok.npz", sha256=hashlib.sha256(data).hexdigest()
    )
    assert good.read_bytes() == data
    with pytest.raises(ArtifactCorrupt):
        client.download_artifact("a1", tmp_path / "bad.npz", sha256="0" * 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.npz"]  # no partial file left


def test_a_long_poll_claim_reads_for_longer_than_it_asks_the_server_to_wait() -> None:
    seen: list[tuple[dict[str, str], dict[str, float | None]]] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append((dict(request.url.params), request.extensions["timeout"]))
        return httpx.Response(204)

    client = _client(api)
    assert client.claim("w1", wait=20) is None
    assert client.claim("w1") is None
    (asked, timeouts), (plain, plain_timeouts) = seen
    assert asked == {"wait": "20"} and timeouts["read"] is not None and timeouts["read"] > 20
    assert timeouts["connect"] == plain_timeouts["connect"] == 30.0
    assert plain == {} and plain_timeouts["read"] == 30.0


def test_waiting_follows_the_event_stream_and_reads_the_run_at_each_event() -> None:
    events = "".join(
        f"event: run\ndata: {json.dumps({'id': 1, 'status': s})}\n\n"
        for s in ("queued", "running", "succeeded")
    )
    statuses = iter(["queued", "running", "succeeded"])
    paths: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path.endswith("/events"):
            assert request.extensions["timeout"]["read"] is None  # no timeout: wait it out
            return httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"id": 1, "status": next(statuses)})

    updates: list[str] = []
    done = _client(api).wait(1, timeout=None, on_update=lambda run: updates.append(run["status"]))
    assert done["status"] == "succeeded" and updates == ["queued", "running", "succeeded"]
    assert paths == ["/api/v1/runs/1/events"] + ["/api/v1/runs/1"] * 3


def test_waiting_polls_when_the_server_has_no_event_stream() -> None:
    statuses = iter(["queued", "running", "failed"])

    def api(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(404, json={"detail": "no such route"})
        return httpx.Response(200, json={"id": 1, "status": next(statuses)})

    assert _client(api).wait(1, timeout=None, poll=0.01)["status"] == "failed"


def test_a_busy_server_s_retry_after_reaches_the_caller() -> None:
    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"detail": "slow down"}, headers={"Retry-After": "7"})

    with pytest.raises(ApiError) as limited:
        _client(busy).complete("r1", "w1", {"status": "succeeded"})
    assert limited.value.status_code == 429 and limited.value.retry_after == 7.0
    assert limited.value.retryable  # a report refused for now is sent again, not dropped


def test_only_answers_that_may_change_are_retryable() -> None:
    assert ApiUnreachable(None, "down").retryable
    assert all(ApiError(code, "x").retryable for code in (408, 429, 500, 502, 503, 504))
    assert not any(ApiError(code, "x").retryable for code in (400, 403, 404, 409, 422))
