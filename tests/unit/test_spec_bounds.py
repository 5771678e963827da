"""Spec numbers that become resources on a worker are bounded at submission, TF-free.

Threads, pipeline buffers, batch memory, trace points and the model's parameter count
are refused with the field path and the bound; optimizer and loss params must match the
Keras signature's names, types and ranges. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.config import Settings
from service.errors import InvalidSpec
from service.runs.experiments import parse_submission
from tests.unit.test_spec import BASE
from worker.errors import SpecError
from worker.models import registry
from worker.spec import MAX_THREADS, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _with(**patches: Any) -> dict[str, Any]:
    """BASE with `section.key` patched (dotted keys)."""
    spec = copy.deepcopy(BASE)
    for dotted, value in patches.items():
        *path, last = dotted.split("__")
        target = spec
        for part in path:
            target = target.setdefault(part, {})
        target[last] = value
    return spec


def _submit(spec: dict[str, Any], tmp_path: Path, **limits: int) -> InvalidSpec | None:
    settings = Settings(data_dir=tmp_path, **limits)
    try:
        parse_submission(json.dumps(spec).encode(), "json", settings=settings)
    except InvalidSpec as exc:
        return exc
    return None


def _locs(exc: InvalidSpec | SpecError | None) -> dict[str, str]:
    assert exc is not None, "the spec was accepted"
    found: dict[str, str] = {}
    for e in exc.errors:  # a union field ("autotune" or a number) has one entry per member
        found[e["loc"]] = f"{found[e['loc']]}; {e['msg']}" if e["loc"] in found else e["msg"]
    return found


# --- threads and pipeline buffers ----------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    [
        "determinism__intra_op_threads",
        "determinism__inter_op_threads",
        "dataset__num_parallel_calls",
        "dataset__prefetch",
    ],
)
def test_two_thousand_threads_or_buffers_are_refused_with_the_path(
    field: str, tmp_path: Path
) -> None:
    loc = field.replace("__", ".")
    errors = _locs(_submit(_with(**{field: 2000}), tmp_path))
    assert loc in errors and "less than or equal to 256" in errors[loc]
    # The worker parses the same schema: `python -m worker.run` refuses it without the API.
    with pytest.raises(SpecError) as info:
        parse_spec(_with(**{field: 2000}))
    assert loc in _locs(info.value)


def test_the_operator_sets_a_lower_thread_limit(tmp_path: Path) -> None:
    spec = _with(determinism__intra_op_threads=9, dataset__num_parallel_calls=8)
    errors = _locs(_submit(spec, tmp_path, max_threads=8))
    assert errors == {"determinism.intra_op_threads": "9 threads exceeds this server's limit of 8"}
    assert _submit(spec, tmp_path, max_threads=9) is None
    # The worker's own bound holds whatever the server allows.
    at_bound = _with(determinism__inter_op_threads=MAX_THREADS)
    assert _submit(at_bound, tmp_path, max_threads=10_000) is None
    over = _with(determinism__inter_op_threads=MAX_THREADS + 1)
    assert "determinism.inter_op_threads" in _locs(_submit(over, tmp_path, max_threads=10_000))


def test_autotune_and_unset_threads_are_not_counted(tmp_path: Path) -> None:
    spec = _with(dataset__num_parallel_calls="autotune", dataset__prefetch="autotune")
    assert _submit(spec, tmp_path, max_threads=1) is None


# --- memory of batches, pipeline and trace -------------------------------------------------


def _images(size: int, channels: int, batch: int, **dataset: Any) -> dict[str, Any]:
    return _with(
        dataset={
            "generator": "pattern_images",
            "params": {"image_size": size, "channels": channels},
            "batch_size": batch,
            "train_batches": 2,
            **dataset,
        },
        model={"architecture": "small_cnn", "params": {"filters": [4]}},
    )


def test_a_batch_larger_than_a_worker_holds_is_refused(tmp_path: Path) -> None:
    # 1024 images of 512 x 512 x 4 = 2**30 input values: 4 GiB in one batch.
    huge = _images(512, 4, 1024)
    errors = _locs(_submit(huge, tmp_path))
    assert "1073741824 input values" in errors["dataset.batch_size"]
    with pytest.raises(SpecError) as info:  # the worker's own check
        registry.check_spec(parse_spec(huge))
    assert str(registry.MAX_BATCH_ELEMENTS) in _locs(info.value)["dataset.batch_size"]
    # The operator's lower limit: 64 x 16 x 16 x 1 = 16384 values per batch.
    small = _images(16, 1, 64)
    assert _submit(small, tmp_path, max_batch_elements=16_384) is None
    errors = _locs(_submit(small, tmp_path, max_batch_elements=16_383))
    assert errors["dataset.batch_size"] == (
        "16384 input values per batch (batch_size x sample size) exceeds this server's "
        "limit of 16383"
    )


def test_prefetch_times_batch_memory_is_bounded(tmp_path: Path) -> None:
    # 64 images of 256 x 256 x 4 = 2**24 values; 1 + 8 + 60 batches held > 2**30.
    spec = _images(256, 4, 64, num_parallel_calls=8, prefetch=60)
    errors = _locs(_submit(spec, tmp_path))
    assert "may hold 69 batches of 16777216 input values" in errors["dataset.prefetch"]
    assert _submit(_images(256, 4, 64, num_parallel_calls=8, prefetch=8), tmp_path) is None


def test_trace_points_are_bounded(tmp_path: Path) -> None:
    spec = _with(
        dataset__train_batches=1000,
        training__epochs=200,
        training__fingerprint_every_steps=1,
    )
    errors = _locs(_submit(spec, tmp_path))
    assert "200200 trace points" in errors["training.fingerprint_every_steps"]
    spec["training"]["fingerprint_every_steps"] = 10
    assert _submit(spec, tmp_path) is None


# --- model size at submission --------------------------------------------------------------


def test_model_size_is_computed_from_params_without_building() -> None:
    # seed001: 4 features -> Dense(8) -> Dense(2): 4*8+8 + 8*2+2 weights.
    assert registry.parameter_count(load_spec(EXAMPLES / "seed001.yaml")) == 58
    spec = parse_spec(
        _with(model={"architecture": "mlp", "params": {"hidden": [8], "batch_norm": True}})
    )
    # 4 features -> Dense(8) + BatchNorm(8) (gamma, beta, mean, variance) -> Dense(4 classes).
    assert registry.parameter_count(spec) == (4 * 8 + 8) + 4 * 8 + (8 * 4 + 4)


def test_an_oversized_model_is_refused_at_submission(tmp_path: Path) -> None:
    # An MLP on 16-wide inputs with 16 layers of 65536 units: about 64 billion weights.
    spec = _with(
        dataset__params={"num_features": 16},
        model={"architecture": "mlp", "params": {"hidden": [65_536] * 16}},
    )
    parameters = registry.parameter_count(parse_spec(spec))
    assert parameters is not None and parameters > 60_000_000_000
    errors = _locs(_submit(spec, tmp_path))
    assert errors["model"] == (
        f"{parameters} model parameters exceeds this server's limit of 500000000"
    )
    small = _with()
    count = registry.parameter_count(parse_spec(small))
    assert count is not None
    assert _submit(small, tmp_path, max_model_parameters=count) is None
    assert "model" in _locs(_submit(small, tmp_path, max_model_parameters=count - 1))


def test_a_model_that_cannot_take_the_data_is_left_to_the_worker(tmp_path: Path) -> None:
    # small_cnn on flat feature vectors: no count for the size limit, which leaves it alone;
    # the data-fit check refuses it when the experiment is created (test_token_data.py).
    spec = _with(model={"architecture": "small_cnn", "params": {}})
    assert _submit(spec, tmp_path, max_model_parameters=1) is None


# --- optimizer and loss params -------------------------------------------------------------


def test_known_optimizer_and_loss_params_pass(tmp_path: Path) -> None:
    good = [
        {"name": "adam", "params": {"learning_rate": 1e-3, "beta_1": 0.9}},
        {"name": "adamw", "params": {"learning_rate": 1, "weight_decay": 0.01}},
        {"name": "sgd", "params": {"momentum": 0.9, "nesterov": True, "clipnorm": 1.0}},
        {"name": "rmsprop", "params": {"rho": 0.95, "centered": True}},
        {"name": "lion", "params": {"beta_1": 1.0}},
        {"name": "adagrad", "params": {"initial_accumulator_value": 0}},
    ]
    for optimizer in good:
        assert _submit(_with(training__optimizer=optimizer), tmp_path) is None, optimizer
    losses = [
        {"name": "huber", "params": {"delta": 0.5}},
        {"name": "binary_crossentropy", "params": {"label_smoothing": 0.1, "from_logits": True}},
        {"name": "mse", "params": {"reduction": "sum"}},
    ]
    for loss in losses:
        assert _submit(_with(training__loss=loss), tmp_path) is None, loss


@pytest.mark.parametrize(
    ("section", "value", "loc", "msg"),
    [
        ("optimizer", {"name": "adam", "params": {"lr": 0.1}}, "lr", "Extra inputs"),
        ("optimizer", {"name": "adam", "params": {"learning_rate": -0.1}}, "learning_rate", "0"),
        ("optimizer", {"name": "adam", "params": {"learning_rate": 0}}, "learning_rate", "0"),
        ("optimizer", {"name": "adam", "params": {"learning_rate": "0.1"}}, "learning_rate", ""),
        ("optimizer", {"name": "adam", "params": {"beta_1": 1.0}}, "beta_1", "less than 1"),
        ("optimizer", {"name": "adam", "params": {"amsgrad": 1}}, "amsgrad", "boolean"),
        ("optimizer", {"name": "sgd", "params": {"beta_1": 0.9}}, "beta_1", "Extra inputs"),
        ("optimizer", {"name": "sgd", "params": {"momentum": 1.5}}, "momentum", "less than"),
        (
            "optimizer",
            {"name": "adam", "params": {"gradient_accumulation_steps": 2.5}},
            "gradient_accumulation_steps",
            "integer",
        ),
        (
            "optimizer",
            {"name": "adam", "params": {"learning_rate": {"class_name": "ExponentialDecay"}}},
            "learning_rate",
            "number",
        ),
        ("loss", {"name": "huber", "params": {"delta": -1}}, "delta", "greater than 0"),
        ("loss", {"name": "mse", "params": {"from_logits": True}}, "from_logits", "Extra"),
        ("loss", {"name": "mse", "params": {"reduction": "none"}}, "reduction", "Input should"),
        (
            "loss",
            {"name": "sparse_categorical_crossentropy", "params": {"from_logits": "yes"}},
            "from_logits",
            "boolean",
        ),
    ],
)
def test_bad_optimizer_and_loss_params_are_422_with_the_path(
    section: str, value: dict[str, Any], loc: str, msg: str, tmp_path: Path
) -> None:
    errors = _locs(_submit(_with(**{f"training__{section}": value}), tmp_path))
    path = f"training.{section}.params.{loc}"
    assert path in errors, errors
    assert msg in errors[path]


def test_non_finite_and_conflicting_optimizer_params_are_refused(tmp_path: Path) -> None:
    for text in ("NaN", "Infinity", "1e999"):
        body = json.dumps(_with()).replace('"learning_rate": 0.001', f'"learning_rate": {text}')
        assert text in body
        with pytest.raises(InvalidSpec) as info:
            parse_submission(body.encode(), "json", settings=Settings(data_dir=tmp_path))
        assert any(e["loc"].startswith("training.optimizer.params") for e in info.value.errors)
    both = {"name": "sgd", "params": {"clipnorm": 1.0, "clipvalue": 0.5}}
    errors = _locs(_submit(_with(training__optimizer=both), tmp_path))
    assert "at most one of clipnorm" in errors["training.optimizer.params"]


# --- what the bounds must not change -------------------------------------------------------


def test_bounds_leave_every_example_valid_and_its_hash_unchanged(tmp_path: Path) -> None:
    pinned = {
        "pattern_cnn.yaml": "3e66c193ecd950a0da2bdf4294c9af340b3918076465521fad5a452373b1837c",
        "regression.json": "255b49b34a745eee3cc3870a6f9a2555077dc173afd9e19f6fc3fcd265454268",
        "seed001.yaml": "a45bc89e0685e1477c5ce2d2bab02cb6fd25a86ad6f6b8bb181d530483d31e45",
        "tokens_transformer.yaml": (
            "fbc74bbd219a5a7aa4d8346333be725e6ba37de2d7a466980fada54527d91a23"
        ),
    }
    for name, digest in pinned.items():
        path = EXAMPLES / name
        fmt = "json" if path.suffix == ".json" else "yaml"
        spec = parse_submission(path.read_bytes(), fmt, settings=Settings(data_dir=tmp_path))
        assert spec.spec_hash() == f"sha256:{digest}", name


def test_sizing_a_spec_does_not_import_tensorflow() -> None:
    code = (
        "import sys, json\n"
        "from worker.models import registry\n"
        "from worker.spec import load_spec\n"
        "spec = load_spec(sys.argv[1])\n"
        "registry.check_spec(spec)\n"
        "print(json.dumps([registry.parameter_count(spec), 'tensorflow' in sys.modules,"
        " 'keras' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLES / "tokens_transformer.yaml")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    count, tensorflow, keras = json.loads(out.stdout)
    assert count > 0 and not tensorflow and not keras
