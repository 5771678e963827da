"""Script experiments without a server: the spec (`kind: script`) and its bounds, the
directory's wheel (the same bytes from the same files, what is left out, what is refused),
the code store's check of it, the spec diff naming a script's arguments, and the job
itself ending with a clear error when the script never calls `init()` or never records an
epoch's end."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

from service.client.script_bundle import (
    ScriptDirectoryError,
    build_script_wheel,
    script_entry,
)
from worker.compare.spec_diff import diff_specs, script_arguments
from worker.errors import SpecError
from worker.models.code_bundles import CodeBundleError, inspect_wheel
from worker.result import JobResult
from worker.script.job import epoch_rows, run_script_job
from worker.spec import ScriptExperimentSpec, parse_any_spec, parse_spec_text
from worker.training.progress import ProgressReporter

DIGEST = "sha256:" + "ab" * 32


def script_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "script",
        "name": "digits",
        "script": {"entry": "train.py", "args": ["--lr", "0.01"]},
        "code": DIGEST,
    }
    spec.update(changes)
    return spec


def test_a_script_spec_parses_and_its_hash_covers_entry_args_code_and_seed() -> None:
    spec = parse_any_spec(script_spec())
    assert isinstance(spec, ScriptExperimentSpec)
    hashes = {
        spec.spec_hash(),
        parse_any_spec(
            script_spec(script={"entry": "train.py", "args": ["--lr", "0.02"]})
        ).spec_hash(),
        parse_any_spec(
            script_spec(script={"entry": "other.py", "args": ["--lr", "0.01"]})
        ).spec_hash(),
        parse_any_spec(script_spec(code="sha256:" + "cd" * 32)).spec_hash(),
        spec.with_seed((7, 0)).spec_hash(),
    }
    assert len(hashes) == 5
    yaml_text = "kind: script\nname: digits\nseed: 7\nscript: {entry: train.py}\ncode: " + DIGEST
    parsed = parse_spec_text(yaml_text)
    assert isinstance(parsed, ScriptExperimentSpec)
    assert parsed.seed == (7, 0) and parsed.script.args == []


@pytest.mark.parametrize(
    ("changes", "loc"),
    [
        ({"script": {"entry": "../train.py"}}, "script.entry"),
        ({"script": {"entry": "/abs/train.py"}}, "script.entry"),
        ({"script": {"entry": "train.sh"}}, "script.entry"),
        ({"script": {"entry": "a\\train.py"}}, "script.entry"),
        ({"script": {"entry": "train.py", "args": ["x" * 5000]}}, "script.args"),
        ({"script": {"entry": "train.py", "args": ["a"] * 300}}, "script.args"),
        ({"script": {"entry": "train.py", "args": [3]}}, "script.args.0"),
        ({"code": "sha256:short"}, "code"),
        ({"code": None}, "code"),
        ({"dataset": {}}, "dataset"),
        ({"kind": "notebook"}, "kind"),
    ],
)
def test_a_bad_script_spec_is_refused_at_its_field(changes: dict[str, Any], loc: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_any_spec(script_spec(**changes))
    assert loc in [e["loc"] for e in caught.value.errors], caught.value.errors


def write(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_same_directory_gives_the_same_wheel_and_a_changed_file_another(
    tmp_path: Path,
) -> None:
    files = {"train.py": "print(1)\n", "lib/model.py": "W = 16\n", "data, v1.csv": "1,2\n"}
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, files)
    write(b, dict(reversed(files.items())))  # written in another order, at another time
    os.utime(b / "train.py", (1, 1))
    wheel_a = build_script_wheel(a, "train.py", tmp_path / "out-a")
    wheel_b = build_script_wheel(b, "train.py", tmp_path / "out-b")
    assert digest(wheel_a) == digest(wheel_b)
    info = inspect_wheel(wheel_a)
    assert {f["path"] for f in info.files} >= {"train.py", "lib/model.py", "data, v1.csv"}
    assert info.entry_points == [
        {"group": "reprotrain.scripts", "name": "main", "value": "train.py"}
    ]
    (b / "lib" / "model.py").write_text("W = 24\n")
    assert digest(build_script_wheel(b, "train.py", tmp_path / "out-c")) != digest(wheel_a)


def test_hidden_files_caches_and_local_run_records_stay_home(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "train.py": "",
            ".git/config": "",
            ".env": "SECRET=1",
            "__pycache__/train.cpython-311.pyc": "",
            "lib/__pycache__/m.cpython-311.pyc": "",
            "stale.pyc": "",
            "reprotrain-runs/x/run.json": "{}",
        },
    )
    wheel = build_script_wheel(tmp_path, "train.py", tmp_path.parent / "out")
    shipped = {f["path"] for f in inspect_wheel(wheel).files}
    assert {p for p in shipped if ".dist-info/" not in p} == {"train.py"}


def test_what_cannot_be_shipped_is_refused_saying_why(tmp_path: Path) -> None:
    write(tmp_path / "proj", {"train.py": "", "sub/run.py": ""})
    (tmp_path / "proj" / "link").symlink_to(tmp_path)
    with pytest.raises(ScriptDirectoryError, match="symbolic link"):
        build_script_wheel(tmp_path / "proj", "train.py", tmp_path / "out")
    with pytest.raises(ScriptDirectoryError, match="not a Python script"):
        script_entry(tmp_path / "proj" / "missing.py")
    with pytest.raises(ScriptDirectoryError, match="is not inside"):
        script_entry(tmp_path / "proj" / "train.py", tmp_path / "proj" / "sub")
    base, entry = script_entry(tmp_path / "proj" / "sub" / "run.py", tmp_path / "proj")
    assert (base, entry) == ((tmp_path / "proj").resolve(), "sub/run.py")


def test_the_code_store_refuses_a_script_entry_it_does_not_hold(tmp_path: Path) -> None:
    write(tmp_path / "d", {"train.py": ""})
    wheel = build_script_wheel(tmp_path / "d", "train.py", tmp_path / "out")

    forged = tmp_path / "forged.whl"
    entry_points = b"[reprotrain.scripts]\nmain = other.py\n"
    hashed = base64.urlsafe_b64encode(hashlib.sha256(entry_points).digest()).rstrip(b"=")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(forged, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("entry_points.txt"):
                data = entry_points
            elif item.filename.endswith("RECORD"):
                rows = [
                    f"{line.split(',')[0]},sha256={hashed.decode()},{len(entry_points)}"
                    if line.startswith(item.filename.replace("RECORD", "entry_points.txt"))
                    else line
                    for line in data.decode().splitlines()
                ]
                data = ("\n".join(rows) + "\n").encode()
            dst.writestr(item, data)
    with pytest.raises(CodeBundleError, match=r"its script 'other\.py' is not among its files"):
        inspect_wheel(forged)


def test_the_spec_diff_names_the_argument_that_changed() -> None:
    assert script_arguments(["data.csv", "--lr", "0.01", "--fast", "--n=3", "-v", "-1"]) == {
        "#0": "data.csv",
        "--lr": "0.01",
        "--fast": True,
        "--n": "3",
        "-v": "-1",
    }
    a = script_spec(script={"entry": "train.py", "args": ["--epochs", "2", "--lr", "0.01"]})
    b = script_spec(script={"entry": "train.py", "args": ["--lr", "0.02", "--epochs", "2"]})
    assert diff_specs(a, b) == [{"path": "script.args.--lr", "a": "0.01", "b": "0.02"}]


def test_epoch_rows_keep_each_epochs_last_values() -> None:
    logged = [
        {"name": "loss", "value": 2.0, "step": 5, "epoch": 1},
        {"name": "acc", "value": 0.5, "step": 10, "epoch": 1},
        {"name": "lr", "value": 0.1, "step": 3, "epoch": None},
        {"name": "loss", "value": 1.0, "step": 20, "epoch": 2},
    ]
    assert epoch_rows(logged) == [
        {"epoch": 1, "step": 10, "loss": 2.0, "acc": 0.5},
        {"epoch": 2, "step": 20, "loss": 1.0},
    ]


def job(tmp_path: Path, text: str) -> JobResult:
    write(tmp_path / "d", {"train.py": text})
    wheel = build_script_wheel(tmp_path / "d", "train.py", tmp_path / "out")
    spec = ScriptExperimentSpec.model_validate(
        script_spec(code="sha256:" + digest(wheel), seed=[3, 0])
    )
    with open(tmp_path / "progress.txt", "w") as stream:
        return run_script_job(
            spec,
            reporter=ProgressReporter(stream),
            code_file=wheel,
            checkpoint_dir=tmp_path / "ckpt",
        )


def test_a_script_that_never_calls_init_fails_saying_what_to_add(tmp_path: Path) -> None:
    result = job(tmp_path, "print('training')\n")
    assert result.status == "failed"
    assert result.error is not None
    assert "without calling reprotrain.init()" in result.error.message


def test_a_script_that_records_no_epoch_end_fails_saying_how(tmp_path: Path) -> None:
    text = (
        "import sys, reprotrain\n"
        "run = reprotrain.init()\n"
        "assert run.seed == (3, 0), run.seed\n"
        "assert sys.argv[1:] == ['--lr', '0.01'], sys.argv\n"
        "run.log_metric('loss', 1.5, epoch=1)\n"
    )
    result = job(tmp_path, text)
    assert result.status == "failed"
    assert result.error is not None
    assert "without a trace point at the end of an epoch" in result.error.message
    assert result.metrics == [{"epoch": 1, "step": 0, "loss": 1.5}]


def test_a_script_that_raises_fails_with_its_exit_code(tmp_path: Path) -> None:
    result = job(tmp_path, "import reprotrain\nreprotrain.init()\nraise SystemExit(4)\n")
    assert result.status == "failed"
    assert result.error is not None
    assert "exited with code 4" in result.error.message


# Shuffles with NumPy's global generator before init() seeds it, then records the order as
# the one variable of a stand-in model (what fingerprints read: a path and a value).
SHUFFLES_FIRST = """\
import numpy as np

order = np.random.permutation(1000)

import reprotrain

run = reprotrain.init(name="shuffled")


class Weights:
    path = "order"

    def __init__(self, value):
        self.value = value
        self.shape = value.shape

    def numpy(self):
        return self.value


class Model:
    variables = [Weights(order.astype("float32"))]
    trainable_variables = variables


run.trace_point(step=0, model=Model())
run.trace_point(step=1, epoch=1, model=Model())
run.finish()
"""


def test_a_shuffle_before_init_is_warned_about_when_run_by_hand(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    python_first = "import random\nrandom.shuffle(files := list(range(9)))\n"
    init = "import reprotrain\nreprotrain.init()\n"
    write(
        tmp_path / "d",
        {"train.py": SHUFFLES_FIRST, "clean.py": init, "python_first.py": python_first + init},
    )
    env = {**os.environ, "REPRO_SCRIPT_RUNS_DIR": str(tmp_path / "runs")}
    records = []
    for script in ("train.py", "clean.py", "python_first.py"):
        done = subprocess.run(
            [sys.executable, script], cwd=tmp_path / "d", env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        (record,) = [
            json.loads(p.read_text())
            for p in (tmp_path / "runs").glob("*/run.json")
            if json.loads(p.read_text())["script"]["path"] == script
        ]
        records.append(record)
    shuffled, clean, python_first = (r["warnings"] for r in records)
    assert [w for w in shuffled if w.startswith("numpy.random was drawn from before")], shuffled
    assert not [w for w in clean if "was drawn from" in w], clean
    assert [w for w in python_first if w.startswith("Python's random was drawn")], python_first


def test_a_worker_seeds_what_the_script_draws_before_init(tmp_path: Path) -> None:
    first = job(tmp_path / "a", SHUFFLES_FIRST)
    again = job(tmp_path / "b", SHUFFLES_FIRST)
    assert first.status == again.status == "succeeded", first.error
    assert first.final_fingerprint == again.final_fingerprint
    assert not [w for w in first.warnings if "was drawn from" in w], first.warnings
