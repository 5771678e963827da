"""Two runs that differ only in environment variables no list names: the comparison names
them and no value of theirs is stored or shown anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from service.cli.local import verdict
from tests.cli_runner import repro
from tests.integration.jobs import blobs_spec, run_job
from tests.integration.service_procs import Service, running
from worker.record.environment_capture import KEY_FILE, key_id

pytestmark = pytest.mark.slow

# Long, unlikely strings: finding one anywhere can only mean it leaked.
FAST_MATH = "fast-math-on-3e9a51c7d2"
SECRET = "api-token-value-71f0b4aa69"
SET_FOR_ONE_JOB = {"MYLIB_FAST_MATH": FAST_MATH, "MYLIB_API_TOKEN": SECRET}


def _environment_entries(report: dict[str, object]) -> list[dict[str, object]]:
    entries = report["provenance_diff"]
    assert isinstance(entries, list)
    return [d for d in entries if str(d["field"]).startswith("environment")]


def _files_under(*directories: Path) -> bytes:
    return b"".join(
        p.read_bytes() for d in directories for p in sorted(d.rglob("*")) if p.is_file()
    )


def _dashboard_pages(svc: Service, *paths: str) -> list[str]:
    """The dashboard's pages at `paths`, as a browser logged in with the admin token sees them."""
    browser = svc.dashboard()
    pages = [browser.get(path) for path in paths]
    assert all(page.status_code == 200 for page in pages)
    return [page.text for page in pages]


def test_server_compare_names_the_variable_and_stores_no_value(
    tmp_path: Path, database_url: str | None
) -> None:
    service = Service(tmp_path / "data", database_url=database_url, extra=("--no-demo",))
    with running(service) as (svc, workers):
        plain = svc.worker(tmp_path / "plain")
        workers.append(plain)
        first = svc.submit(json.dumps(blobs_spec()), "application/json").json()["run"]["id"]
        assert svc.wait_run(first)["status"] == "succeeded"
        plain.stop()
        workers.append(svc.worker(tmp_path / "fast", env=SET_FOR_ONE_JOB))
        rerun = svc.client.post(f"/api/v1/runs/{first}/rerun").json()["id"]
        second = svc.wait_run(rerun)
        assert second["status"] == "succeeded", second["error"]

        # The variables no list names change nothing here, and the report says they differ.
        # A credential-like one (MYLIB_API_TOKEN) never reaches a worker's job at all.
        assert second["verdict"] == "identical", second["verdict_report"]
        stored = second["verdict_report"]
        entries = _environment_entries(stored)
        assert [d["field"] for d in entries] == ["environment.MYLIB_FAST_MATH"]
        for entry in entries:
            assert entry["a"] is None and str(entry["b"]).startswith("hidden:")
            assert entry["breaks_reproducibility"] is False

        asked = svc.client.get("/api/v1/compare", params={"a": first, "b": rerun})
        assert _environment_entries(asked.json()) == entries
        api = ("--api", svc.url, "--token", svc.admin_token)
        shown = repro("compare", str(first), str(rerun), *api, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert "environment.MYLIB_FAST_MATH" in shown.stdout

        # Both jobs digested with the service's key, which never appears in a record.
        runs = [svc.client.get(f"/api/v1/runs/{i}").json() for i in (first, rerun)]
        key = (tmp_path / "data" / KEY_FILE).read_text().strip()
        for run in runs:
            digests = run["provenance"]["environment_digests"]
            assert digests["key_id"] == key_id(key.encode()) and digests["key_source"] == "handed"
        assert "MYLIB_FAST_MATH" not in runs[0]["provenance"]["environment_digests"]["variables"]
        assert "MYLIB_FAST_MATH" in runs[1]["provenance"]["environment_digests"]["variables"]
        pages = _dashboard_pages(
            svc, f"/compare?a={first}&b={rerun}", f"/compare?a={first}&b={rerun}&env=all",
            f"/runs/{rerun}",
        )  # fmt: skip
        assert "environment.MYLIB_FAST_MATH" in pages[0] and "no list names" in pages[0]
        everything = asked.text + shown.stdout + shown.stderr + json.dumps(runs) + "".join(pages)
        for value in (FAST_MATH, SECRET, key):
            assert value not in everything

    # Nor anywhere the server or the workers keep files: database, artifacts, results.
    kept = _files_under(tmp_path / "data", tmp_path / "plain", tmp_path / "fast")
    assert FAST_MATH.encode() not in kept and SECRET.encode() not in kept
    if database_url is not None:
        with psycopg.connect(database_url.replace("+psycopg", "")) as db:
            dumped = "".join(
                str(row)
                for table in ("runs", "verdicts")
                for row in db.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            )
        assert "MYLIB_FAST_MATH" in dumped  # the rows are there, by name only
        assert FAST_MATH not in dumped and SECRET not in dumped


def test_local_runs_compare_with_the_data_directorys_key(tmp_path: Path) -> None:
    spec = blobs_spec()
    spec["training"]["epochs"] = 1
    local = {"REPRO_DATA_DIR": str(tmp_path / "home")}
    a = run_job(spec, tmp_path / "a", env=local)
    b = run_job(spec, tmp_path / "b", env={**local, **SET_FOR_ONE_JOB})
    assert a.returncode == b.returncode == 0, (a.result.error, b.result.error)
    key = (tmp_path / "home" / KEY_FILE).read_bytes().strip()
    for result in (a.result, b.result):
        assert result.provenance["environment_digests"]["key_source"] == "local"
        assert result.provenance["environment_digests"]["key_id"] == key_id(key)
    report = verdict(a.result, b.result)
    assert report["verdict"] == "identical"
    assert [d["field"] for d in _environment_entries(report)] == [
        "environment.MYLIB_API_TOKEN",
        "environment.MYLIB_FAST_MATH",
    ]
    written = json.dumps(report).encode() + _files_under(tmp_path / "a", tmp_path / "b")
    assert FAST_MATH.encode() not in written and SECRET.encode() not in written
