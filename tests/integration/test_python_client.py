"""The README's Python-client example, run as written against a real server and worker,
and what `repro submit` does with a spec file: names it in a YAML error, prints the API's
warnings on stderr."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.cli_runner import repro
from tests.integration.jobs import REPO, blobs_spec
from tests.integration.service_procs import Service, running
from tests.integration.test_datasets_api import digits_like

pytestmark = pytest.mark.slow


def readme_client_example() -> str:
    """The first Python code block of the README's "Python client" section."""
    section = (REPO / "README.md").read_text().split("\n## Python client\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.DOTALL)
    assert found is not None, "the README's Python client section has no example"
    return found.group(1)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("client")
    with running(Service(root / "data", extra=("--no-demo",)), root / "worker") as (svc, _):
        yield svc


def _table(directory: Path) -> Path:
    path = directory / "table.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.normal(size=(40, 3)).astype(np.float32), y=np.arange(40) % 2)
    return path


def test_the_readme_example_runs_and_its_rerun_is_identical(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = blobs_spec()
    spec["training"]["epochs"] = 2
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    _table(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REPRO_API_URL", service.url)
    monkeypatch.setenv("REPRO_TOKEN", service.admin_token)
    scope: dict[str, Any] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(readme_client_example(), "README.md", "exec"), scope)
    run, again, report = scope["run"], scope["again"], scope["report"]
    assert run.status == "succeeded" and run.final_metrics["epoch"] == 2
    assert again.verdict == "identical" and again.rerun_of_id == run.id
    assert again.final_fingerprint == run.final_fingerprint
    assert report.verdict == "identical" and report.identical
    assert scope["table"].digest.startswith("sha256:")
    assert "identical" in printed.getvalue()
    listed = [r.id for r in scope["c"].runs(status="succeeded", page_size=1)]
    assert listed[:2] == [again.id, run.id]  # across pages of one, by cursor
    scope["c"].close()


def test_submit_names_the_file_of_a_yaml_error(service: Service, tmp_path: Path) -> None:
    spec = tmp_path / "typo.yaml"
    spec.write_text("name: typo\ndataset: {generator: gaussian_blobs\n")
    done = repro("submit", str(spec), "--api", service.url, "--token", service.admin_token)
    assert done.returncode == 2, done.stderr
    assert str(spec) in done.stderr and "<byte string>" not in done.stderr
    assert done.stdout == ""


def test_submit_prints_the_apis_warnings_on_stderr(service: Service, tmp_path: Path) -> None:
    api = ("--api", service.url, "--token", service.admin_token)
    pushed = repro("dataset", "push", str(_table(tmp_path)), *api)
    assert pushed.returncode == 0, pushed.stderr
    spec = blobs_spec()
    spec["training"]["epochs"] = 1
    spec["dataset"] = {
        "generator": "arrays",
        "data": pushed.stdout.strip(),
        "params": {"num_classes": 2, "eval_fraction": 0.2},
        "batch_size": 4,
        "train_batches": 4,
    }
    path = tmp_path / "held-out.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = repro("submit", str(path), *api, env={"COLUMNS": "200", **os.environ})
    assert done.returncode == 0, done.stderr
    assert re.match(r"experiment \d+  run \d+", done.stdout)
    assert "warning:" in done.stderr and "eval_fraction" in done.stderr
    assert "warning" not in done.stdout


def test_submit_and_rerun_take_a_priority_from_an_admin_only(
    service: Service, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**blobs_spec(), "name": "urgent"}))
    admin = ("--api", service.url, "--token", service.admin_token)
    submitted = repro("submit", str(spec), "--priority", "3", "--json", *admin)
    assert submitted.returncode == 0, submitted.stderr
    run = json.loads(submitted.stdout)["run"]
    assert run["priority"] == 3
    rerun = repro("rerun", str(run["id"]), "--priority", "2", "--json", *admin)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["priority"] == 2

    submitter = ("--api", service.url, "--token", service.token("submitter"))
    refused = repro("submit", str(spec), "--priority", "3", *submitter)
    assert refused.returncode != 0 and "admin" in refused.stderr, refused.stderr
    refused = repro("rerun", str(run["id"]), "--priority", "1", *submitter)
    assert refused.returncode != 0 and "admin" in refused.stderr, refused.stderr


def test_client_takes_the_local_admin_token_and_its_401_says_where_tokens_come_from(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Client()` on the machine of `repro serve` uses its admin token, as the CLI does; it
    once sent none and its 401 did not say where a token comes from."""
    from reprotrain import ApiError, Client

    monkeypatch.delenv("REPRO_TOKEN", raising=False)
    monkeypatch.setenv("REPRO_DATA_DIR", str(service.data_dir))
    with Client(service.url) as local, Client(service.url, service.admin_token) as admin:
        # Authenticated by the local token: the same page as the admin's (a 401 otherwise).
        assert [r.id for r in local.runs_page(limit=3).items] == [
            r.id for r in admin.runs_page(limit=3).items
        ]

    # The same token never goes to another machine: none is sent there.
    monkeypatch.setenv("REPRO_DATA_DIR", str(service.data_dir.parent / "elsewhere"))
    with Client(service.url) as anonymous, pytest.raises(ApiError) as refused:
        anonymous.runs_page(limit=1)
    message = str(refused.value)
    assert refused.value.status_code == 401
    assert "no token was sent" in message and "REPRO_TOKEN" in message
    assert "admin-token" in message and "repro token create" in message

    monkeypatch.setenv("REPRO_TOKEN", "rt_not-a-real-token")
    with Client(service.url) as wrong, pytest.raises(ApiError) as refused:
        wrong.runs_page(limit=1)
    assert "the token from REPRO_TOKEN was refused" in str(refused.value)


def test_a_worker_without_a_token_says_what_it_needs_instead_of_a_traceback(
    service: Service, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REPRO_TOKEN"}
    done = repro(
        "worker", "--api", service.url, "--work-dir", str(tmp_path / "w"), env=env, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "no token was given" in done.stderr and "--role worker" in done.stderr


def test_runs_lists_by_filter_and_cancel_stops_a_run(service: Service, tmp_path: Path) -> None:
    """The CLI had no `runs` list with filters and no `cancel`."""
    api = ("--api", service.url, "--token", service.admin_token)
    spec = blobs_spec(name="to-cancel")
    spec["training"]["epochs"] = 200
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(spec))
    submitted = repro("submit", str(path), "--json", *api)
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["run"]["id"]
    cancelled = repro("cancel", str(run_id), "99999", *api)
    assert cancelled.returncode == 1  # one of the two does not exist
    assert f"run {run_id} cancelled" in cancelled.stdout, cancelled.stdout
    assert "run 99999:" in cancelled.stderr and "404" in cancelled.stderr

    listed = repro("runs", "--status", "cancelled", "--json", *api)
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)["items"]] == [run_id]
    table = repro("runs", "--status", "cancelled", *api)
    assert table.returncode == 0 and str(run_id) in table.stdout
    none = repro("runs", "--status", "cancelled", "--verdict", "identical", "--json", *api)
    assert json.loads(none.stdout)["items"] == []

    # Named and tagged from the command line, found by its tag, shown by status.
    edited = repro("edit", str(run_id), "--name", "too long", "--tag", "abandoned", *api)
    assert edited.returncode == 0, edited.stderr
    assert f"run {run_id}  too long [abandoned]" in edited.stdout
    tagged = repro("runs", "--tag", "abandoned", "--json", *api)
    assert [r["id"] for r in json.loads(tagged.stdout)["items"]] == [run_id]
    from reprotrain import Client

    with Client(service.url, service.admin_token) as client:
        run = client.edit_run(run_id, notes="200 epochs was a typo", add_tags=["typo"])
        assert run.name == "too long" and run.tags == ["abandoned", "typo"]
        assert [r.id for r in client.runs(tag="typo")] == [run_id]
    shown = repro("status", str(run_id), *api).stdout
    assert "too long" in shown and "abandoned, typo" in shown and "200 epochs was" in shown
    nothing = repro("edit", str(run_id), *api)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr

    # Searched by parameter from the command line; a bad search is refused saying why.
    searched = repro(
        "runs", "--search", "params.training.epochs = 200 and tag = typo", "--json", *api
    )
    assert [r["id"] for r in json.loads(searched.stdout)["items"]] == [run_id], searched.stderr
    bad = repro("runs", "--search", "metrics.accuracy > high", *api)
    assert bad.returncode == 2 and "compared with a number" in bad.stderr

    # Archived: out of the lists, there when asked for.
    archived = repro("archive", str(run_id), *api)
    assert archived.returncode == 0 and f"run {run_id} archived" in archived.stdout
    gone = repro("runs", "--status", "cancelled", "--json", *api)
    assert run_id not in [r["id"] for r in json.loads(gone.stdout)["items"]]
    kept = repro("runs", "--archived", "true", "--json", *api)
    assert [r["id"] for r in json.loads(kept.stdout)["items"]] == [run_id]


def test_repro_collect_says_what_it_would_remove_and_refuses_non_admins(service: Service) -> None:
    api = ("--api", service.url)
    dry = repro("collect", "--dry-run", *api, "--token", service.admin_token, timeout=60)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dry.stdout.startswith("would remove 0 files (0 B) of runs archived before ")
    assert "(30 days): none" in dry.stdout
    viewer = service.token("viewer", "not-an-admin")
    refused = repro("collect", *api, "--token", viewer, timeout=60)
    assert refused.returncode == 2 and "error 403" in refused.stderr


def test_repro_delete_asks_first_and_says_why_a_run_stays(service: Service) -> None:
    api = ("--api", service.url, "--token", service.admin_token)
    asked = repro("delete", "999999", *api, timeout=60, input="n\n")
    assert asked.returncode == 1 and "delete runs 999999 for good?" in asked.stdout
    missing = repro("delete", "999999", "--yes", *api, timeout=60)
    assert missing.returncode == 1 and "run 999999:" in missing.stderr
    assert "does not exist" in missing.stderr


def test_repro_archives_a_dataset_collects_its_bytes_and_a_push_brings_it_back(
    service: Service, tmp_path: Path
) -> None:
    api = ("--api", service.url, "--token", service.admin_token)
    data = tmp_path / "digits.npz"
    data.write_bytes(digits_like(seed=11))
    pushed = repro("dataset", "push", str(data), *api, timeout=60)
    assert pushed.returncode == 0, pushed.stderr
    digest = pushed.stdout.strip()

    archived = repro("dataset", "archive", digest, "sha256:" + "0" * 64, *api, timeout=60)
    assert archived.returncode == 1  # the second is not stored
    assert f"dataset {digest} archived" in archived.stdout
    assert "no dataset sha256:000" in archived.stderr
    listed = repro("dataset", "list", "--json", *api, timeout=60)
    assert digest not in [d["digest"] for d in json.loads(listed.stdout)["items"]]
    shown = repro("dataset", "list", "--archived", "true", "--json", *api, timeout=60)
    assert [d["digest"] for d in json.loads(shown.stdout)["items"]] == [digest]

    collected = repro("collect", "--days", "0", *api, timeout=60)
    assert collected.returncode == 0, collected.stderr
    assert f"removed dataset {digest} (" in collected.stdout
    assert json.loads(repro("dataset", "show", digest, "--json", *api).stdout)["files_collected_at"]
    again = repro("dataset", "push", str(data), "--json", *api, timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["files_collected_at"] is None

    missing = repro("experiment", "archive", "999999", *api, timeout=60)
    assert missing.returncode == 1 and "experiment 999999:" in missing.stderr
    assert "does not exist" in missing.stderr
