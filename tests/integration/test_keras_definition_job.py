"""The job checks a model definition again, whatever the server said: its digest, the
allow-list and the parameter limit, all before TensorFlow is imported, so an oversized or
hostile definition never allocates a weight or runs code."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.jobs import blobs_spec, job_env, write_spec
from tests.integration.test_model_size import _MEASURE, BUILTIN_RSS_BOUND
from tests.unit.test_keras_definition_checker import repeat_vector_model
from worker.result import read_result

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"
RESNET = (EXAMPLES / "resnet20.json").read_bytes()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _job(tmp_path: Path, definition: bytes, named: str, *args: str) -> tuple[int, Any, int]:
    """Run a job of the definition file `definition` under a spec naming `named`:
    (exit code, result, peak RSS in bytes)."""
    spec = blobs_spec(model={"architecture": "keras", "definition": named})
    spec_path = write_spec(spec, tmp_path)
    model = tmp_path / "model.json"
    model.write_bytes(definition)
    out = tmp_path / "result.json"
    job = [sys.executable, "-m", "worker.run", "--spec", str(spec_path), "--out", str(out)]
    launched = subprocess.run(
        [sys.executable, "-c", _MEASURE, *job, "--model-file", str(model), *args],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=600,
        check=True,
    )
    code, rss = json.loads(launched.stdout.splitlines()[-1])
    return int(code), read_result(out), int(rss)


def test_an_oversized_definition_fails_before_tensorflow_is_imported(tmp_path: Path) -> None:
    code, result, rss = _job(tmp_path, RESNET, _digest(RESNET), "--max-model-parameters", "100000")
    assert code == 1 and result.status == "failed"
    assert result.error is not None
    assert "274042 parameters" in result.error.message and "100000" in result.error.message
    assert rss < BUILTIN_RSS_BOUND  # TensorFlow alone takes more


def test_a_lambda_definition_is_refused_by_the_job_too(tmp_path: Path) -> None:
    config = json.loads(RESNET)
    layer = next(la for la in config["config"]["layers"] if la["config"]["name"] == "pool")
    layer["class_name"] = "Lambda"
    hostile = json.dumps(config).encode()
    code, result, rss = _job(tmp_path, hostile, _digest(hostile))
    assert code == 2 and result.error is not None
    assert "resnet20/pool: Lambda" in result.error.message
    assert result.error.errors[0]["loc"] == "model.definition"
    assert rss < BUILTIN_RSS_BOUND


def test_a_file_that_is_not_the_named_definition_is_refused(tmp_path: Path) -> None:
    code, result, _ = _job(tmp_path, RESNET, "sha256:" + "0" * 64)
    assert code == 2 and result.error is not None
    assert f"has digest {_digest(RESNET)}, not the spec's sha256:{'0' * 64}" in (
        result.error.message
    )


def test_an_activation_bomb_fails_before_tensorflow_is_imported(tmp_path: Path) -> None:
    bomb = repeat_vector_model(2**22)  # 2**25 values per example, 2**30 for the batch
    code, result, rss = _job(tmp_path, bomb, _digest(bomb), "--max-activation-elements", str(2**28))
    assert code == 1 and result.error is not None
    assert "bomb/repeat" in result.error.message
    assert "REPRO_MAX_ACTIVATION_ELEMENTS" in result.error.message
    assert rss < BUILTIN_RSS_BOUND  # TensorFlow alone takes more
