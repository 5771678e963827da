"""Schemathesis against the service's own OpenAPI schema, on a real `repro serve` process.

Generated requests, valid and invalid, go to every operation with an admin token and to the
worker protocol with a worker token too; none may get a 5xx or an answer the schema does not
document (status code, content type, headers, body), and a 2xx must not come back without
the token. Without a token every operation but the health checks answers 401.

The cases come from `APIOperation.as_strategy()` under Hypothesis' own `@given` (the
schemathesis pytest plugin's lazy loader does not run under pytest 9), one bounded run per
operation and generation mode, so the number of requests sent is known.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from hashlib import sha256
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.transport.serialization import Binary

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
    ignored_auth,  # a 2xx is repeated without the token and with a wrong one: both refused
]
# Refusing a body over the size limit (413) is refusing invalid data too.
REJECTIONS = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
EXAMPLES = {GenerationMode.POSITIVE: 50, GenerationMode.NEGATIVE: 25}
MIN_REQUESTS = 1000
SENT: Counter[str] = Counter()  # generated requests sent, by token
ANSWERS: Counter[tuple[str, str, int]] = Counter()  # (token, operation, status)
HELD: list[tuple[int, int]] = []  # (run id, worker id) of every run a fuzzed claim took

Operation = tuple[str, str, dict[str, Any]]  # method, path, definition


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # The auth probes send invalid tokens on purpose; the failure limiter has its own tests.
    env = {"REPRO_AUTH_FAILURES_ALLOWED": "1000000", "REPRO_AUTH_FAILURES_PER_ADDRESS": "1000000"}
    service = Service(tmp_path_factory.mktemp("fuzz") / "data", env=env, extra=("--no-demo",))
    try:
        service.wait_ready()
        # Something for the ids to find: an experiment, its run, and reruns to claim.
        submitted = service.submit((REPO / "examples" / "seed001.yaml").read_text())
        assert submitted.status_code == 201, submitted.text
        for _ in range(10):
            rerun = service.client.post(f"/api/v1/runs/{submitted.json()['run']['id']}/rerun")
            assert rerun.status_code == 202, rerun.text
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def worker_token(service: Service) -> str:
    """A worker token with one registered worker (id 1)."""
    token = service.token("worker", "fuzz-worker")
    registered = httpx.post(
        f"{service.url}/api/v1/workers/register",
        json={"name": "fuzz-worker"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert registered.status_code == 201, registered.text
    return token


def _schema(service: Service, token: str) -> schemathesis.BaseSchema:
    """The service's own schema; schemathesis sends `token` as its declared bearer scheme."""
    config = {
        "auth": {"openapi": {"HTTPBearer": {"bearer": token}}},
        # Cases carry this token, never a generated one (the auth probes try those).
        "generation": {"with-security-parameters": False},
        "checks": {"negative_data_rejection": {"expected-statuses": REJECTIONS}},
    }
    url = f"{service.url}/openapi.json"
    return schemathesis.openapi.from_url(url, config=schemathesis.Config.from_dict(config))


@pytest.fixture(scope="module")
def admin_schema(service: Service) -> schemathesis.BaseSchema:
    return _schema(service, service.admin_token)


@pytest.fixture(scope="module")
def worker_schema(service: Service, worker_token: str) -> schemathesis.BaseSchema:
    return _schema(service, worker_token)


def _operations(schema: schemathesis.BaseSchema) -> list[Operation]:
    return [
        (method.upper(), path, definition)
        for path, methods in schema.raw_schema["paths"].items()
        for method, definition in methods.items()
    ]


def _sparing(tokens: list[str]) -> Callable[[schemathesis.Case], bool]:
    """A filter keeping the fuzzer from revoking the tokens it sends."""
    ids = {int(token.split("_")[1]) for token in tokens}  # rpt_<id>_<secret>
    return lambda case: (case.path_parameters or {}).get("token_id") not in ids


def _aim_at_existing(case: schemathesis.Case, data: st.DataObject) -> None:
    """Point about half of the ids of a valid case at what exists, to get past the 404.

    The ids stay valid: experiment 1, runs and workers 1 to 4 exist from the start, and a
    report or upload may name a run a fuzzed claim gave to a worker, with that worker. An
    upload gets the digest of its body about half the time, so it can be stored.
    """
    for where in (case.path_parameters, case.query, case.body):
        if not isinstance(where, dict):
            continue
        for name in where:
            if name.endswith("_id") and name != "token_id" and data.draw(st.booleans()):
                where[name] = data.draw(st.integers(min_value=1, max_value=4))
    reports = "run_id" in case.path_parameters and case.operation.tags == [WORKER_TAG]
    if reports and HELD and data.draw(st.booleans()):
        run_id, worker_id = data.draw(st.sampled_from(HELD))
        case.path_parameters["run_id"] = run_id
        for where in (case.query, case.body):
            if isinstance(where, dict) and "worker_id" in where:
                where["worker_id"] = worker_id
    if isinstance(case.body, Binary) and data.draw(st.booleans()):
        digest = sha256(case.body.data).hexdigest()
        case.headers = {**(case.headers or {}), "X-Content-SHA256": digest}


def _checker(
    operation: schemathesis.APIOperation, mode: GenerationMode, label: str, spare: list[str]
) -> Callable[[], None]:
    """A Hypothesis test sending generated cases of one operation, checking every answer."""

    @given(
        case=operation.as_strategy(generation_mode=mode).filter(_sparing(spare)),
        data=st.data(),
    )
    def check(case: schemathesis.Case, data: st.DataObject) -> None:
        if mode is GenerationMode.POSITIVE:
            _aim_at_existing(case, data)
        SENT[label] += 1
        answer = case.call_and_validate(checks=CHECKS, timeout=30)
        ANSWERS[label, operation.label, answer.status_code] += 1
        if operation.path.endswith("/claim") and answer.status_code == 200:
            HELD.append((answer.json()["run"]["id"], case.path_parameters["worker_id"]))

    return check


def _fuzz(
    subtests: pytest.Subtests,
    schema: schemathesis.BaseSchema,
    operations: list[Operation],
    label: str,
    spare: list[str],
) -> None:
    """A bounded Hypothesis run per operation and generation mode."""
    for method, path, definition in operations:
        for mode, examples in EXAMPLES.items():
            inputs = definition.get("parameters") or definition.get("requestBody")
            if mode is GenerationMode.NEGATIVE and not inputs:
                continue  # nothing to make invalid
            with subtests.test(f"{label} {method} {path} {mode.value}"):
                check = _checker(schema[path][method], mode, label, spare)
                settings(
                    max_examples=examples,
                    deadline=None,
                    database=None,  # no .hypothesis/ directory in the checkout
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                )(check)()


def test_worker_gets_no_server_errors_and_only_documented_answers(
    subtests: pytest.Subtests, worker_schema: schemathesis.BaseSchema
) -> None:
    operations = [op for op in _operations(worker_schema) if WORKER_TAG in op[2]["tags"]]
    # register, enroll, claim, 5 reports, download, a presigned upload's ticket and report,
    # and a gang's join and a member's end
    assert len(operations) == 13, operations
    # Reports that end a claimed run last, so heartbeats and uploads find runs still held.
    operations.sort(key=lambda op: op[1].endswith(("/complete", "/fail", "/release")))
    _fuzz(subtests, worker_schema, operations, "worker", spare=[])


def test_admin_gets_no_server_errors_and_only_documented_answers(
    subtests: pytest.Subtests,
    admin_schema: schemathesis.BaseSchema,
    service: Service,
    worker_token: str,
) -> None:
    # After the worker protocol, so reads and reruns meet what fuzzed workers reported.
    # The event stream of a live run never ends; it is fuzzed once no run is live.
    operations = [op for op in _operations(admin_schema) if op[1] != EVENTS]
    spare = [service.admin_token, worker_token]
    _fuzz(subtests, admin_schema, operations, "admin", spare)


def test_inputs_the_generators_never_make_get_a_4xx(service: Service, worker_token: str) -> None:
    """Found next to the fuzzing: each of these once got a 500."""
    api, json_type = service.client, {"content-type": "application/json"}
    deep = "[" * 100_000 + "]" * 100_000
    assert service.submit(deep, "application/json").status_code == 400  # RecursionError
    assert service.submit(deep, "application/yaml").status_code == 400
    nan = '{"name": "n", "role": "viewer", "expires_in_days": NaN}'  # not JSON; PostgreSQL
    assert api.post("/api/v1/tokens", content=nan, headers=json_type).status_code == 400
    assert api.get(f"/api/v1/runs/{2**70}").status_code == 422  # beyond any INTEGER
    assert api.get("/api/v1/runs", params={"offset": 2**70}).status_code == 422
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {worker_token}"}
    ) as worker:
        assert service.submit((REPO / "examples" / "seed001.yaml").read_text()).status_code == 201
        run_id = worker.post("/api/v1/workers/1/claim").json()["run"]["id"]
        point = {"kind": "epoch", "epoch": 2**70, "step": 1, "fingerprint": "f", "variables": {}}
        for result in (
            {"status": "succeeded", "trace": [point]},  # OverflowError in SQLite
            {"status": "succeeded", "provenance": {"image": "x"}},  # a rerun of it crashed
        ):
            report = {"worker_id": 1, "result": result}
            answer = worker.post(f"/api/v1/runs/{run_id}/complete", json=report)
            assert answer.status_code == 422, answer.text


def test_event_streams_get_no_server_errors_and_only_documented_answers(
    subtests: pytest.Subtests, admin_schema: schemathesis.BaseSchema, service: Service
) -> None:
    for status in ("queued", "running"):  # so that every stream ends after its first event
        live = service.client.get("/api/v1/runs", params={"status": status, "limit": 500})
        for run in live.json()["items"]:
            assert service.client.post(f"/api/v1/runs/{run['id']}/cancel").status_code == 200
    operations = [op for op in _operations(admin_schema) if op[1] == EVENTS]
    _fuzz(subtests, admin_schema, operations, "events", spare=[])


def test_without_a_token_only_the_health_checks_answer(
    admin_schema: schemathesis.BaseSchema, service: Service
) -> None:
    with httpx.Client(base_url=service.url, timeout=30) as anonymous:
        for method, path, _ in _operations(admin_schema):
            answer = anonymous.request(method, re.sub(r"{\w+}", "1", path))
            expected = 200 if path in HEALTH else 401
            assert answer.status_code == expected, (method, path, answer.text)
            if expected == 401:
                assert answer.headers["WWW-Authenticate"] == "Bearer"
                assert isinstance(answer.json()["detail"], str)


def test_enough_authenticated_requests_were_sent() -> None:
    print(f"\ngenerated requests: {dict(SENT)}")
    for (label, operation, status), count in sorted(ANSWERS.items()):
        print(f"  {label:7} {operation:45} {status}  x{count}")
    assert sum(SENT.values()) >= MIN_REQUESTS, SENT
    assert not [key for key in ANSWERS if key[2] == 401], "a fuzzed request lacked its token"
    # The worker protocol was exercised past auth, up to runs claimed and reported on.
    for operation in ("/claim", "/heartbeat", "/artifacts"):
        worked = [k for k in ANSWERS if k[0] == "worker" and operation in k[1] and k[2] < 300]
        assert worked, operation
