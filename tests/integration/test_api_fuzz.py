"""Schemathesis against the service's own OpenAPI schema, on a real `repro serve` process.

Generated requests, valid and invalid, go to every operation with an admin token and to the
worker protocol with a worker token too; none may get a 5xx or an answer the schema does not
document (status code, content type, headers, body). Without a token every operation but the
health checks answers 401.

The cases come from `APIOperation.as_strategy()` under Hypothesis' own `@given`, one bounded
run per operation and generation mode, so the number of requests is known.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.service_procs import Service

REPO = Path(__file__).resolve().parents[2]
HEALTH = {"/healthz", "/readyz"}
EVENTS = "/api/v1/runs/{run_id}/events"
WORKER_TAG = "workers"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,  # an invalid request gets a 4xx, not a 2xx
]
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 15}
MIN_REQUESTS = 1000
SENT: Counter[str] = Counter()  # generated requests sent, by token


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # Probes send invalid tokens on purpose; the failure limiter has its own tests.
    env = {"REPRO_AUTH_FAILURES_ALLOWED": "1000000"}
    service = Service(tmp_path_factory.mktemp("fuzz") / "data", env=env, extra=("--no-demo",))
    try:
        service.wait_ready()
        # Something for the ids to find: an experiment, its run and a rerun.
        submitted = service.submit((REPO / "examples" / "seed001.yaml").read_text())
        assert submitted.status_code == 201, submitted.text
        rerun = service.client.post(f"/api/v1/runs/{submitted.json()['run']['id']}/rerun")
        assert rerun.status_code == 202, rerun.text
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def worker_token(service: Service) -> str:
    """A worker token with one registered worker, so worker ids can be its own."""
    token = service.token("worker", "fuzz-worker")
    registered = httpx.post(
        f"{service.url}/api/v1/workers/register",
        json={"name": "fuzz-worker"},
        headers=_bearer(token),
    )
    assert registered.status_code == 201, registered.text
    return token


# Refusing a body over the size limit (413) is refusing invalid data too.
CONFIG = {
    "checks": {
        "negative_data_rejection": {
            "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
        }
    }
}


@pytest.fixture(scope="module")
def api_schema(service: Service) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(CONFIG)
    return schemathesis.openapi.from_url(f"{service.url}/openapi.json", config=config)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _token_id(token: str) -> int:
    return int(token.split("_")[1])  # rpt_<id>_<secret>


def _spares(tokens: list[str]) -> Callable[[schemathesis.Case], bool]:
    """A filter keeping the fuzzer from revoking the tokens it sends."""
    ids = {_token_id(t) for t in tokens}

    def spares(case: schemathesis.Case) -> bool:
        return (case.path_parameters or {}).get("token_id") not in ids

    return spares


def _operations(api_schema: schemathesis.BaseSchema) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, definition) of every operation the schema documents."""
    return [
        (method.upper(), path, operation)
        for path, methods in api_schema.raw_schema["paths"].items()
        for method, operation in methods.items()
    ]


def _has_inputs(definition: dict[str, Any]) -> bool:
    return bool(definition.get("parameters") or definition.get("requestBody"))


def _fuzz(
    subtests: pytest.Subtests,
    api_schema: schemathesis.BaseSchema,
    operations: list[tuple[str, str, dict[str, Any]]],
    token: str,
    label: str,
    spare: list[str],
) -> None:
    """A bounded Hypothesis run per operation and mode, every answer checked."""
    for method, path, definition in operations:
        operation = api_schema[path][method]
        for mode, examples in EXAMPLES.items():
            if mode is GenerationMode.NEGATIVE and not _has_inputs(definition):
                continue  # nothing to make invalid

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,  # no .hypothesis/ directory in the checkout
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            )
            @given(case=operation.as_strategy(generation_mode=mode).filter(_spares(spare)))
            def check(case: schemathesis.Case) -> None:
                SENT[label] += 1
                case.call_and_validate(headers=_bearer(token), checks=CHECKS, timeout=30)

            with subtests.test(f"{label} {method} {path} {mode.value}"):
                check()


def test_admin_gets_no_server_errors_and_only_documented_answers(
    subtests: pytest.Subtests,
    api_schema: schemathesis.BaseSchema,
    service: Service,
    worker_token: str,
) -> None:
    # The event stream of a live run never ends; it is fuzzed once no run is live.
    operations = [op for op in _operations(api_schema) if op[1] != EVENTS]
    tokens = [service.admin_token, worker_token]
    _fuzz(subtests, api_schema, operations, service.admin_token, "admin", spare=tokens)


def test_worker_gets_no_server_errors_and_only_documented_answers(
    subtests: pytest.Subtests, api_schema: schemathesis.BaseSchema, worker_token: str
) -> None:
    operations = [op for op in _operations(api_schema) if WORKER_TAG in op[2].get("tags", [])]
    assert len(operations) == 8, operations
    _fuzz(subtests, api_schema, operations, worker_token, "worker", spare=[])


def test_event_streams_get_no_server_errors_and_only_documented_answers(
    subtests: pytest.Subtests, api_schema: schemathesis.BaseSchema, service: Service
) -> None:
    for status in ("queued", "running"):  # so every stream ends after its first event
        live = service.client.get("/api/v1/runs", params={"status": status, "limit": 500})
        for run in live.json()["items"]:
            assert service.client.post(f"/api/v1/runs/{run['id']}/cancel").status_code == 200
    operations = [op for op in _operations(api_schema) if op[1] == EVENTS]
    _fuzz(subtests, api_schema, operations, service.admin_token, "events", spare=[])


def test_without_a_token_only_the_health_checks_answer(
    api_schema: schemathesis.BaseSchema, service: Service
) -> None:
    with httpx.Client(base_url=service.url, timeout=30) as client:
        for method, path, _ in _operations(api_schema):
            answer = client.request(method, re.sub(r"{\w+}", "1", path))
            expected = 200 if path in HEALTH else 401
            assert answer.status_code == expected, (method, path, answer.text)
            if expected == 401:
                assert answer.headers["WWW-Authenticate"] == "Bearer"
                assert isinstance(answer.json()["detail"], str)


def test_enough_generated_requests_were_sent() -> None:
    assert sum(SENT.values()) >= MIN_REQUESTS, SENT
    print(f"generated requests: {dict(SENT)}, {time.process_time():.0f} s CPU")
