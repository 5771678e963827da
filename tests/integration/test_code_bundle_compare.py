"""Two runs whose code bundles differ by one line of the model file, trained for real by a
worker that accepts code: the comparison names that file (API and compare page) as changing
results and its spec diff names both bundle digests; the dashboard's Audit action on a
bundle run queues copies that train and agree."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.code_wheels import ring_bundle, ring_spec
from tests.integration.asgi_browser import hidden_value
from tests.integration.service_procs import Service, trusting_service
from tests.integration.test_code_bundles import pushed_digest

pytestmark = [pytest.mark.slow]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with trusting_service(tmp_path) as svc:
        yield svc


def trained(svc: Service, spec: str) -> dict[str, Any]:
    created = svc.submit(spec)
    assert created.status_code == 201, created.text
    run = svc.wait_run(int(created.json()["run"]["id"]), timeout=300)
    assert run["status"] == "succeeded", run["error"]
    return run


def test_one_changed_line_in_the_model_file_is_named_by_compare(service: Service) -> None:
    old = pushed_digest(service.client, ring_bundle(hidden=4))
    new = pushed_digest(service.client, ring_bundle(hidden=5))
    a, b = trained(service, ring_spec(old)), trained(service, ring_spec(new))

    report = service.client.get("/api/v1/compare", params={"a": a["id"], "b": b["id"]}).json()
    assert report["code_bundles"] == {"a": old, "b": new}
    files = report["code_files_differing"]
    assert [(f["path"], f["change"]) for f in files] == [("ring_bundle/model.py", "changed")]
    assert files[0]["a"] == a["provenance"]["code"]["files"]["ring_bundle/model.py"]
    assert "ring_bundle/model.py" in report["explanation"]
    assert "changes results" in report["explanation"]
    assert {"path": "code", "a": old, "b": new} in report["spec_diff"]

    browser = service.dashboard()
    page = browser.get("/compare", params={"a": a["id"], "b": b["id"]})
    assert page.status_code == 200, page.text
    section = page.text.split('id="code-files"', 1)[1].split("<h2", 1)[0]
    assert "ring_bundle/model.py" in section and "Changes results" in section
    assert "ring_bundle/data.py" not in section
    spec_rows = page.text.split("<h2>Spec diff</h2>", 1)[1].split("</table>", 1)[0]
    assert ">code<" in spec_rows and old in spec_rows and new in spec_rows


def test_dashboard_audit_of_a_bundle_run_queues_copies_that_agree(service: Service) -> None:
    run = trained(service, ring_spec(pushed_digest(service.client, ring_bundle())))
    browser = service.dashboard()
    page = browser.get(f"/runs/{run['id']}").text
    csrf = hidden_value(page, "csrf")
    answer = browser.post(f"/runs/{run['id']}/audit", data={"csrf": csrf, "copies": "2"})
    assert answer.status_code == 303, answer.text
    location = answer.headers["location"]
    assert location.startswith("/audits/"), location
    audit_id = int(location.rsplit("/", 1)[1])
    deadline = time.monotonic() + 300
    while True:
        found = service.client.get(f"/api/v1/repro-audits/{audit_id}").json()
        if found["finished"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert found["finished"] and found["agree"] is True, found
