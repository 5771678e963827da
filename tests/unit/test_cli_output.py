"""The `repro` command line without a server: its help, its start-up and spec validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.output import unique_prefixes
from tests.cli_runner import repro
from tests.integration.jobs import REPO, blobs_spec, write_spec


def test_help_shows_flags_without_a_value_type() -> None:
    for args in (["--help"], ["submit", "--help"], ["dataset", "list", "--help"]):
        shown = repro(*args, env={"COLUMNS": "100"})
        assert shown.returncode == 0, shown.stderr
        assert "--help" in shown.stdout
        assert "<bool>" not in shown.stdout


def test_the_command_line_starts_without_the_http_client_or_pydantic() -> None:
    # What `repro --help` loads: the commands import their heavy modules when they run.
    probe = (
        "import sys; import service.cli.app; "
        "print(sorted(m for m in ('httpx', 'pydantic', 'worker.spec', 'service.config') "
        "if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"


def test_validate_suggests_the_field_meant_and_states_each_problem_once(tmp_path: Path) -> None:
    spec = blobs_spec()
    spec["dataset"]["batch_sise"] = spec["dataset"].pop("batch_size")
    path = write_spec(spec, tmp_path, "typo.json")
    done = repro("validate", str(path), cwd=tmp_path)
    assert done.returncode == 2
    assert "(did you mean dataset.batch_size?)" in done.stderr
    assert "invalid: invalid spec" not in done.stderr
    as_json = repro("validate", str(path), "--json", cwd=tmp_path)
    errors = json.loads(as_json.stdout)["errors"]
    assert {"loc": "dataset.batch_sise", "suggestion": "dataset.batch_size"}.items() <= next(
        e for e in errors if e["loc"] == "dataset.batch_sise"
    ).items()


def test_a_yaml_error_names_the_file_on_one_line(tmp_path: Path) -> None:
    path = write_spec("name: x\ndataset: [1,\n", tmp_path, "a-rather-long-spec-file-name.yaml")
    done = repro("validate", str(path), cwd=tmp_path, env={"COLUMNS": "80"})
    assert done.returncode == 2
    assert f'in "{path}", line 3' in done.stderr
    assert "<byte string>" not in done.stderr


def test_unique_prefixes_tell_apart_what_is_shown() -> None:
    a, b = "sha256:c52889ce1a48" + "0" * 52, "sha256:c52889ce1a48" + "1" * 52
    assert unique_prefixes([a, b], shortest=19) == [a[:20] + "…", b[:20] + "…"]
    assert unique_prefixes([a, a], shortest=19) == [a[:19] + "…"] * 2
    assert unique_prefixes(["short"], shortest=19) == ["short"]


def test_a_log_gets_every_epoch_even_when_reports_skip_some(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A worker reports its latest event about once a second: a fast run's reports may go
    from epoch 1 to its end. Into a pipe, `--wait` once printed epochs 1 and 4 of 4."""
    from service.cli import output

    bar = output.TrainingBar("run 3", quiet=False, initial="queued", total=4)
    bar._lines = True  # as into a pipe
    with bar:
        bar.show_epochs({"event": "epoch_end", "epoch": 1, "loss": 0.5}, 4, otherwise="x")
        bar.show_epochs({"event": "epoch_end", "epoch": 4, "loss": 0.2}, 4, otherwise="x")
    said = [line for line in capsys.readouterr().err.splitlines() if "done" in line]
    assert [line.split()[3] for line in said] == ["1/4", "2/4", "3/4", "4/4"], said
    assert "loss 0.5" in said[0] and "loss 0.2" in said[3]


def test_a_refusal_names_the_place_of_each_field_error_once() -> None:
    """The CLI printed `holdout_lambda/lambda: holdout_lambda/lambda: …` for a refused layer."""
    from reprotrain import ApiError
    from service.cli.output import api_error_lines

    said = "holdout_lambda/lambda: Lambda layers hold Python code and are refused"
    error = ApiError(422, "'m' is not a model definition", errors=[
        {"loc": "holdout_lambda/lambda", "msg": said},
        {"loc": ["body", "dataset", "batch_size"], "msg": "must be at least 1"},
    ])  # fmt: skip
    lines = api_error_lines(error)
    assert lines[1] == f"  {said}"
    assert lines[2] == "  body.dataset.batch_size: must be at least 1"
