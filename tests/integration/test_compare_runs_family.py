"""N-way comparison of a real rerun family: a server, workers training a tiny model, four
identical runs and one rerun on a worker that nudges one weight by one ULP after epoch 2."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import job_env
from tests.integration.service_procs import Service, running

pytestmark = pytest.mark.slow

html5lib = pytest.importorskip("html5lib", reason="html5lib is not installed (test extra)")

PERTURB = "REPRO_TEST_PERTURB"
TARGET = "model/hidden/kernel"


def perturbable_spec() -> dict[str, Any]:
    """2 epochs of 3 steps; the perturbed_mlp plugin nudges TARGET when REPRO_TEST_PERTURB says."""
    return {
        "name": "family-of-five",
        "seed": 7,
        "dataset": {
            "generator": "gaussian_blobs",
            "params": {"num_features": 4, "num_classes": 3},
            "batch_size": 16,
            "train_batches": 3,
        },
        "model": {"architecture": "perturbed_mlp", "params": {}},
        "training": {
            "epochs": 2,
            "optimizer": {"name": "adam", "params": {"learning_rate": 0.01}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "metrics": ["accuracy"],
        },
    }


def matrix(html: str) -> dict[tuple[int, int], str]:
    found = re.findall(
        r'<a href="/compare\?a=(\d+)&amp;b=(\d+)" title="[^"]*"><span class="badge (\w+)">', html
    )
    return {(int(a), int(b)): verdict for a, b, verdict in found}


def test_a_family_of_five_with_one_diverged_rerun(tmp_path: Path) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    plugins = {
        "PYTHONPATH": job_env([make_plugin_site(tmp_path / "site"), PLUGIN_DIR])["PYTHONPATH"]
    }
    service = Service(tmp_path / "data", extra=("--no-demo",), env=plugins)
    with running(service) as (svc, _):
        clean = svc.worker(tmp_path / "clean", env=plugins)
        try:
            created = svc.submit(json.dumps(perturbable_spec()), "application/json")
            first = created.json()["run"]["id"]
            assert svc.wait_run(first)["status"] == "succeeded"
            reruns = [svc.client.post(f"/api/v1/runs/{first}/rerun").json()["id"] for _ in range(3)]
            assert [svc.wait_run(r)["verdict"] for r in reruns] == ["identical"] * 3
        finally:
            clean.stop()
        flaky = svc.worker(tmp_path / "flaky", env={**plugins, PERTURB: f"{TARGET}@epoch:2"})
        try:
            odd = svc.client.post(f"/api/v1/runs/{first}/rerun").json()["id"]
            assert svc.wait_run(odd)["verdict"] == "diverged"
        finally:
            flaky.stop()
        family = [first, reruns[0], odd, *reruns[1:]]  # the diverged run in the middle
        listed = ",".join(map(str, family))

        # The page: exactly one row and one column of "diverged", every other pair identical.
        page = svc.dashboard().get("/compare/runs", params={"runs": listed})
        assert page.status_code == 200, page.text[:500]
        html5lib.HTMLParser(strict=True).parse(page.text)
        cells = matrix(page.text)
        assert len(cells) == 5 * 4
        diverged = {pair for pair, verdict in cells.items() if verdict == "diverged"}
        assert diverged == {(odd, r) for r in family if r != odd} | {
            (r, odd) for r in family if r != odd
        }
        assert {v for pair, v in cells.items() if pair not in diverged} == {"identical"}

        # The fields: only what differs, which is what tells the odd run from the others.
        found = svc.client.get("/api/v1/compare/runs", params={"runs": listed}).json()
        assert found["spec_diff"] == [] and 'class="none spec-same"' in page.text
        pair = svc.client.get("/api/v1/compare", params={"a": first, "b": odd}).json()
        expected = {d["field"] for d in pair["provenance_diff"]}
        assert expected and {d["field"] for d in found["environment_diff"]} == expected
        for field in found["environment_diff"]:
            values = field["values"]
            others = [v for run, v in zip(family, values, strict=True) if run != odd]
            assert len({json.dumps(v) for v in others}) == 1, field  # the four agree
            assert values[family.index(odd)] != others[0], field
            assert f'<td class="mono field">{field["field"]}</td>' in page.text
        assert page.text.count('<td class="mono field">') == len(expected)
        # Curves: every run's line, each point's value on hover.
        assert sorted(found["curves"]) == ["accuracy", "loss"]
        assert page.text.count('class="legend-entry"') == 2 * 5
        for run in family:
            assert re.search(rf"<title>run {run} · epoch 2 · loss [0-9.e-]+</title>", page.text)
