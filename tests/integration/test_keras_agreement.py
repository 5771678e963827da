"""The TF-free model-size functions and spec allow-lists agree with real Keras.

Real TensorFlow on CPU: the TF-free parameter counts equal Keras's `count_params()` over
many parameter combinations, the generators' TF-free sample shapes equal what they
generate, every built-in architecture and generator has a size function, and the
optimizer/loss allow-lists name only real Keras arguments that Keras accepts.
"""

from __future__ import annotations

import inspect
from typing import Any

import keras
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.data.batch_source import DataInfo
from worker.models import architectures, component_params, registry
from worker.models import model_size as ms

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
        # `keras` counts the stored definition's parameters when it is pushed and submitted
        # (worker.models.keras_definition), not from params.
        if component.source == "builtin" and component.name != "keras":
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
