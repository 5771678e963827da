"""Every dashboard page in Debian's Chromium at 1280 and 1920 px wide, against `repro serve`
holding a run with a large record (50 environment variables, a trace of 200 variables, 4
metrics): nothing is wider than the window, no table column with text is narrower than
60 px, and each page stays under a height bound set from what it shows.

The runs are made through the worker protocol over HTTP: a worker registers, claims, uploads
its final checkpoint (tiny NumPy arrays) and reports a result document, so the pages show
what the service itself stores. A failing page is screenshotted into REPRO_LAYOUT_SHOTS (or
the test's temporary directory), and the failure message names the file.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.verification.checkpoint_structure import spec_layout
from tests.e2e.browser import ARGS, CHROMIUM, playwright_or_skip
from tests.integration import dashboard_world
from tests.integration.service_procs import Service
from worker.data.batch_source import DataInfo
from worker.record.fingerprint import fingerprint_arrays
from worker.spec import parse_spec

pytestmark = pytest.mark.slow

WIDTHS = (1280, 1920)
MIN_COLUMN = 60  # px: no table cell with text is narrower
ENV_VARS = 50
TRACE_VARIABLES = 200
EPOCHS = 10
DIVERGE_AT = 6  # the rerun's trace differs from this epoch on
ROOT = Path(__file__).resolve().parents[2]
MORE_RERUNS = 6  # identical reruns, so ten runs can be compared at once
# A full-page screenshot of a page taller than this is cut to the window (Chromium cannot
# capture much more in one image).
FULL_SHOT_LIMIT = 30_000

sync_api = playwright_or_skip()


@dataclass
class World:
    reference: int
    rerun: int
    experiment: int
    audit: int
    copies: list[int]
    more: list[int]
    dataset: str
    model: str

    def runs(self, n: int) -> str:
        """`n` of the runs, for the N-way compare page."""
        return ",".join(map(str, [self.reference, self.rerun, *self.copies, *self.more][:n]))


@dataclass(frozen=True)
class Page:
    """A page to check: its name, its path in the world, and its height bound in px."""

    name: str
    path: Callable[[World], str]
    max_height: int
    logged_in: bool = True


# Bounds: each is what the page needs for what it shows here (measured at 1280 px, the
# taller width) with room to spare, yet far below what a panel that grows a line per
# character takes (the run page's environment values once made it 57,000 px).
PAGES = [
    # A form with one field: one window.
    Page("login", lambda w: "/login", 1_200, logged_in=False),
    # Ten runs, one row each, under the filters (about 1,550 px).
    Page("runs list", lambda w: "/", 3_000),
    # The same with four metric columns (the most it shows), sorted by one: the 90-character
    # experiment name wraps to ten lines in what is left of the width (about 2,550 px).
    Page("runs list by metrics", lambda w: "/?metric=val_accuracy&sort=val_loss&order=asc", 4_000),
    # And with three parameter columns picked beside them (long paths wrap in their heading).
    Page(
        "runs list with parameter columns",
        lambda w: "/?metric=val_accuracy&sort=val_loss"
        "&param=training.optimizer.params.learning_rate"
        "&param=dataset.params.num_features&param=model.architecture",
        5_000,
    ),
    # The whole record: summary, grouped provenance with 50 environment variables of up to
    # 256 characters (2 to 8 lines each), the 11-point trace, four curves (about 8,300 px).
    Page("run page", lambda w: f"/runs/{w.reference}", 15_000),
    # The diverged rerun adds the divergence to the same record (about 8,500 px).
    Page("diverged run page", lambda w: f"/runs/{w.rerun}", 15_000),
    # The lineage tree of a family of eight (about 1,500 px).
    Page("experiment page", lambda w: f"/experiments/{w.experiment}", 3_000),
    # The divergence map, and one row per differing variable (200) with its sizes (about
    # 9,000 px).
    Page("compare page", lambda w: f"/compare?a={w.reference}&b={w.rerun}", 12_000),
    # Adds every environment field, 50 variables and their 50 digests, values of up to 256
    # characters wrapping in a third of the width (about 18,700 px).
    Page("compare, whole environment",
         lambda w: f"/compare?a={w.reference}&b={w.rerun}&env=all", 24_000),
    # Two copies and their agreement: one window.
    Page("audit page", lambda w: f"/audits/{w.audit}", 2_000),
    # Three workers: one window.
    Page("workers", lambda w: "/workers", 2_000),
    # Printable: seed, hashes, the trace, and provenance with the 50 environment variables
    # in a 1,050 px column (about 10,800 px at any width).
    Page("certificate", lambda w: f"/runs/{w.reference}/certificate", 14_000),
    # The experiments (the audit is one more), one row each: one window.
    Page("experiments list", lambda w: "/experiments", 2_000),
    # One dataset: one window.
    Page("datasets list", lambda w: "/datasets", 2_000),
    # One dataset, its arrays and the ten runs that read it (about 1,800 px).
    Page("dataset page", lambda w: f"/datasets/{w.dataset}", 4_000),
    # Four runs: a 4x4 verdict matrix, the fields that differ (one environment variable and
    # the worker's name), four curves overlaid (about 1,450 px).
    Page("compare 4 runs", lambda w: f"/compare/runs?runs={w.runs(4)}", 4_000),
    # Ten: a 10x10 matrix; the differing fields' tables scroll in their box (about 1,950 px).
    Page("compare 10 runs", lambda w: f"/compare/runs?runs={w.runs(10)}", 6_000),
    # One model definition: one window.
    Page("models list", lambda w: "/models", 2_000),
    Page("projects list", lambda w: "/projects", 2_000),
    # ResNet-20: its layer table, one row for each of its 70-odd layers.
    Page("model page", lambda w: f"/models/{w.model}", 6_000),
]  # fmt: skip

# Everything the checks ask of a page, measured in the page. An element inside a box that
# clips or scrolls horizontally (a `pre` of a traceback) is judged by that box.
MEASURE = """() => {
  const box = (e) => e.getBoundingClientRect();
  const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "")
    + (e.className && typeof e.className === "string"
       ? "." + e.className.trim().split(/\\s+/).join(".") : "");
  const clipped = (e) => {
    for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== "visible") return true;
    }
    return false;
  };
  const narrow = [];
  for (const cell of document.querySelectorAll("th, td")) {
    const text = cell.innerText.trim();
    const w = box(cell).width;
    if (text && w > 0 && w < MIN_COLUMN) {
      narrow.push(`${name(cell)} ${Math.round(w)}px: ${text.slice(0, 40)}`);
    }
  }
  const wide = [];
  for (const e of document.body.querySelectorAll("*")) {
    if (box(e).right > innerWidth + 0.5 && !clipped(e)) {
      wide.push(`${name(e)} right=${Math.round(box(e).right)}`);
    }
  }
  return {
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: innerWidth,
    height: document.documentElement.scrollHeight,
    narrow: narrow.slice(0, 15),
    wide: wide.slice(0, 15),
  };
}""".replace("MIN_COLUMN", str(MIN_COLUMN))


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def environment() -> dict[str, str]:
    """Variables as a real machine has them: paths, flag lists, and long unbroken tokens."""
    env: dict[str, str] = {"PYTHONHASHSEED": "0", "TF_DETERMINISTIC_OPS": "1"}
    for i in range(ENV_VARS - len(env)):
        if i % 3 == 0:
            value = ":".join(f"/opt/toolchain-{i}/lib{j}/x86_64-linux-gnu" for j in range(8))
        elif i % 3 == 1:
            value = " ".join(f"--xla_flag_{i}_{j}=true" for j in range(12))
        else:
            value = _digest("token", i) * 4
        env[f"SOME_RATHER_LONG_ENVIRONMENT_VARIABLE_NAME_{i:02d}"] = value
    return env


@functools.cache
def layout() -> list[tuple[str, str, tuple[int, ...]]]:
    """The checkpoint layout the server derives for `spec`: a deep MLP's about 200 variables
    (each Dense's kernel and bias, Adam's two slots for each, its counters)."""
    sample = DataInfo((8, 8, 1), "float32", (), "int64", num_classes=10, vocab_size=None)
    found = spec_layout(parse_spec(spec("sha256:" + "0" * 64)), sample)
    assert found is not None and len(found) >= TRACE_VARIABLES
    return found


def weights(epoch: int, tag: str) -> dict[str, np.ndarray]:
    """The state at the end of `epoch`: every variable of the spec's layout, small values."""
    rng = np.random.default_rng(int(_digest(epoch, tag)[:8], 16))
    return {
        path: rng.standard_normal(shape).astype(dtype)
        if dtype.startswith("float")
        else np.full(shape, epoch, dtype=dtype)
        for path, dtype, shape in layout()
    }


def npz_of(arrays: dict[str, np.ndarray]) -> bytes:
    """A checkpoint npz as a job writes one (members v0, v1, ... in fingerprint order)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{f"v{i}": a for i, a in enumerate(arrays.values())})  # type: ignore[arg-type]
    return buffer.getvalue()


class ProtocolWorker:
    """A registered worker that claims a run and reports a large, finished record for it."""

    def __init__(self, service: Service, name: str) -> None:
        self.http = service.client_for("worker", name)
        answer = self.http.post("/api/v1/workers/register", json={"name": name, "images": []})
        assert answer.status_code == 201, answer.text
        self.id = answer.json()["id"]

    def claim(self) -> int:
        answer = self.http.post(f"/api/v1/workers/{self.id}/claim")
        assert answer.status_code == 200, answer.text
        return int(answer.json()["run"]["id"])

    def finish(self, run_id: int, seed: list[int], *, diverge_at: int | None = None) -> None:
        """Upload the final checkpoint and report the result; the run must succeed."""
        trace = []
        for epoch in range(EPOCHS + 1):
            tag = "b" if diverge_at is not None and epoch >= diverge_at else "a"
            fp = fingerprint_arrays(weights(epoch, tag).items())
            kind = "init" if epoch == 0 else "epoch"
            trace.append({"kind": kind, "epoch": epoch, "step": 4 * epoch,
                          "fingerprint": fp.fingerprint, "variables": fp.variables})  # fmt: skip
        final = weights(EPOCHS, "b" if diverge_at is not None else "a")
        self._checkpoint(run_id, final)
        answer = self.http.post(
            f"/api/v1/runs/{run_id}/complete",
            json={"worker_id": self.id, "result": result_doc(trace, seed, diverged=diverge_at)},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "succeeded", answer.text

    def _checkpoint(self, run_id: int, arrays: dict[str, np.ndarray]) -> None:
        npz, npz_name = npz_of(arrays), f"epoch-{EPOCHS:06d}.npz"
        doc = {
            "format": 1,
            "epoch": EPOCHS,
            "step": 4 * EPOCHS,
            "arrays": npz_name,
            "arrays_sha256": hashlib.sha256(npz).hexdigest(),
            "manifest": [
                {"path": p, "dtype": a.dtype.name, "shape": list(a.shape)}
                for p, a in arrays.items()
            ],
            "meta": {},
        }
        for name, data in ((npz_name, npz), (f"epoch-{EPOCHS:06d}.json", b"")):
            data = data or json.dumps(doc).encode()
            answer = self.http.post(
                f"/api/v1/runs/{run_id}/artifacts",
                params={"worker_id": self.id, "kind": "checkpoint", "name": name,
                        "epoch": EPOCHS},
                headers={"X-Content-SHA256": hashlib.sha256(data).hexdigest()},
                content=data,
            )  # fmt: skip
            assert answer.status_code == 201, answer.text


def result_doc(
    trace: list[dict[str, Any]], seed: list[int], *, diverged: int | None
) -> dict[str, Any]:
    """A job's result document with 50 environment variables and 4 metrics per epoch."""
    provenance = dashboard_world.provenance(seed)
    env = environment()
    if diverged is not None:  # the rerun ran somewhere a little different
        env["SOME_RATHER_LONG_ENVIRONMENT_VARIABLE_NAME_00"] += ":/opt/other/lib"
    provenance["environment"] = env
    provenance["environment_digests"] = {k: "sha256:" + _digest(k, v) for k, v in env.items()}
    shift = 0.01 if diverged is not None else 0.0
    metrics = [
        {"epoch": e, "step": 4 * e, "loss": 0.7 - e / 50 + shift, "accuracy": 0.5 + e / 40,
         "val_loss": 0.75 - e / 60 + shift, "val_accuracy": 0.45 + e / 45}
        for e in range(1, EPOCHS + 1)
    ]  # fmt: skip
    return {
        "status": "succeeded",
        "seed": seed,
        "provenance": provenance,
        "determinism": provenance["determinism"],
        "metrics": metrics,
        "trace": trace,
        "trace_granularity": "epoch",
        "final_fingerprint": trace[-1]["fingerprint"],
        "data_fingerprints": [
            {"epoch": e, "fingerprint": "sha256:" + _digest("data", e)}
            for e in range(1, EPOCHS + 1)
        ],
        "timings": {"train_seconds": 81.5, "total_seconds": 90.2},
    }


def push_dataset(client: httpx.Client) -> str:
    """A small stored dataset of 8x8 images, as `repro dataset push` sends one."""
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        x=rng.integers(0, 16, size=(40, 8, 8, 1)).astype(np.float32),
        y=rng.integers(0, 10, size=(40,)).astype(np.int64),
    )
    body = buffer.getvalue()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    answer = client.post(
        "/api/v1/datasets",
        params={"name": "digits-for-layout"},
        content=body,
        headers={"Content-Type": "application/octet-stream", "X-Content-SHA256": digest},
    )
    assert answer.status_code == 201, answer.text
    return digest


def push_model(client: httpx.Client) -> str:
    """The ResNet-20 definition of the examples: 70-odd layers for the models pages."""
    body = (ROOT / "examples" / "models" / "resnet20.json").read_bytes()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    answer = client.post(
        "/api/v1/models",
        params={"name": "resnet20-for-layout"},
        content=body,
        headers={"Content-Type": "application/octet-stream", "X-Content-SHA256": digest},
    )
    assert answer.status_code == 201, answer.text
    return digest


def spec(dataset: str) -> dict[str, Any]:
    doc = dashboard_world.spec_doc("layout-" + "very-long-experiment-name-" * 3, epochs=EPOCHS)
    doc["dataset"] = {
        "generator": "arrays",
        "data": dataset,
        "params": {"num_classes": 10, "scale": 0.0625},
        "batch_size": 8,
        "train_batches": 4,
    }
    doc["training"]["metrics"] = ["accuracy"]
    doc["model"]["params"]["hidden"] = [4] * 32  # the most layers: about 200 variables
    return doc


def build_world(service: Service) -> World:
    """A reference run, a rerun that diverged, an audit of two identical copies, and six
    identical reruns."""
    dataset = push_dataset(service.client)
    model = push_model(service.client)
    body = json.dumps(spec(dataset))
    created = service.submit(body, "application/json")
    assert created.status_code == 201, created.text
    reference, experiment = created.json()["run"]["id"], created.json()["experiment"]["id"]
    seed = created.json()["experiment"]["seed"]
    worker = ProtocolWorker(service, "gpu-node-with-a-long-hostname-01")
    assert worker.claim() == reference
    worker.finish(reference, seed)
    rerun = service.client.post(f"/api/v1/runs/{reference}/rerun")
    assert rerun.status_code == 202, rerun.text
    assert worker.claim() == rerun.json()["id"]
    worker.finish(rerun.json()["id"], seed, diverge_at=DIVERGE_AT)
    audit = service.client.post("/api/v1/experiments?copies=2", content=body,
                                headers={"content-type": "application/json"})  # fmt: skip
    assert audit.status_code == 201, audit.text
    copies = []
    for i in range(2):  # copies go to different workers
        copy = ProtocolWorker(service, f"audit-node-{i}")
        copies.append(copy.claim())
        copy.finish(copies[-1], seed)
    more = []
    for _ in range(MORE_RERUNS):
        again = service.client.post(f"/api/v1/runs/{reference}/rerun")
        assert again.status_code == 202, again.text
        more.append(worker.claim())
        worker.finish(more[-1], seed)
    audit_id = audit.json()["audit_id"]
    return World(reference, rerun.json()["id"], experiment, audit_id, copies, more, dataset, model)


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def shots_dir(tmp_path: Path) -> Path:
    found = Path(os.environ.get("REPRO_LAYOUT_SHOTS") or tmp_path / "layout-shots")
    found.mkdir(parents=True, exist_ok=True)
    return found


def problems_of(m: dict[str, Any], page: Page) -> list[str]:
    found = []
    if m["scrollWidth"] > m["innerWidth"]:
        found.append(f"page {m['scrollWidth']} px wide in a {m['innerWidth']} px window")
    if m["height"] > page.max_height:
        found.append(f"page {m['height']} px tall (bound {page.max_height})")
    found += [f"column narrower than {MIN_COLUMN} px: {n}" for n in m["narrow"]]
    found += [f"past the right edge: {w}" for w in m["wide"]]
    return found


def check(context: Any, url: str, page: Page, shots: Path, width: int) -> str | None:
    """What is wrong with the page at `url` (None if nothing), with its screenshot path."""
    tab = context.new_page()
    try:
        answer = tab.goto(url)
        assert answer is not None
        if answer.status != 200:
            return f"{page.name} at {width} px: {url} answered {answer.status}"
        tab.wait_for_load_state("networkidle")
        m = tab.evaluate(MEASURE)
        problems = problems_of(m, page)
        if not problems:
            return None
        shot = shots / f"{page.name.replace(' ', '-').replace(',', '')}-{width}.png"
        tab.screenshot(path=str(shot), full_page=m["height"] <= FULL_SHOT_LIMIT)
        return f"{page.name} at {width} px ({url}), screenshot {shot}: " + "; ".join(problems)
    finally:
        tab.close()


def test_every_page_fits_the_window_at_1280_and_1920_px(tmp_path: Path, browser: Any) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    try:
        service.wait_ready()
        world = build_world(service)
        shots = shots_dir(tmp_path)
        failures = []
        for width in WIDTHS:
            anonymous = browser.new_context(viewport={"width": width, "height": 900})
            context = browser.new_context(viewport={"width": width, "height": 900})
            tab = context.new_page()
            tab.goto(f"{service.url}/login")
            tab.fill("#token", service.admin_token)
            tab.click("form[action='/login'] button[type=submit]")
            tab.wait_for_url(f"{service.url}/")
            tab.close()
            for page in PAGES:
                found = check(
                    context if page.logged_in else anonymous,
                    service.url + page.path(world),
                    page,
                    shots,
                    width,
                )
                if found:
                    failures.append(found)
            anonymous.close()
            context.close()
        assert not failures, "\n".join(failures)
    finally:
        service.stop()
