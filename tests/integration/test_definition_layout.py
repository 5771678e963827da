"""The checkpoint layout derived from a Keras definition without TensorFlow is the one a job
saves: real Keras models of every layer family the allow-list accepts (Sequential and
Functional, nested, frozen, mixed dtypes, wrappers, attention, seeded dropouts), loaded the
way a job loads a definition, their training state read as a checkpoint names it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import pytest

from worker.models.definition_layout import definition_state_layout
from worker.models.keras_definition import read_definition
from worker.record.variable_reads import training_state

L = keras.layers


def dense_stack() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((6,)),
            L.Dense(4),
            L.Dropout(0.2),
            L.BatchNormalization(),
            L.Dense(5, use_bias=False),
            L.LayerNormalization(),
            L.GaussianNoise(0.1),
            L.Dropout(0.0),  # no seed generator at rate 0
            L.Dense(3),
        ]
    )


def nested_models() -> keras.Model:
    inner_in = keras.Input((8,))
    inner = keras.Model(inner_in, L.Dropout(0.3)(L.Dense(4, name="idense")(inner_in)), name="in")
    sub = keras.Sequential(
        [keras.Input((4,)), L.Dense(4, name="dense"), L.GaussianDropout(0.1)], name="sub"
    )
    x = keras.Input((5,))
    y = sub(inner(L.Dropout(0.5)(L.Dense(8)(x))))  # "dense" again, nested: paths dense#1
    y = L.BatchNormalization(center=False, renorm=True)(y)
    return keras.Model(x, L.Dense(3)(y), name="outer")


def convolutions() -> keras.Model:
    x = keras.Input((12, 12, 3))
    y = L.Conv2D(4, 3)(x)
    y = L.Conv2D(4, (3, 1), groups=2, use_bias=False)(y)
    y = L.DepthwiseConv2D(3, depth_multiplier=2)(y)
    y = L.SeparableConv2D(5, 2, depth_multiplier=3)(y)
    y = L.Conv2DTranspose(3, 2, strides=2)(y)
    y = L.GroupNormalization(groups=3)(y)
    y = L.SpatialDropout2D(0.1)(y)
    y = L.BatchNormalization(scale=False)(y)
    return keras.Model(x, L.Dense(2)(L.GlobalAveragePooling2D()(y)))


def convolutions_1d_3d() -> keras.Model:
    x = keras.Input((10, 4))
    y = L.Conv1D(3, 3)(x)
    y = L.DepthwiseConv1D(2)(y)
    y = L.SeparableConv1D(4, 2)(y)
    y = L.Conv1DTranspose(2, 3)(y)
    y = L.LayerNormalization(axis=[1, 2])(y)
    y = L.LayerNormalization(center=False)(y)
    y = L.Conv3D(2, (2, 1, 1))(L.Reshape((8, 2, 1, 1))(y))
    y = L.Conv3DTranspose(2, 1)(y)
    return keras.Model(x, L.Dense(2)(L.Flatten()(y)))


def recurrent() -> keras.Model:
    x = keras.Input((7,), dtype="int32")
    y = L.Embedding(20, 6)(x)
    y = L.SimpleRNN(5, return_sequences=True, dropout=0.1)(y)
    y = L.GRU(4, return_sequences=True, reset_after=False)(y)
    y = L.Bidirectional(L.LSTM(3, return_sequences=True))(y)
    backward = L.GRU(3, go_backwards=True, return_sequences=True)
    y = L.Bidirectional(L.GRU(2, return_sequences=True), backward_layer=backward)(y)
    y = L.AlphaDropout(0.1)(L.LSTM(4, use_bias=False)(y))
    return keras.Model(x, L.Dense(3)(y))


def attention() -> keras.Model:
    x = keras.Input((6,), dtype="int32")
    e = L.Embedding(30, 8)(x)
    a = L.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1, name="mha")(e, e)
    b = L.MultiHeadAttention(3, 2, value_dim=5, output_shape=7, use_bias=False)(a, e, e)
    return keras.Model(x, L.Dense(2)(L.GlobalAveragePooling1D()(L.Dropout(0.1)(b))))


def frozen_and_mixed() -> keras.Model:
    inner = keras.Sequential([keras.Input((4,)), L.Dense(3), L.BatchNormalization()], name="f")
    inner.trainable = False  # no optimizer slots for its weights
    x = keras.Input((4,))
    y = L.Dense(5, trainable=False)(inner(x))
    y = L.Dense(3, dtype="float64")(L.Dense(4, dtype="mixed_float16")(y))
    return keras.Model(x, L.Dense(2)(y))


MODELS = [
    dense_stack,
    nested_models,
    convolutions,
    convolutions_1d_3d,
    recurrent,
    attention,
    frozen_and_mixed,
]
OPTIMIZERS: list[tuple[str, dict[str, Any]]] = [
    ("Adam", {}),
    ("SGD", {"momentum": 0.9}),
    ("RMSprop", {"centered": True}),
]


@pytest.mark.parametrize("make", MODELS, ids=lambda m: m.__name__)
def test_the_derived_layout_is_what_a_job_loading_the_definition_saves(
    make: Callable[[], keras.Model],
) -> None:
    keras.backend.clear_session()
    definition = make().to_json().encode()
    for optimizer, params in OPTIMIZERS:
        derived = definition_state_layout(
            read_definition(definition), optimizer=optimizer, optimizer_params=params
        )
        # As the job loads it: a fresh session, the checked config, safe mode, the optimizer
        # built on the trainable variables.
        keras.backend.clear_session()
        model = keras.saving.deserialize_keras_object(
            read_definition(definition).config, safe_mode=True
        )
        built = keras.optimizers.get({"class_name": optimizer, "config": params})
        built.build(model.trainable_variables)
        saved = [(p, v.dtype, tuple(v.shape)) for p, v in training_state(model, built)]
        assert [v.key for v in derived] == saved, optimizer
