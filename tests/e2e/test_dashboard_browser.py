"""The dashboard in Debian's Chromium, driven through playwright, against `repro serve
--with-worker`: log in, read a run, rerun it and watch the verdict arrive, find a planted
divergence in the map, open the certificate. Every page is screenshotted.

README screenshots are refreshed in examples/screenshots/ when REPRO_WRITE_SCREENSHOTS=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser import ARGS, CHROMIUM, playwright_or_skip
from tests.integration.jobs import REPO, job_env
from tests.integration.service_procs import Service, WorkerProc

pytestmark = pytest.mark.slow

PERTURB = "REPRO_TEST_PERTURB"
TARGET = "model/hidden/kernel"
README_SHOTS = REPO / "examples" / "screenshots"

sync_api = playwright_or_skip()


def perturbed_spec() -> dict[str, Any]:
    """3 epochs of 4 steps; the perturbed_mlp plugin nudges TARGET when REPRO_TEST_PERTURB says."""
    return {
        "name": "blobs-perturbable",
        "seed": 1234,
        "dataset": {
            "generator": "gaussian_blobs",
            "params": {"num_features": 8, "num_classes": 3},
            "batch_size": 32,
            "train_batches": 4,
        },
        "model": {"architecture": "perturbed_mlp", "params": {}},
        "training": {
            "epochs": 3,
            "optimizer": {"name": "adam", "params": {"learning_rate": 0.01}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "metrics": ["accuracy"],
        },
    }


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    paths = [make_plugin_site(tmp_path / "site"), PLUGIN_DIR]
    return {"PYTHONPATH": job_env(paths)["PYTHONPATH"]}


@pytest.fixture
def service(tmp_path: Path, plugin_env: dict[str, str]) -> Iterator[Service]:
    # A short lease, so a worker's liveness (for spreading audit copies) is current.
    env = {**plugin_env, "REPRO_LEASE_SECONDS": "6", "REPRO_HEARTBEAT_SECONDS": "2"}
    # Its log is a file, not a terminal: the login link is printed because it is asked for.
    extra = ("--with-worker", "--no-demo", "--print-login-link")
    svc = Service(tmp_path / "data", extra=extra, env=env)
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


class Watched:
    """A browser page whose console errors and failed requests are collected."""

    def __init__(self, page: Any, shots: Path) -> None:
        self.page, self.shots, self.problems = page, shots, []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url}"))
        page.on(
            "response",
            lambda r: self.problems.append(f"{r.status}: {r.url}") if r.status >= 400 else None,
        )

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.problems.append(f"console: {message.text}")

    def shot(self, name: str, readme: bool = False) -> None:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if readme and os.environ.get("REPRO_WRITE_SCREENSHOTS") == "1":
            README_SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, README_SHOTS / path.name)


def _login_link(service: Service) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"dashboard: (http://\S+/login\?code=\S+)", service.log.read_text())
        if found:
            return found.group(1)
        time.sleep(0.2)
    raise AssertionError(f"no login link in the log: {service.log.read_text()[-2000:]}")


def test_auditor_walks_the_dashboard(
    service: Service, tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    first = service.submit(json.dumps(perturbed_spec()), "application/json").json()["run"]["id"]
    finished = service.wait_run(first)
    assert finished["status"] == "succeeded", finished["error"]
    fingerprint = finished["final_fingerprint"]

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            w = Watched(context.new_page(), shots)
            page = w.page

            # Log in with the token.
            page.goto(f"{service.url}/")
            assert page.url.startswith(f"{service.url}/login?next=")
            w.shot("login")
            page.fill("#token", service.admin_token)
            page.click("form[action='/login'] button[type=submit]")
            page.wait_for_url(f"{service.url}/")

            # A finished run, the family's reference.
            row = page.locator(f"#run-{first}")
            assert row.locator(".status").inner_text() == "succeeded"
            assert row.locator(".badge").inner_text() == "reference"
            w.shot("runs")

            # Its page: seed and fingerprint.
            row.locator(f"a[href='/runs/{first}']").click()
            page.wait_for_url(f"{service.url}/runs/{first}")
            assert page.locator("td.seed").inner_text() == "1234, 0"
            assert page.locator("#run-live .final-fingerprint code").get_attribute("title") == (
                fingerprint
            )
            w.shot("run")

            # Rerun, and watch it reach `identical` with no reload.
            page.click("form[action$='/rerun'] button")
            page.wait_for_url(re.compile(rf"{service.url}/runs/\d+$"))
            rerun_id = int(page.url.rsplit("/", 1)[1])
            assert rerun_id != first
            loads: list[str] = []
            page.on("load", lambda: loads.append(page.url))
            page.locator("#run-live .badge.identical").wait_for(timeout=240_000)
            assert loads == []  # the badge came through the live fragment
            assert page.locator("#run-live .final-fingerprint code").get_attribute("title") == (
                fingerprint
            )
            w.shot("rerun-identical")

            # A planted divergence: an audit's two copies, one on a worker that nudges TARGET
            # by one ULP after epoch 2.
            flaky = WorkerProc(
                service.url,
                tmp_path / "flaky",
                token=service.token("worker", "flaky"),
                name="flaky",
                env={**plugin_env, PERTURB: f"{TARGET}@epoch:2"},
            )
            try:
                deadline = time.monotonic() + 60
                while True:  # registered: the workers page lists it
                    page.goto(f"{service.url}/workers")
                    if page.locator("td", has_text="flaky").count():
                        break
                    assert time.monotonic() < deadline, flaky.log.read_text()[-2000:]
                    time.sleep(0.5)
                audit = service.client.post(
                    "/api/v1/experiments?copies=2", json=perturbed_spec()
                ).json()
                copies = [audit["run"]["id"], audit["run"]["id"] + 1]
                # The runs page updates the unfinished rows in place until both are done.
                page.goto(f"{service.url}/")
                assert page.locator(f"#run-{copies[1]}.live").count() == 1
                loads.clear()
                page.locator(f"#run-{copies[1]} .badge.diverged").wait_for(timeout=240_000)
                page.locator(f"#run-{copies[0]} .badge.reference").wait_for(timeout=60_000)
                assert loads == []
                results = [service.wait_run(c) for c in copies]
            finally:
                flaky.stop()
            assert [r["status"] for r in results] == ["succeeded", "succeeded"]
            assert results[1]["verdict"] == "diverged", results[1]

            page.goto(f"{service.url}/compare?a={copies[0]}&b={copies[1]}")
            outlined = page.locator("svg.divergence-map rect.first-divergence")
            assert outlined.count() == 1
            assert outlined.get_attribute("data-variable") == TARGET
            assert outlined.is_visible()
            assert TARGET in page.locator(".divergent-variables").inner_text()
            assert "diverged at end of epoch 2" in page.locator(".explanation").first.inner_text()
            w.shot("compare-diverged", readme=True)

            page.goto(f"{service.url}/?limit=50")
            w.shot("runs-with-verdicts", readme=True)
            page.goto(f"{service.url}/audits/{audit['audit_id']}")
            assert "disagree" in page.locator(".explanation").inner_text()
            w.shot("audit")
            page.goto(f"{service.url}/experiments/{finished['experiment_id']}")
            assert page.locator("svg.lineage text.edge.identical").count() == 1
            w.shot("experiment")
            page.goto(f"{service.url}/workers")
            assert page.locator("td", has_text="flaky").count() == 1
            w.shot("workers")

            # The certificate: static, self-contained.
            page.goto(f"{service.url}/runs/{rerun_id}/certificate")
            assert page.locator("script").count() == 0
            assert page.locator("link").count() == 0
            assert fingerprint in page.content()
            w.shot("certificate")

            # The one-time login link the server printed on request works once.
            link = _login_link(service)
            fresh = browser.new_context()
            try:
                other = fresh.new_page()
                other.goto(link)
                assert other.url == f"{service.url}/"
                assert other.locator(f"#run-{first}").count() == 1
            finally:
                fresh.close()

            # Log out: back to the login form, and the pages ask for it again.
            page.goto(f"{service.url}/")
            page.click("form[action='/logout'] button")
            page.wait_for_url(f"{service.url}/login")
            page.goto(f"{service.url}/runs/{first}")
            assert "/login?next=" in page.url
            assert w.problems == []
        finally:
            browser.close()
