"""The Python client against a real local HTTP server that answers 429 and 503 with
Retry-After: bounded retries that honour it, only where repeating cannot act twice, and
errors that carry the API's status, reason and field errors."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reprotrain import ApiError, Client, SpecFileError, Unreachable
from tests.ports import free_port

RUN = {"id": 7, "experiment_id": 3, "status": "succeeded", "attempt": 1}
SUBMITTED = {
    "experiment": {"id": 3, "name": "x", "spec_hash": "sha256:ab", "seed": [1, 2]},
    "run": {**RUN, "status": "queued"},
    "warnings": ["rows held out"],
}


@dataclass
class Script:
    """The answers to give, in order (status, headers, body); the last one repeats."""

    answers: list[tuple[int, dict[str, str], Any]]
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    delay: float = 0.0

    def next(self) -> tuple[int, dict[str, str], Any]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            script.seen.append((self.command, self.path, dict(self.headers), body))
            time.sleep(script.delay)
            status, headers, payload = script.next()
            data = json.dumps(payload).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[Script, str]]:
    script = Script([(200, {}, RUN)])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield script, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _client(url: str, **kwargs: Any) -> Client:
    return Client(url, "secret", backoff=0.01, **kwargs)


def test_a_read_waits_what_retry_after_asks_then_succeeds(server: tuple[Script, str]) -> None:
    script, url = server
    script.answers[:0] = [(429, {"Retry-After": "1"}, {"detail": "slow down"})]
    started = time.monotonic()
    with _client(url) as c:
        run = c.run(7)
    assert run.id == 7 and run.status == "succeeded" and run.finished
    assert len(script.seen) == 2 and time.monotonic() - started >= 0.9
    assert script.seen[0][2]["Authorization"] == "Bearer secret"


def test_an_http_date_retry_after_is_honoured_too(server: tuple[Script, str]) -> None:
    script, url = server
    when = formatdate(time.time() + 1, usegmt=True)
    script.answers[:0] = [(503, {"Retry-After": when}, {"detail": "not ready"})]
    with _client(url) as c:
        assert c.run(7).id == 7
    assert len(script.seen) == 2


def test_retries_are_bounded_and_the_last_answer_is_raised(server: tuple[Script, str]) -> None:
    script, url = server
    script.answers[:] = [(503, {"Retry-After": "0"}, {"detail": "overloaded"})]
    with _client(url, retries=2) as c, pytest.raises(ApiError) as caught:
        c.run(7)
    assert len(script.seen) == 3
    assert caught.value.status_code == 503 and caught.value.reason == "overloaded"
    assert caught.value.retry_after == 0


def test_a_wait_longer_than_allowed_is_raised_at_once(server: tuple[Script, str]) -> None:
    script, url = server
    script.answers[:] = [(429, {"Retry-After": "120"}, {"detail": "retry in 120 s"})]
    with _client(url, max_retry_wait=5) as c, pytest.raises(ApiError) as caught:
        c.run(7)
    assert len(script.seen) == 1
    assert caught.value.status_code == 429 and caught.value.retry_after == 120


def test_a_rerun_is_not_repeated_but_a_submit_is_with_the_same_key(
    server: tuple[Script, str], tmp_path: Path
) -> None:
    script, url = server
    script.answers[:] = [(503, {"Retry-After": "0"}, {"detail": "overloaded"})]
    with _client(url) as c, pytest.raises(ApiError):
        c.rerun(7)  # no idempotency key: the server may have queued it
    assert len(script.seen) == 1

    script.seen.clear()
    script.answers[:] = [(429, {"Retry-After": "0"}, {"detail": "busy"}), (201, {}, SUBMITTED)]
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\nseed: 1\ntraining: {learning_rate: 1e-3}\n")
    with _client(url) as c:
        run = c.submit(spec)
    keys = {seen[2]["Idempotency-Key"] for seen in script.seen}
    assert len(script.seen) == 2 and len(keys) == 1
    # Parsed here and sent as JSON, `1e-3` a float as the API reads YAML.
    assert script.seen[0][2]["Content-Type"] == "application/json"
    assert json.loads(script.seen[0][3]) == {
        "name": "x",
        "seed": 1,
        "training": {"learning_rate": 0.001},
    }
    assert run.id == 7 and run.status == "queued" and run.seed == [1, 2]
    assert run.spec_hash == "sha256:ab" and run.warnings == ["rows held out"]


def test_a_refusal_carries_the_status_reason_and_field_errors(
    server: tuple[Script, str],
) -> None:
    script, url = server
    errors = [{"loc": "dataset.batch_sise", "msg": "Extra inputs are not permitted"}]
    script.answers[:] = [(422, {}, {"detail": "invalid spec", "errors": errors})]
    with _client(url) as c, pytest.raises(ApiError) as caught:
        c.submit({"name": "x"})
    assert len(script.seen) == 1  # a refusal is not retried
    assert caught.value.status_code == 422 and caught.value.reason == "invalid spec"
    assert caught.value.errors == errors and "HTTP 422: invalid spec" in str(caught.value)


def test_a_slow_answer_times_out_and_no_answer_is_unreachable(
    server: tuple[Script, str],
) -> None:
    script, url = server
    script.delay = 2.0
    with _client(url, timeout=0.3, retries=1) as c, pytest.raises(Unreachable) as caught:
        c.run(7)
    assert caught.value.status_code is None and len(script.seen) == 2
    closed = f"http://127.0.0.1:{free_port()}"
    with _client(closed, retries=1) as c, pytest.raises(Unreachable, match="cannot reach"):
        c.run(7)


def test_a_malformed_spec_file_is_named_and_nothing_is_sent(
    server: tuple[Script, str], tmp_path: Path
) -> None:
    script, url = server
    spec = tmp_path / "broken.yaml"
    spec.write_text("name: x\ndataset: [unclosed\n")
    with _client(url) as c, pytest.raises(SpecFileError) as caught:
        c.submit(spec)
    assert str(spec) in str(caught.value) and "<byte string>" not in str(caught.value)
    assert "line 3" in str(caught.value) and script.seen == []


def test_importing_the_client_imports_no_tensorflow_and_nothing_of_the_project() -> None:
    code = (
        "import sys, json\n"
        "from reprotrain import Client\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] in ('tensorflow', 'keras', 'numpy', 'worker', 'service'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
