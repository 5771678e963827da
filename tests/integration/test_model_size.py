"""The model-size limit holds before a worker allocates weights, and spec bounds hold on a server.

Real TensorFlow on CPU: a job whose model would need tens of gigabytes fails fast with the
count and the limit while the worker process stays small, whether the model is built in or
a plugin; a job under the limit trains as before; the worker and a real server refuse
2,000 threads, and the server answers 422 and stores nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import blobs_spec, job_env, write_spec
from tests.integration.service_procs import Service
from worker.models import registry
from worker.result import read_result

# --- an oversized job fails before it allocates --------------------------------------------

LIMIT = 1_000_000
# Peak RSS a refused job may reach. A built-in model is refused before TensorFlow is
# imported (measured ~33 MiB); a plugin is built without weights after the import (~545 MiB).
BUILTIN_RSS_BOUND = 256 * 1024**2
PLUGIN_RSS_BOUND = 2 * 1024**3


# Runs the job and reports its peak RSS. A job forked from this test process would count
# this process's memory (TensorFlow included) in its own peak, so a small launcher does it.
_MEASURE = """
import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
proc.returncode = os.waitstatus_to_exitcode(status)
print(json.dumps([proc.returncode, usage.ru_maxrss * 1024]))
"""


def _run_measured(
    spec: dict[str, Any], tmp_path: Path, *args: str, paths: list[Path] | None = None
) -> tuple[int, Any, int]:
    """Run `python -m worker.run` to completion; (exit code, result, peak RSS in bytes)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec_path = write_spec(spec, tmp_path)
    out = tmp_path / "result.json"
    job = [sys.executable, "-m", "worker.run", "--spec", str(spec_path), "--out", str(out)]
    launched = subprocess.run(
        [sys.executable, "-c", _MEASURE, *job, *args],
        env=job_env(paths),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=600,
        check=True,
    )
    code, rss = json.loads(launched.stdout.splitlines()[-1])
    return int(code), read_result(out), int(rss)


def _huge_mlp() -> dict[str, Any]:
    # 65,536 features -> two Dense(65,536): about 8.6 billion weights, 34 GB of float32.
    spec = blobs_spec(model={"architecture": "mlp", "params": {"hidden": [65_536, 65_536]}})
    spec["dataset"]["params"] = {"num_features": 65_536, "num_classes": 3}
    spec["dataset"]["batch_size"] = 4
    return spec


def test_an_oversized_builtin_model_fails_before_allocating(tmp_path: Path) -> None:
    from worker.spec import parse_spec

    spec = _huge_mlp()
    parameters = registry.parameter_count(parse_spec(spec))
    assert parameters is not None and parameters * 4 > 8 * 1024**3
    code, result, rss = _run_measured(spec, tmp_path, "--max-model-parameters", str(LIMIT))
    assert code == 1 and result.error is not None, result
    assert result.error.type == "ArchitectureError"
    assert f"the model has {parameters} parameters" in result.error.message
    assert f"at most {LIMIT} (computed from the spec)" in result.error.message
    assert rss < BUILTIN_RSS_BOUND, f"peak RSS {rss / 2**20:.0f} MiB"


_PLUGIN = textwrap.dedent(
    '''
    """Architectures for the size checks: one with a counter, two without."""

    from typing import Any

    import numpy as np


    def wide(params: dict[str, Any], data: Any) -> Any:
        import keras

        inputs = keras.Input(shape=data.x_shape, name="inputs")
        h = keras.layers.Dense(int(params["width"]), name="wide")(inputs)
        return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))


    def counted(params: dict[str, Any], data: Any) -> Any:
        return wide(params, data)


    def _count(params: dict[str, Any], data: Any) -> int:
        width, features = int(params["width"]), data.x_shape[0]
        return features * width + width + width * data.output_dim + data.output_dim


    counted.count_parameters = _count


    def eager(params: dict[str, Any], data: Any) -> Any:
        import keras

        class Scale(keras.layers.Layer):
            def build(self, input_shape: Any) -> None:
                # A variable from a concrete array: cannot be created without memory.
                self.scale = keras.Variable(np.ones(input_shape[-1:], "float32"))

            def call(self, x: Any) -> Any:
                return x * self.scale

        inputs = keras.Input(shape=data.x_shape, name="inputs")
        h = Scale(name="scale")(keras.layers.Dense(int(params["width"]), name="wide")(inputs))
        return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))
    '''
)


@pytest.fixture
def size_plugins(tmp_path: Path) -> list[Path]:
    site = tmp_path / "site"
    info = site / "repro_size_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: repro-size-plugins\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[reprotrain.architectures]\n"
        "size_wide = repro_size_plugins:wide\n"
        "size_counted = repro_size_plugins:counted\n"
        "size_eager = repro_size_plugins:eager\n"
    )
    (site / "repro_size_plugins.py").write_text(_PLUGIN)
    return [site]


def _plugin_spec(architecture: str, width: int, features: int) -> dict[str, Any]:
    spec = blobs_spec(model={"architecture": architecture, "params": {"width": width}})
    spec["dataset"]["params"] = {"num_features": features, "num_classes": 3}
    spec["dataset"]["batch_size"] = 4
    return spec


@pytest.mark.parametrize(
    ("architecture", "how"),
    [
        ("size_wide", "counted from a build that allocated no weights"),
        ("size_counted", "computed from the spec"),
    ],
)
def test_an_oversized_plugin_model_fails_before_allocating(
    architecture: str, how: str, tmp_path: Path, size_plugins: list[Path]
) -> None:
    # 65,536 features x 40,000 units: 2.6 billion weights, over 10 GB of float32.
    spec = _plugin_spec(architecture, 40_000, 65_536)
    expected = 65_536 * 40_000 + 40_000 + 40_000 * 3 + 3
    code, result, rss = _run_measured(
        spec, tmp_path, "--max-model-parameters", str(LIMIT), paths=size_plugins
    )
    assert code == 1 and result.error is not None, result
    assert f"the model has {expected} parameters; this server allows at most {LIMIT}" in (
        result.error.message
    )
    assert how in result.error.message
    bound = BUILTIN_RSS_BOUND if how == "computed from the spec" else PLUGIN_RSS_BOUND
    assert rss < bound, f"peak RSS {rss / 2**20:.0f} MiB"


def test_a_plugin_that_must_allocate_is_checked_after_building_and_says_so(
    tmp_path: Path, size_plugins: list[Path]
) -> None:
    expected = 8 * 16 + 16 + 16 + 16 * 3 + 3  # dense, scale, output
    over = _plugin_spec("size_eager", 16, 8)
    code, result, _ = _run_measured(
        over, tmp_path / "over", "--max-model-parameters", "100", paths=size_plugins
    )
    assert code == 1 and result.error is not None
    assert f"the model has {expected} parameters; this server allows at most 100" in (
        result.error.message
    )
    assert "counted after building it, since building it without allocating failed" in (
        result.error.message
    )
    code, result, _ = _run_measured(
        over, tmp_path / "under", "--max-model-parameters", str(LIMIT), paths=size_plugins
    )
    assert code == 0, result.error
    assert any("checked only after building" in w for w in result.warnings), result.warnings


def test_a_job_under_the_limit_trains_as_before(tmp_path: Path) -> None:
    from worker.spec import parse_spec

    spec = blobs_spec()
    parameters = registry.parameter_count(parse_spec(spec))
    assert parameters is not None
    code, result, _ = _run_measured(
        spec, tmp_path / "at", "--max-model-parameters", str(parameters)
    )
    assert code == 0, result.error
    code, result, _ = _run_measured(
        spec, tmp_path / "below", "--max-model-parameters", str(parameters - 1)
    )
    assert code == 1 and result.error is not None
    assert f"the model has {parameters} parameters" in result.error.message


def test_the_worker_refuses_2000_threads_without_the_api(tmp_path: Path) -> None:
    spec = blobs_spec(determinism={"intra_op_threads": 2000, "inter_op_threads": 2000})
    code, result, rss = _run_measured(spec, tmp_path)
    assert code == 2 and result.error is not None and result.error.phase == "spec"
    locs = {e["loc"] for e in result.error.errors}
    assert {"determinism.intra_op_threads", "determinism.inter_op_threads"} <= locs
    assert "less than or equal to 256" in result.error.message
    assert rss < BUILTIN_RSS_BOUND  # refused before TensorFlow starts a single thread


# --- a real server refuses them at submission ----------------------------------------------


def test_a_real_server_answers_422_to_2000_threads_and_stores_nothing(tmp_path: Path) -> None:
    service = Service(
        tmp_path / "data", env={"REPRO_MAX_THREADS": "16", "REPRO_MAX_MODEL_PARAMETERS": "10000"}
    ).wait_ready()
    try:
        for field, section in (
            ("intra_op_threads", "determinism"),
            ("inter_op_threads", "determinism"),
            ("num_parallel_calls", "dataset"),
        ):
            spec = blobs_spec()
            spec.setdefault(section, {})[field] = 2000
            answer = service.submit(json.dumps(spec), "application/json")
            assert answer.status_code == 422, answer.text
            locs = {e["loc"] for e in answer.json()["errors"]}
            assert f"{section}.{field}" in locs
            assert "256" in answer.text
        # Under the worker's bound but over the operator's.
        spec = blobs_spec(determinism={"intra_op_threads": 17})
        answer = service.submit(json.dumps(spec), "application/json")
        assert answer.status_code == 422
        assert answer.json()["errors"] == [
            {
                "loc": "determinism.intra_op_threads",
                "msg": "17 threads exceeds this server's limit of 16",
            }
        ]
        big = blobs_spec(model={"architecture": "mlp", "params": {"hidden": [128, 128]}})
        answer = service.submit(json.dumps(big), "application/json")
        assert answer.status_code == 422
        assert answer.json()["errors"][0]["loc"] == "model"
        assert "exceeds this server's limit of 10000" in answer.json()["errors"][0]["msg"]
        lr = blobs_spec()
        lr["training"]["optimizer"] = {"name": "adam", "params": {"lr": 0.1}}
        answer = service.submit(json.dumps(lr), "application/json")
        assert answer.status_code == 422
        assert answer.json()["errors"][0]["loc"] == "training.optimizer.params.lr"

        for listing in ("/api/v1/runs", "/api/v1/experiments"):
            page = service.client.get(listing, params={"count": "true"})
            assert page.status_code == 200 and page.json()["total"] == 0, page.text
            assert page.json()["items"] == []
        # The next normal submission is served.
        ok = service.submit(json.dumps(blobs_spec()), "application/json")
        assert ok.status_code == 201, ok.text
        assert service.client.get("/api/v1/experiments").json()["total"] == 1
    finally:
        service.stop()
