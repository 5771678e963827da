"""The model-size limit holds before a worker allocates weights, and spec bounds hold on a server.

Real TensorFlow on CPU: the TF-free parameter counts equal Keras's `count_params()` over
many parameter combinations, the generators' TF-free sample shapes equal what they
generate, and the optimizer/loss allow-lists name only real Keras arguments. A job whose
model would need tens of gigabytes fails fast with the count and the limit while the
worker process stays small; a real server answers 422 to 2,000 threads and stores nothing.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import keras
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.jobs import blobs_spec, job_env, write_spec
from tests.integration.service_procs import Service
from worker import architectures, component_params, registry
from worker import model_size as ms
from worker.batch_source import DataInfo
from worker.result import read_result

# --- the counts are Keras's counts ---------------------------------------------------------

_GENERATORS: dict[str, Any] = {
    "gaussian_blobs": st.fixed_dictionaries(
        {"num_features": st.integers(1, 24), "num_classes": st.integers(2, 6)}
    ),
    "regression": st.fixed_dictionaries(
        {"num_features": st.integers(1, 24), "targets": st.integers(1, 4)}
    ),
    "pattern_images": st.fixed_dictionaries(
        {
            "image_size": st.integers(4, 20),
            "channels": st.integers(1, 4),
            "num_classes": st.integers(2, 4),
        }
    ),
    "token_sequences": st.fixed_dictionaries(
        {
            "vocab_size": st.integers(4, 60),
            "seq_len": st.integers(2, 12),
            "num_classes": st.integers(2, 6),
        }
    ),
}
_ARCHITECTURES: dict[str, tuple[Any, tuple[str, ...]]] = {
    "mlp": (
        st.fixed_dictionaries(
            {
                "hidden": st.lists(st.integers(1, 24), max_size=3),
                "batch_norm": st.booleans(),
                "dropout": st.sampled_from([0.0, 0.2]),
                "activation": st.sampled_from(["relu", "tanh"]),
            }
        ),
        tuple(_GENERATORS),
    ),
    "small_cnn": (
        st.fixed_dictionaries(
            {
                "filters": st.lists(st.integers(1, 8), min_size=1, max_size=3),
                "kernel_size": st.integers(1, 5),
                "dense": st.integers(0, 16),
                "dropout": st.sampled_from([0.0, 0.25]),
            }
        ),
        ("pattern_images",),
    ),
    "tiny_transformer": (
        st.integers(1, 4).flatmap(
            lambda heads: st.fixed_dictionaries(
                {
                    "num_heads": st.just(heads),
                    "embed_dim": st.integers(max(1, 2 // heads), 4).map(lambda k: heads * k),
                    "ff_dim": st.integers(1, 16),
                    "num_blocks": st.integers(1, 3),
                    "dropout": st.sampled_from([0.0, 0.1]),
                }
            )
        ),
        ("token_sequences",),
    ),
    "gru": (
        st.fixed_dictionaries({"embed_dim": st.integers(2, 8), "units": st.integers(1, 10)}),
        ("token_sequences",),
    ),
}


def _real_data_info(generator: str, params: dict[str, Any]) -> DataInfo:
    """The sample shapes a built-in generator actually produces."""
    component = registry.get_component("generator", generator)
    source = component.load()(component.validate_params(params, loc="p"), batch_size=3)
    indices = tf.range(3, dtype=tf.int64)
    x, y = source.batch_generator(indices, tf.constant([1, 2], tf.int64))
    return DataInfo(
        tuple(x.shape[1:]),
        x.dtype.name,
        tuple(y.shape[1:]),
        y.dtype.name,
        source.num_classes,
        source.vocab_size,
    )


@pytest.mark.parametrize("architecture", list(_ARCHITECTURES))
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_parameter_count_equals_keras_count_params(architecture: str, data: Any) -> None:
    params_strategy, generators = _ARCHITECTURES[architecture]
    generator = data.draw(st.sampled_from(generators), label="generator")
    gen_params = data.draw(_GENERATORS[generator], label="generator params")
    params = data.draw(params_strategy, label="architecture params")

    info = registry.get_component("generator", generator).data_info
    assert info is not None
    computed_info = info(gen_params)
    assert computed_info == _real_data_info(generator, gen_params)

    count = registry.get_component("architecture", architecture).count_parameters
    assert count is not None
    keras.backend.clear_session()
    model = getattr(architectures, architecture)(params, computed_info)
    assert count(params, computed_info) == model.count_params()


def test_every_builtin_architecture_and_generator_has_a_size_function() -> None:
    for component in registry.components("architecture").values():
        if component.source == "builtin":
            assert component.count_parameters is not None, component.name
    for component in registry.components("generator").values():
        # `arrays` takes its sample shapes from the stored dataset, not from its params.
        if component.source == "builtin" and component.name != "arrays":
            assert component.data_info is not None, component.name


def test_an_architecture_that_cannot_take_the_data_fails_the_same_way_counted() -> None:
    info = ms.gaussian_blobs_info({})
    with pytest.raises(Exception) as built:
        architectures.small_cnn({}, info)
    with pytest.raises(type(built.value), match="small_cnn needs images"):
        ms.small_cnn_parameters({}, info)


# --- the allow-lists are Keras's signatures ------------------------------------------------


@pytest.mark.parametrize(
    ("table", "module", "models"),
    [
        (registry.OPTIMIZERS, keras.optimizers, component_params.OPTIMIZER_PARAMS),
        (registry.LOSSES, keras.losses, component_params.LOSS_PARAMS),
    ],
)
def test_every_allowed_parameter_is_a_real_keras_argument(
    table: dict[str, str], module: Any, models: dict[str, Any]
) -> None:
    assert set(table.values()) == set(models)
    for class_name, model in models.items():
        signature = inspect.signature(getattr(module, class_name))
        real = {n for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD}
        allowed = set(model.model_fields)
        assert allowed <= real, f"{class_name}: not Keras arguments: {allowed - real}"


def test_keras_accepts_every_optimizer_and_loss_with_validated_params() -> None:
    optimizers = {
        "adam": {"learning_rate": 0.01, "beta_1": 0.8, "amsgrad": True, "clipnorm": 1.0},
        "adamw": {"weight_decay": 0.01, "epsilon": 1e-6},
        "sgd": {"momentum": 0.9, "nesterov": True, "global_clipnorm": 2},
        "rmsprop": {"rho": 0.8, "centered": True, "clipvalue": 0.5},
        "adagrad": {"initial_accumulator_value": 0.2},
        "adamax": {"beta_2": 0.99},
        "nadam": {"use_ema": True, "ema_momentum": 0.9},
        "lion": {"beta_1": 0.95, "gradient_accumulation_steps": 2},
    }
    assert set(optimizers) == set(registry.OPTIMIZERS)
    for name, params in optimizers.items():
        cls = registry.OPTIMIZERS[name]
        component_params.validate(
            component_params.OPTIMIZER_PARAMS[cls], params, loc="p", what=name
        )
        optimizer = keras.optimizers.get({"class_name": cls, "config": params})
        assert type(optimizer).__name__ == cls
    losses = {
        "sparse_categorical_crossentropy": {"from_logits": True, "ignore_class": 0},
        "categorical_crossentropy": {"label_smoothing": 0.1, "axis": -1},
        "binary_crossentropy": {"from_logits": True, "reduction": "sum"},
        "huber": {"delta": 2.0, "reduction": "mean"},
        "mse": {"name": "squared"},
        "mae": {"dtype": "float32"},
    }
    for name, params in losses.items():
        cls = registry.LOSSES[name]
        component_params.validate(component_params.LOSS_PARAMS[cls], params, loc="p", what=name)
        assert type(keras.losses.get({"class_name": cls, "config": params})).__name__ == cls


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
